"""The DPO trainer: `train()`'s loop (`_loop._Run`) with preference batches carrying the reference's
log-probs, the DPO objective in the train step, and a held-out evaluation over every validation pair.

The reference's log-probs come from a `reference_logprobs` step (read by pair index), or, when the `dpo`
step's `reference` is a model, from a frozen copy of it scored inside the jitted train step (and on each
evaluation batch): no cached step, a second model in memory, one more forward pass per step.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from typing import Any

import numpy as np

from ._dpo import (
    _ROLES,
    DpoConfig,
    WithReference,
    _split_folder,
    cached_reference_with_step,
    load_model_from,
    make_dpo_loss,
    read_reference,
    sequence_logps,
    with_ref_is_policy,
)
from ._loop import _Run
from ._memory import CompiledStep

logger = logging.getLogger("schooner.train")


def is_cached_reference(folder: str) -> bool:
    """Whether `folder` is a `reference_logprobs` output (else it is a model: a live reference)."""
    return os.path.exists(os.path.join(folder, "reference.json"))


def reference_logps(reference: Any, b: dict) -> dict[str, Any]:
    """`ref_{chosen,rejected}_{logps,count}` [B] of a preference batch under the frozen `reference` model
    (what `WithReference` reads from a `reference_logprobs` step); no gradient flows into it."""
    import jax
    import jax.numpy as jnp

    both = {
        k: jnp.concatenate([b[f"chosen_{k}"], b[f"rejected_{k}"]])
        for k in ("tokens", "segment_ids", "loss_mask")
    }
    logps, counts = jax.lax.stop_gradient(
        sequence_logps(reference, both["tokens"], both["segment_ids"], both["loss_mask"])
    )
    n = b["chosen_tokens"].shape[0]
    out = {}
    for i, role in enumerate(_ROLES):
        out[f"ref_{role}_logps"] = logps[i * n : (i + 1) * n]
        out[f"ref_{role}_count"] = counts[i * n : (i + 1) * n]
    return out


class LiveReference:
    """A `PreferenceDataset` for DPO with a live reference model. Training batches go out without reference
    log-probs (the train step computes them); `add` scores an evaluation batch with the reference."""

    def __init__(self, dataset: Any, model: Any) -> None:
        import equinox as eqx

        self.dataset, self.seq_len, self.model = dataset, dataset.seq_len, model
        self._score = eqx.filter_jit(reference_logps)
        self.starts_at_reference = False
        """The run's policy starts as the reference model: step 0's batch says so (`ref_is_policy`)."""

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]:
        b = self.dataset.batch(step, batch_size, rows)
        del b["pair_index"]
        return with_ref_is_policy(b, self, step)

    def add(self, b: dict[str, np.ndarray]) -> dict[str, Any]:
        del b["pair_index"]
        return b | self._score(self.model, b)


class DpoEvaluator:
    """DPO loss, rewards and accuracy of a model on every pair of a validation preference cache."""

    def __init__(self, data: WithReference | LiveReference, objective: Any, batch_size: int) -> None:
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


def _same_folder(a: str, b: str) -> bool:
    """Whether two checkpoint folders are one (local paths compared resolved, others as written)."""
    norm = lambda p: os.path.realpath(p) if "://" not in p else p.rstrip("/")  # noqa: E731
    return norm(os.fspath(a)) == norm(os.fspath(b))


class DpoRun(_Run):
    """`train()` with preference batches, the DPO objective and a held-out preference evaluation."""

    def __init__(self, config: Any, dpo: DpoConfig, reference: str, preferences: str) -> None:
        super().__init__(config)
        self.dpo, self.reference, self.preferences = dpo, reference, preferences
        self.reference_model: Any = None  # a live reference (placed like the policy in _compile_step)
        self.reference_folder: str | None = None

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
        self.datasets: dict[str, WithReference | LiveReference] = {}
        cached = is_cached_reference(self.reference)
        if cached and self.dpo.reference_step is not None:
            raise cached_reference_with_step(self.reference, self.dpo.reference_step)
        if not cached:
            self.reference_model, self.reference_folder = load_model_from(
                self.reference, self.dpo.reference_step
            )
            vocab = self.reference_model.config.vocab_size
            if vocab != self.model_config.vocab_size:
                raise ValueError(
                    f"dpo: the reference model {self.reference_folder!r} has vocab_size {vocab}, the policy "
                    f"{self.model_config.vocab_size}; use a reference with the policy's vocabulary"
                )
            logger.info(f"live reference model {self.reference_folder}: scored in the train step")
        for split in ("train", "validation"):
            folder = _split_folder(self.preferences, split)
            if folder is None:
                continue
            ds = PreferenceDataset(
                folder, cfg.data.seq_len, cfg.seed, tokenizer=fp, vocab_size=self.model_config.vocab_size
            )
            if self.reference_model is not None:
                self.datasets[split] = LiveReference(ds, self.reference_model)
            else:
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

    def _setup_state(self) -> None:
        super()._setup_state()
        # A fresh run whose policy starts from the reference's own checkpoint: at step 0 they are one model.
        if self.initialized_from is None:
            return
        if self.reference_folder is not None:
            ref_model = self.reference_folder
        else:
            with open(os.path.join(self.reference, "reference.json")) as f:
                ref_model = json.load(f)["model"]
        same = _same_folder(ref_model, self.initialized_from)
        self.datasets["train"].starts_at_reference = same
        if same:
            logger.info(
                "the policy starts as the reference: step 1 takes the reference's log-probs as its own"
            )

    def _compile_step(self) -> None:
        import haliax as hax
        import jax

        from ._mesh import replicated
        from ._step import _split_microbatches, make_train_step

        step_fn = make_train_step(
            self.tx,
            z_loss_weight=0.0,
            microbatches=self.config.microbatches,
            lr_schedule=self.lr_schedule,
            loss=self.objective,
        )

        if self.reference_model is None:

            def wrapped(state: Any, batch: dict[str, Any]) -> Any:
                with hax.axis_mapping(self.compute_map):
                    return step_fn(state, batch)

            # Batches arrive placed by the data loader ([B, T] and [B] arrays split over the batch axes).
            plain = jax.jit(
                wrapped,
                in_shardings=(self.state_sharding, None),
                out_shardings=(self.state_sharding, replicated(self.mesh)),
                donate_argnums=(0,),
            )
            self.step_fn = CompiledStep(plain, self.memory_hint(), log=logger.info)
            return
        import equinox as eqx

        from schooner.model import model_shardings

        # The live reference: placed like the policy's weights, scored on the whole batch, then the step.
        ref_sharding = model_shardings(
            eqx.filter_eval_shape(lambda m: m, self.reference_model), self.mesh, self.param_map
        )
        reference = jax.jit(lambda m: m, out_shardings=ref_sharding)(self.reference_model)
        self.reference_model = reference
        for data in self.datasets.values():
            if isinstance(data, LiveReference):
                data.model = reference

        m = self.config.microbatches

        def score(ref: Any, batch: dict[str, Any]) -> dict[str, Any]:
            if m == 1:
                return reference_logps(ref, batch)
            # as many forward passes as the policy's microbatches, so the reference's logits fit as theirs do
            out = jax.lax.map(lambda b: reference_logps(ref, b), _split_microbatches(batch, m))
            return {k: v.reshape(-1) for k, v in out.items()}

        def live(state: Any, ref: Any, batch: dict[str, Any]) -> Any:
            with hax.axis_mapping(self.compute_map):
                return step_fn(state, batch | score(ref, batch))

        jitted = jax.jit(
            live,
            in_shardings=(self.state_sharding, ref_sharding, None),
            out_shardings=(self.state_sharding, replicated(self.mesh)),
            donate_argnums=(0,),
        )
        self.step_fn = CompiledStep(jitted, self.memory_hint(), bound=(reference,), log=logger.info)

    def _make_evaluator(self) -> Any:
        if "validation" not in self.datasets:
            logger.warning(
                f"{self.preferences!r} has no validation/ preference cache: no held-out evaluation"
            )
            return None
        return DpoEvaluator(self.datasets["validation"], self.objective, min(self.config.batch_sizes))

    def tokens_before(self, step: int) -> int:
        return 2 * super().tokens_before(step)  # a pair is two sequences
