"""The DPO trainer: `train()`'s loop (`_loop._Run`) with preference batches carrying the reference's
log-probs, the DPO objective in the train step, and a held-out evaluation over every validation pair."""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import numpy as np

from ._dpo import DpoConfig, WithReference, _split_folder, make_dpo_loss, read_reference
from ._loop import _Run

logger = logging.getLogger("schooner.train")


class DpoEvaluator:
    """DPO loss, rewards and accuracy of a model on every pair of a validation preference cache."""

    def __init__(self, data: WithReference, objective: Any, batch_size: int) -> None:
        import equinox as eqx

        self.data, self.batch_size = data, batch_size
        self.fn = eqx.filter_jit(lambda m, b: objective(m, b, None)[1][0])

    def __call__(self, model: Any) -> dict[str, float]:
        n = self.data.dataset.num_pairs
        sums: dict[str, float] = {}
        for start in range(0, n, self.batch_size):
            idx = np.arange(start, min(start + self.batch_size, n))
            b = self.data.add(self.data.dataset.pairs(idx))
            m = {k: float(v) for k, v in self.fn(model, b).items()}
            for k, v in m.items():
                if k != "token_count":
                    sums[k] = sums.get(k, 0.0) + v * idx.size
        return {f"eval/{k}": v / n for k, v in sums.items()}


class DpoRun(_Run):
    """`train()` with preference batches, the DPO objective and a held-out preference evaluation."""

    def __init__(self, config: Any, dpo: DpoConfig, reference: str, preferences: str) -> None:
        super().__init__(config)
        self.dpo, self.reference, self.preferences = dpo, reference, preferences

    def _setup_data(self) -> None:
        import jax

        from schooner.tokenize import PreferenceDataset, TokenCache, load_tokenizer

        from ._config import check_run
        from ._loop import resolve_model_config

        cfg = self.config
        train_cache = TokenCache.open(os.path.join(self.preferences, "train"))
        self.model_config = resolve_model_config(cfg, train_cache.vocab_size)
        check_run(dataclasses.replace(cfg, model=self.model_config), num_devices=len(jax.devices()))
        self.tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        fp = self.tokenizer or train_cache.tokenizer_fingerprint
        self.datasets = {}
        for split in ("train", "validation"):
            folder = _split_folder(self.preferences, split)
            if folder is None:
                continue
            ds = PreferenceDataset(
                folder, cfg.data.seq_len, cfg.seed, tokenizer=fp, vocab_size=self.model_config.vocab_size
            )
            self.datasets[split] = WithReference(
                ds, read_reference(self.reference, split, ds, cfg.data.seq_len)
            )
        self.dataset = self.datasets["train"]
        self.tokenizer_fingerprint = train_cache.tokenizer_fingerprint
        self.caches = {train_cache.path: train_cache}
        self.validation = {}
        self.objective = make_dpo_loss(
            beta=self.dpo.beta, loss_type=self.dpo.loss_type, label_smoothing=self.dpo.label_smoothing
        )

    def _compile_step(self) -> None:
        import haliax as hax
        import jax

        from ._mesh import replicated
        from ._step import make_train_step

        step_fn = make_train_step(
            self.tx,
            z_loss_weight=0.0,
            microbatches=self.config.microbatches,
            lr_schedule=self.lr_schedule,
            loss=self.objective,
        )

        def wrapped(state: Any, batch: dict[str, Any]) -> Any:
            with hax.axis_mapping(self.compute_map):
                return step_fn(state, batch)

        # Batches arrive placed by the data loader ([B, T] and [B] arrays split over the batch axes).
        self.step_fn = jax.jit(
            wrapped,
            in_shardings=(self.state_sharding, None),
            out_shardings=(self.state_sharding, replicated(self.mesh)),
            donate_argnums=(0,),
        )

    def _make_evaluator(self) -> Any:
        if "validation" not in self.datasets:
            logger.warning(
                f"{self.preferences!r} has no validation/ preference cache: no held-out evaluation"
            )
            return None
        return DpoEvaluator(self.datasets["validation"], self.objective, min(self.config.batch_sizes))

    def tokens_before(self, step: int) -> int:
        return 2 * super().tokens_before(step)  # a pair is two sequences
