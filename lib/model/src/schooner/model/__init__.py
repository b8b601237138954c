"""schooner.model: Llama-style dense and mixture-of-experts decoders in haliax, loss, FLOP accounting, HF safetensors interop."""

__all__: list[str] = []
