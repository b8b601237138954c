"""`train(config)`: build the mesh, model, optimizer and data; resume; run the step loop; evaluate; save.

The loop keeps the device busy: the step for batch s+1 is dispatched before the metrics of batch s are
read back (a one-step lag), the data loader prepares batches on threads, and checkpoints are written
from device copies on a background thread.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import time
import traceback
from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from ._checkpoint import CheckpointManager, latest_checkpoint, read_marker
from ._config import BatchSchedule, TrainConfig, check_run
from ._malloc import malloc_env
from ._memory import CompiledStep, StepMemoryError, advice
from ._mesh import make_mesh, replicated
from ._progress import Progress
from ._run_info import (
    RunLog,
    config_to_json,
    enable_compilation_cache,
    is_primary,
    maybe_init_distributed,
    package_versions,
)
from ._tracking import make_trackers, plot_losses

logger = logging.getLogger("schooner.train")
_T0 = time.perf_counter()  # import time of this module: the "process start" the first-step latency uses


class NonFiniteLossError(FloatingPointError):
    """The loss, the gradient or the updated parameters became NaN/Inf; the run stopped without applying
    that update (every checkpoint holds a state that passed the check)."""


def resolve_model_config(config: TrainConfig, cache_vocab: int) -> Any:
    """The model config the run trains: vocab fitted to the caches when asked, compute dtype applied."""
    model = config.model
    if config.fit_vocab and model.vocab_size < cache_vocab:
        logger.info(f"model vocab_size {model.vocab_size} -> {cache_vocab} (the caches' tokenizer)")
        model = dataclasses.replace(model, vocab_size=cache_vocab)
    if config.compute_dtype is not None:
        model = dataclasses.replace(model, compute_dtype=config.compute_dtype)
    return model


def train(config: TrainConfig) -> dict[str, Any]:
    """Run (or resume) training as configured; returns a summary.

    Resumes automatically from the latest complete checkpoint in `config.output_path`.

    Returns:
        `{"steps", "final_loss", "checkpoint", "eval", "tokens_per_second", "mfu", ...}`.

    Raises:
        ValueError: an inconsistent configuration (before anything is compiled).
        StepMemoryError: the compiled step does not fit in device memory (before the first step; the message
            names the options). The run's device buffers are released first, so the caller can retry with a
            smaller batch in the same process.
        NonFiniteLossError: the loss or gradient became NaN/Inf (the message names the step; the last good
            checkpoint is kept).
    """
    import fsspec

    fs, out_path = fsspec.core.url_to_fs(config.output_path)
    fs.makedirs(out_path, exist_ok=True)
    maybe_init_distributed()  # before the log: on several hosts only process 0 writes train.log
    logs = RunLog(config.output_path)
    run = _Run(config)
    try:
        return run.run()
    except StepMemoryError as e:
        # The traceback's frames (and the cycle through the XLA error it chains) hold the model and optimizer
        # state: drop them now, not at some later garbage collection, so a retry finds the device empty.
        run.state = None
        for err in (e, e.__cause__):
            if err is not None:
                traceback.clear_frames(err.__traceback__)
        raise
    finally:
        logs.close()


class _Batches(Protocol):
    """What a run trains on: a `schooner.tokenize.MixtureDataset`, or (`DpoRun`) preference pairs with their
    reference log-probabilities; pure in `step`, `rows` this host's rows of the batch."""

    def batch(self, step: int, batch_size: Any, rows: np.ndarray | None = None) -> dict[str, np.ndarray]: ...


class _Run:
    """One training run; `run()` does the work. Split into methods for readability only."""

    dataset: _Batches
    step_fn: CompiledStep
    """(state, batch) -> (state, metrics): the compiled training step (`DpoRun` binds its reference model)."""

    def __init__(self, config: TrainConfig) -> None:
        self.config = config
        self.root = config.output_path.rstrip("/")

    # -- setup ---------------------------------------------------------------------------------------
    def _setup_data(self) -> None:
        from schooner.tokenize import MixtureDataset, TokenCache, load_tokenizer

        cfg = self.config
        caches = {p: TokenCache.open(p) for p in cfg.data.components}
        from ._evaluate import default_validation

        self.validation = (
            dict(cfg.data.validation)
            if cfg.data.validation is not None
            else default_validation(cfg.data.components)
        )
        val_caches = {p: TokenCache.open(p) for p in self.validation.values()}
        vocab_sizes = {c.path: c.vocab_size for c in [*caches.values(), *val_caches.values()]}
        self.model_config = resolve_model_config(cfg, max(vocab_sizes.values()))
        check_run(
            dataclasses.replace(cfg, model=self.model_config),
            num_devices=len(jax.devices()),
            cache_vocab_sizes=vocab_sizes,
        )
        # Every cache (training and validation) must come from one tokenizer: the run's `tokenizer` when
        # given, else the one the first training cache was built with. Checkpoints record its fingerprint.
        self.tokenizer = load_tokenizer(cfg.tokenizer) if cfg.tokenizer else None
        first = next(iter(caches.values()))
        expected = self.tokenizer or first.tokenizer_fingerprint
        self.dataset = MixtureDataset(
            {p: w for p, w in cfg.data.components.items()},
            seq_len=cfg.data.seq_len,
            seed=cfg.seed,
            weight_schedule=cfg.data.weight_schedule,
            block_size=cfg.data.block_size,
            # None: the components are compared with the first, fingerprint and special ids (a fingerprint
            # string says nothing of the special tokens)
            tokenizer=self.tokenizer,
            vocab_size=self.model_config.vocab_size,
        )
        for cache in val_caches.values():
            cache.check_tokenizer(expected)
            if self.tokenizer is None:  # as above: the special ids too
                _check_special_ids(cache, first)
        self.tokenizer_fingerprint = next(iter(caches.values())).tokenizer_fingerprint
        self.caches = caches

    def _tokenizer_path(self) -> str | None:
        """The run's tokenizer (file or folder): the given one, else a `tokenizer.json` next to a training
        cache that matches the caches' fingerprint."""
        from schooner.tokenize import load_tokenizer

        from ._evaluate import find_tokenizer_file

        if self.config.tokenizer:
            return self.config.tokenizer
        for p in self.config.data.components:
            found = find_tokenizer_file(p)
            if found and load_tokenizer(found).fingerprint == self.tokenizer_fingerprint:
                return found
        return None

    def _setup_state(self) -> None:
        import equinox as eqx

        from schooner.model import init, model_shardings

        from ._step import build_optimizer, init_state

        cfg = self.config
        self.mesh = make_mesh(cfg.mesh)
        self.param_map = cfg.mesh.param_axis_mapping
        self.compute_map = cfg.mesh.compute_axis_mapping
        self.batch_sharding = jax.sharding.NamedSharding(
            self.mesh, jax.sharding.PartitionSpec(self.compute_map["batch"], None)
        )
        key = jax.random.PRNGKey(cfg.seed)
        k_init, k_train = jax.random.split(key)
        abstract_model = eqx.filter_eval_shape(init, self.model_config, key=k_init)
        self.tx = build_optimizer(cfg.optimizer, abstract_model, cfg.steps)
        self.lr_schedule = cfg.optimizer.lr_schedule(cfg.steps)
        mc = self.model_config

        def make_state(k_init: jax.Array, k_train: jax.Array) -> Any:
            return init_state(init(mc, key=k_init), self.tx, k_train)

        abstract = eqx.filter_eval_shape(make_state, k_init, k_train)
        self.state_sharding = model_shardings(abstract, self.mesh, self.param_map)

        def fresh_state(k_init: jax.Array, k_train: jax.Array) -> Any:
            # Two programs: the weights (drawn as one flat buffer, sliced: twice their size at the peak), then
            # the optimizer state around them (the weights donated). In one program both peaks coincided: a
            # 0.95B model's init did not fit a 15.7 GiB chip that trains it.
            model = jax.jit(lambda k: init(mc, key=k), out_shardings=self.state_sharding.model)(k_init)
            make = lambda m, k: init_state(m, self.tx, k)  # noqa: E731
            return jax.jit(make, out_shardings=self.state_sharding, donate_argnums=(0,))(model, k_train)

        self.abstract_state = abstract
        latest = latest_checkpoint(self.root)
        self.initialized_from: str | None = None
        if latest is None:
            self.start_step = 0
            self.resumed_from = None
            if cfg.initialize_from is not None:
                self.state = self._initial_state(k_train)
            else:
                self.state = fresh_state(k_init, k_train)
        else:
            self.start_step, path = latest
            self.state = self._restore(path)
            self.resumed_from = path
            logger.info(f"resuming from {path} (step {self.start_step})")

    def _initial_state(self, k_train: jax.Array) -> Any:
        """Step 0 from `initialize_from`'s weights, with a fresh optimizer state (see `_init`)."""
        from ._init import load_initial_model
        from ._step import init_state

        assert self.config.initialize_from is not None
        model, self.initialized_from = load_initial_model(
            self.config.initialize_from, self.model_config, self.config.initialize_from_step
        )
        make = lambda m, k: init_state(m, self.tx, k)  # noqa: E731
        return jax.jit(make, out_shardings=self.state_sharding)(model, k_train)

    def _restore(self, path: str) -> Any:
        from schooner.model import load_pytree, read_config

        from ._step import TrainState

        saved = read_config(path)
        if saved != self.model_config:
            raise ValueError(
                f"checkpoint {path} holds a different model config than this run:\n  checkpoint {saved}\n"
                f"  this run   {self.model_config}\nuse a new output_path or the original model config"
            )
        # Shape structs carrying their target sharding: each device reads only its own slices.
        a = self._sharded_shapes(self.abstract_state)
        model = load_pytree(f"{path}/model", a.model)
        rest = load_pytree(f"{path}/train_state", {"step": a.step, "opt_state": a.opt_state, "key": a.key})
        step = int(jax.device_get(rest["step"]))
        marker = read_marker(path)
        if step != marker["step"]:
            raise ValueError(
                f"checkpoint {path}: train_state step {step} != checkpoint.json step {marker['step']}"
            )
        return TrainState(step=rest["step"], model=model, opt_state=rest["opt_state"], key=rest["key"])

    def _sharded_shapes(self, abstract: Any) -> Any:
        """`abstract` (shape structs) with each leaf's target sharding attached."""
        import haliax as hax

        from schooner.model import pspec_for_named

        def one(x: Any) -> Any:
            if isinstance(x, hax.NamedArray) and isinstance(x.array, jax.ShapeDtypeStruct):
                spec = pspec_for_named(x.axes, self.mesh, self.param_map)
                s = jax.sharding.NamedSharding(self.mesh, spec)
                return hax.NamedArray(jax.ShapeDtypeStruct(x.array.shape, x.array.dtype, sharding=s), x.axes)
            if isinstance(x, jax.ShapeDtypeStruct):
                return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated(self.mesh))
            return x

        return jax.tree.map(one, abstract, is_leaf=lambda x: isinstance(x, hax.NamedArray))

    def _compile_step(self) -> None:
        import haliax as hax

        from ._step import make_train_step

        cfg = self.config
        bs = self.batch_sharding
        step_fn = make_train_step(
            self.tx,
            z_loss_weight=float(cfg.z_loss_weight),
            microbatches=cfg.microbatches,
            lr_schedule=self.lr_schedule,
            constrain_batch=lambda b: jax.lax.with_sharding_constraint(b, {k: bs for k in b}),
            shards=cfg.mesh.data_parallel_size(len(jax.devices())),
        )

        def wrapped(state: Any, batch: dict[str, jax.Array]) -> Any:
            with hax.axis_mapping(self.compute_map):
                return step_fn(state, batch)

        jitted = jax.jit(
            wrapped,
            in_shardings=(self.state_sharding, bs),  # every array of the batch: tokens, segment ids, masks
            out_shardings=(self.state_sharding, replicated(self.mesh)),
            donate_argnums=(0,),
        )
        self.step_fn = CompiledStep(jitted, self.memory_hint(), log=logger.info)

    def memory_hint(self) -> str:
        """What lowers this run's step memory (for the preflight check's message)."""
        cfg = self.config
        return advice(self.model_config, max(cfg.batch_sizes), cfg.microbatches)

    # -- helpers -------------------------------------------------------------------------------------
    def _batch_size_fn(self) -> Any:
        bsz = self.config.batch_size
        return bsz if isinstance(bsz, int) else BatchSchedule(bsz.stages)

    def tokens_before(self, step: int) -> int:
        """Tokens consumed by steps [0, step)."""
        cfg = self.config
        if isinstance(cfg.batch_size, int):
            return step * cfg.batch_size * cfg.data.seq_len
        return sum(cfg.batch_size_at(s) for s in range(step)) * cfg.data.seq_len

    def _write_checkpoint(self, folder: str, snapshot: Any) -> None:
        from schooner.model import save_model, save_pytree

        save_model(folder, snapshot.model, self.model_config)
        save_pytree(
            f"{folder}/train_state",
            {"step": snapshot.step, "opt_state": snapshot.opt_state, "key": snapshot.key},
        )

    def run(self) -> dict[str, Any]:
        from schooner.model import flops_per_token, resolve_compute_dtype
        from schooner.tokenize import DataLoader

        from ._mfu import peak_flops

        cfg = self.config
        maybe_init_distributed()
        enable_compilation_cache()
        self._setup_data()
        self._setup_state()
        self._compile_step()
        total = cfg.steps
        parameters = parameter_counts(self.model_config)
        # the BOS/EOS ids the training documents carry (evaluation refuses a tokenizer with others)
        first = next(iter(self.caches.values()))
        special_ids = {k: first.manifest[k] for k in ("bos_id", "eos_id") if k in first.manifest}
        run_info = {
            "config": config_to_json(cfg),
            "model_config": config_to_json(self.model_config),
            "versions": package_versions(),
            "devices": [str(d) for d in jax.devices()],
            "mesh": cfg.mesh.shape(len(jax.devices())),
            "tokenizer_fingerprint": self.tokenizer_fingerprint,
            "tokenizer_special_ids": special_ids,
            "parameters": parameters,
        }
        logger.info(
            f"model: {parameters['total']:,} parameters ({parameters['non_embedding']:,} non-embedding)"
        )
        from schooner.cluster import published_paths

        primary = is_primary()  # on several hosts, process 0 alone writes the run's files
        if primary:
            with (
                open(os.path.join(self.root, "run.json"), "w")
                if "://" not in self.root
                else _fs_open(f"{self.root}/run.json") as f
            ):
                # Paths as they read once the step's attempt folder is published (see schooner.cluster).
                json.dump(published_paths(run_info), f, indent=1, default=str)
        trackers = make_trackers(
            cfg.trackers if primary else None,
            run_dir=self.root,
            name=cfg.name,
            run_config=run_info,
            resume_step=self.start_step if self.resumed_from else None,
        )
        ckpt = CheckpointManager(self.root, cfg.checkpoint, log=logger.info)
        evaluator = self._make_evaluator()
        fpt = flops_per_token(self.model_config, cfg.data.seq_len)
        dtype = np.dtype(resolve_compute_dtype(self.model_config)).name
        peak, peak_source = peak_flops(dtype, devices=list(self.mesh.devices.flat))
        logger.info(f"MFU relative to {peak / 1e12:.3f} TFLOP/s ({peak_source})")
        # Non-empty exactly when this process was started without any glibc malloc tuning (or opt-out).
        if jax.default_backend() == "cpu" and malloc_env(base=os.environ):
            logger.info(
                "this process started without GLIBC_TUNABLES=glibc.malloc.hugetlb=1, so XLA's per-step "
                "buffers page-fault on every step (about 20% of a CPU step); train_lm's jobs start with it, or "
                "export it before starting python (SCHOONER_MALLOC_TUNING=0 hides this)"
            )
        progress = Progress(
            total,
            start_step=self.start_step,
            log_every=cfg.trackers.log_every,
            flops_per_token=fpt,
            peak_flops=peak,
        )
        summary: dict[str, Any] = {
            "resumed_from": self.resumed_from,
            "initialized_from": self.initialized_from,
            "parameters": run_info["parameters"],
            "start_step": self.start_step,
            "steps": total,
            "peak_flops": peak,
            "peak_source": peak_source,
        }
        last: dict[str, float] = {}
        pending: tuple[int, Any, int] | None = None
        first_step_done: float | None = None
        tps: list[float] = []

        def finish(p: tuple[int, Any, int]) -> None:
            nonlocal last, first_step_done
            n, dev_metrics, tokens = p
            m = {f"train/{k}": float(v) for k, v in jax.device_get(dev_metrics).items()}
            if first_step_done is None:
                first_step_done = time.perf_counter() - _T0
                summary["seconds_to_first_step"] = first_step_done  # since schooner.train was imported
                summary["first_step_time"] = time.time()
            finite = m.pop("train/finite") == 1.0
            m["train/tokens"] = float(self.tokens_before(n))
            thr = progress.update(n, tokens, m)
            m.update(thr)
            if "throughput/tokens_per_second" in thr:
                tps.append(thr["throughput/tokens_per_second"])
            trackers.log(m, n)
            last = m
            if not finite:
                ckpt.wait()
                good = latest_checkpoint(self.root)
                raise NonFiniteLossError(
                    f"step {n}: the loss, gradient or updated parameters are not finite "
                    f"(loss={m.get('train/loss')}, grad_norm={m.get('train/grad_norm')}, "
                    f"param_norm={m.get('train/param_norm')}); training stopped without applying that update. "
                    f"Last good checkpoint: {good[1] if good else 'none'}. Lower the learning rate, add "
                    "warmup or gradient clipping, or check the data."
                )

        try:
            if self.start_step >= total:
                logger.info(f"nothing to do: the run already reached step {total}")
            with DataLoader(
                self.dataset,
                self._batch_size_fn(),
                start_step=self.start_step,
                sharding=self.batch_sharding,
                prefetch=2,
                stop_step=total,
            ) as loader:
                for step, batch in loader:
                    n = step + 1
                    t_dispatch = time.perf_counter()
                    self.state, metrics = self.step_fn(self.state, batch)
                    if "compile_seconds" not in summary:
                        # The first call traces and compiles synchronously; execution itself is asynchronous.
                        summary["compile_seconds"] = time.perf_counter() - t_dispatch
                        memory = next(iter(self.step_fn.memory.values()), None)
                        if memory is not None:  # what XLA said the compiled step holds per device
                            summary["step_memory_bytes"] = memory.total
                    if pending is not None:
                        finish(pending)
                    pending = (n, metrics, cfg.batch_size_at(step) * cfg.data.seq_len)
                    do_eval = evaluator is not None and cfg.eval_every is not None and n % cfg.eval_every == 0
                    do_ckpt = ckpt.should_save(n, last_step=total)
                    if do_eval or do_ckpt or n == total:
                        finish(pending)  # a checkpoint or eval must see a verified-finite state
                        pending = None
                    if do_eval and n != total:
                        trackers.log(self._evaluate(evaluator), n)
                    if do_ckpt:
                        snapshot = jax.tree.map(jnp.copy, self.state)  # the loop donates self.state next step
                        meta = {
                            "tokens": self.tokens_before(n),
                            "metrics": last,
                            "seed": cfg.seed,
                            "tokenizer_fingerprint": self.tokenizer_fingerprint,
                            "tokenizer_special_ids": special_ids,
                        }
                        ckpt.save(n, snapshot, self._write_checkpoint, meta)
                        trackers.flush()  # rows up to this checkpoint survive a kill (object stores)
            if pending is not None:
                finish(pending)
            ckpt.wait()
            if evaluator is not None and self.start_step < total:
                ev = self._evaluate(evaluator)
                trackers.log(ev, max(total, self.start_step))
                summary["eval"] = ev
        finally:
            progress.close()
            trackers.finish()
            try:
                ckpt.close()
            finally:
                if primary and cfg.trackers.loss_plot and fs_exists(f"{self.root}/metrics.jsonl"):
                    plot_losses(f"{self.root}/metrics.jsonl", f"{self.root}/loss.png", title=cfg.name)
        final = latest_checkpoint(self.root)
        summary.update(
            final_loss=last.get("train/loss"),
            checkpoint=final[1] if final else None,
            tokens_per_second=float(np.median(tps)) if tps else None,
            mfu=(float(np.median(tps)) * fpt / peak) if tps else None,
            checkpoint_write_seconds=list(ckpt.write_seconds),
        )
        return summary

    def _make_evaluator(self) -> Any:
        if not self.validation:
            return None
        from schooner.tokenize import load_tokenizer

        from ._evaluate import Evaluator

        tok_path = self._tokenizer_path()
        byte_lengths = None
        if tok_path is not None:
            byte_lengths = load_tokenizer(tok_path).token_byte_lengths()
            if len(byte_lengths) < self.model_config.vocab_size:
                byte_lengths = np.pad(byte_lengths, (0, self.model_config.vocab_size - len(byte_lengths)))
        else:
            logger.warning(
                "no tokenizer found for the caches: bits-per-byte is not reported (pass tokenizer=)"
            )
        from ._sft import ChatEvaluator, Evaluators, is_chat_cache

        dp = self.config.mesh.data_parallel_size(len(jax.devices()))
        eval_bs = max(dp, math.ceil(min(self.config.batch_sizes) / dp) * dp)
        # Chat caches are scored on their assistant tokens, packed as in training; plain caches as streams.
        chat = {k: v for k, v in self.validation.items() if is_chat_cache(v)}
        plain = {k: v for k, v in self.validation.items() if k not in chat}
        kinds: list[tuple[type[Evaluator] | type[ChatEvaluator], dict[str, str]]] = [
            (Evaluator, plain),
            (ChatEvaluator, chat),
        ]
        parts = [
            cls(
                caches,
                seq_len=self.config.data.seq_len,
                batch_size=eval_bs,
                max_tokens=self.config.data.eval_max_tokens,
                byte_lengths=byte_lengths,
                sharding=self.batch_sharding,
                tokenizer=self.tokenizer_fingerprint,
            )
            for cls, caches in kinds
            if caches
        ]
        return Evaluators(parts)

    def _evaluate(self, evaluator: Any) -> dict[str, float]:
        import haliax as hax

        with hax.axis_mapping(self.compute_map):
            ev = evaluator(self.state.model)
        logger.info("eval: " + ", ".join(f"{k} {v:.4f}" for k, v in ev.items()))
        return ev


def parameter_counts(model_config: Any) -> dict[str, int]:
    """`{"total", "non_embedding"}`: the model's scalars, and those outside the embedding and output head."""
    from schooner.model import num_parameters

    total = num_parameters(model_config)
    tables = 1 if model_config.tie_embeddings else 2
    return {
        "total": total,
        "non_embedding": total - tables * model_config.vocab_size * model_config.hidden_dim,
    }


def _fs_open(path: str) -> Any:
    import fsspec

    return fsspec.open(path, "w")


def fs_exists(path: str) -> bool:
    """Whether `path` (local or fsspec URL) exists."""
    import fsspec

    fs, p = fsspec.core.url_to_fs(path)
    return fs.exists(p)


def _check_special_ids(cache: Any, first: Any) -> None:
    """Refuse a validation cache whose BOS or EOS id differs from the first training cache's (the same
    tokenizer.json with other special tokens: its documents end with another EOS). Manifests without the ids
    are accepted."""
    from schooner.tokenize import TokenizerMismatchError

    for key in ("bos_id", "eos_id"):
        if key in cache.manifest and key in first.manifest and cache.manifest[key] != first.manifest[key]:
            raise TokenizerMismatchError(
                f"validation cache {cache.path!r} was built with {key}={cache.manifest[key]} but training cache "
                f"{first.path!r} with {key}={first.manifest[key]} (the same tokenizer.json, other special tokens); "
                "rebuild the validation cache with the training caches' tokenizer"
            )
