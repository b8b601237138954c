"""schooner.data: Records, readers and writers, the lazy sharded Dataset pipeline, curation ops and the embedded corpus."""

__all__: list[str] = []
