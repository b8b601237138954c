"""schooner.train: The trainer: train state, optimizers and schedules, sharding, exact-resume checkpoints, tracking, SFT and DPO."""

__all__: list[str] = []
