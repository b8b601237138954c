"""schooner.tokenize: Tokenizers, the tensorstore token cache, mixtures, shuffling, packing and the training data loader."""

__all__: list[str] = []
