"""schooner.eval: Evaluation: loss and bits-per-byte, multiple-choice and generation tasks, batch-invariant scoring."""

__all__: list[str] = []
