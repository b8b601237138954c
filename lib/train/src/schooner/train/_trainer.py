"""`Trainer`: one training loop configured by its objective, data, evaluators and hooks.

Pretraining, SFT and DPO are configurations of it (`_lm.py`, `_dpo_run.py` build their parts; `train()`
wires a `TrainerConfig` to them). The loop keeps the device busy: the step for batch s+1 is dispatched
before the metrics of batch s are read back (a one-step lag), the data loader prepares batches on threads,
and checkpoints are written from device copies on a background thread. A batch source that reads the
policy (`PolicyBatches`, RL's rollouts) is asked for each batch in the loop instead, with the current model.
The host's work a step is kept small (for a tiny model it, not the device, sets the pace): the step is
dispatched on the state's flat leaves and returns its metrics as one vector (`on_leaves`).

Resuming: `_resume_checks` refuses a config that is another run than the folder's, `_resume_state` reads the
train state back from the latest checkpoint.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import jax
import jax.numpy as jnp
import numpy as np

from schooner.cluster import published_paths, storage

from ._checkpoint import CheckpointManager, latest_checkpoint
from ._config import BatchSchedule, TrainerConfig
from ._malloc import malloc_env
from ._memory import CompiledStep, advice
from ._mesh import make_mesh, replicated
from ._objective import Batches, Evaluator, Hook, Objective, PolicyBatches, StepInfo
from ._progress import Progress
from ._resume_checks import check_same_run, config_record
from ._resume_state import restore_state
from ._run_info import (
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


def batch_sharding(config: TrainerConfig, mesh: Any = None) -> Any:
    """The sharding of a run's `[B, T]` batch arrays: rows split over the mesh's batch axes."""
    mesh = mesh if mesh is not None else make_mesh(config.mesh)
    return jax.sharding.NamedSharding(
        mesh, jax.sharding.PartitionSpec(config.mesh.compute_axis_mapping["batch"], None)
    )


def place_params(tree: Any, config: TrainerConfig, mesh: Any = None) -> tuple[Any, Any]:
    """`(placed, shardings)`: a model pytree (a frozen reference) placed on the run's mesh as the policy's
    weights are; `shardings` is what the train step declares for it."""
    import equinox as eqx

    from schooner.model import model_shardings

    mesh = mesh if mesh is not None else make_mesh(config.mesh)
    shardings = model_shardings(
        eqx.filter_eval_shape(lambda m: m, tree), mesh, config.mesh.param_axis_mapping
    )
    return jax.jit(lambda m: m, out_shardings=shardings)(tree), shardings


def on_leaves(step: Callable[..., Any], state_def: Any, metric_names: list[str]) -> Callable[..., Any]:
    """`step(state, *args) -> (state, metrics)` as `(state leaves, *args) -> (state leaves, metrics vector)`.

    The step jitted on the state's leaves (`state_def`: its tree structure) is dispatched from a list of
    arrays: jax's C++ dispatch neither flattens the model's pytree nor rebuilds it from the outputs in
    Python (haliax's `NamedArray`s) each step. The float32 scalar metrics come back as one vector, one
    transfer to the host; tracing fills `metric_names` with their order (sorted, as a dict's pytree is). They
    pass an optimization barrier first, so they are computed as when they were outputs of their own and the
    state's computation is the same program.
    """

    def flat(leaves: list[Any], *args: Any) -> tuple[list[Any], jax.Array]:
        state, metrics = step(jax.tree.unflatten(state_def, leaves), *args)
        new_leaves, new_def = jax.tree.flatten(state)
        if new_def != state_def:
            raise TypeError(f"on_leaves: the step returned a state of structure {new_def}, not {state_def}")
        metric_names[:] = sorted(metrics)
        metrics = jax.lax.optimization_barrier(metrics)
        return new_leaves, jnp.stack([metrics[k] for k in metric_names])

    return flat


class Trainer:
    """Trains `model_config` on `data` by minimising `objective`, as `config` says; `run()` does the work.

    Resumes from the latest complete checkpoint in `output_path`; checkpoints, `metrics.jsonl`, `run.json`
    and `loss.png` go there.

    Args:
        config: the run (steps, batch size, optimizer, mesh, checkpoints, trackers...).
        output_path: the run folder.
        model_config: the architecture trained (the setup fitted its vocabulary to the data).
        objective: the loss, and the frozen arrays it reads (`Objective`).
        data: the batch source (`Batches`, prefetched; or `PolicyBatches`, asked in the loop).
        evaluators: each `evaluator(model) -> {"eval/...": value}` runs every `config.eval_every` steps and
            at the end; their metrics are merged.
        hooks: `hook(StepInfo) -> metrics | None` after every `hook.every`-th step.
        metadata: recorded in `run.json` and in each checkpoint's metadata.

    Example:
        >>> setup = LanguageModeling().setup(config, "runs/x")                            # doctest: +SKIP
        >>> Trainer(config, output_path="runs/x", **vars(setup)).run()                      # doctest: +SKIP
    """

    def __init__(
        self,
        config: TrainerConfig,
        *,
        output_path: str,
        model_config: Any,
        objective: Objective,
        data: Batches | PolicyBatches,
        evaluators: Sequence[Evaluator] = (),
        hooks: Sequence[Hook] = (),
        metadata: Mapping[str, Any] | None = None,
    ) -> None:
        if not output_path:
            raise ValueError("Trainer: output_path is empty; give the run folder")
        self.config, self.root = config, output_path.rstrip("/")
        self.model_config, self.objective, self.data = model_config, objective, data
        self.evaluators, self.hooks = list(evaluators), list(hooks)
        self.metadata = dict(metadata or {})
        self._state: Any = None  # the TrainState, or None while only its leaves are current
        self._leaves: list[Any] | None = None  # the state's flat leaves, as the compiled step takes them
        self._state_def: Any = None  # the state's tree structure (set up with the abstract state)
        self.metric_names: list[str] = []  # the step's metrics, in the order of its metrics vector

    # -- the train state -----------------------------------------------------------------------------
    # The loop holds the state as its flat leaves: the compiled step takes and returns them (`on_leaves`), so
    # no step dispatch flattens or rebuilds the model's pytree (for a tiny model, most of the host's time a
    # step). The `TrainState` is rebuilt from them when read (checkpoints, evaluators, hooks).
    @property
    def state(self) -> Any:
        """The train state (a `TrainState`; None before setup)."""
        if self._state is None and self._leaves is not None:
            self._state = jax.tree.unflatten(self._state_def, self._leaves)
        return self._state

    @state.setter
    def state(self, value: Any) -> None:
        self._state, self._leaves = value, None

    def _state_leaves(self) -> list[Any]:
        """The state's leaves, in the order the compiled step takes them."""
        if self._leaves is None:
            leaves, treedef = jax.tree.flatten(self._state)
            if treedef != self._state_def:
                raise TypeError(
                    f"Trainer: the train state's structure {treedef} is not the one the step was compiled for "
                    f"({self._state_def}); set `trainer.state` to a state of this run's model and optimizer"
                )
            self._leaves = leaves
        return self._leaves

    # -- setup ---------------------------------------------------------------------------------------
    def _setup_abstract(self) -> tuple[jax.Array, jax.Array]:
        """The mesh, optimizer, and the train state's shapes and shardings (nothing allocated); returns the
        (init, train) keys. `estimate_step_memory` stops here and compiles the step on these shapes."""
        import equinox as eqx

        from schooner.model import init, model_shardings

        from ._step import build_optimizer, init_state

        cfg = self.config
        self.mesh = make_mesh(cfg.mesh)
        self.param_map = cfg.mesh.param_axis_mapping
        self.compute_map = cfg.mesh.compute_axis_mapping
        self.batch_sharding = batch_sharding(cfg, self.mesh)
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
        self.abstract_state = abstract
        self._state_def = jax.tree.structure(abstract)
        return k_init, k_train

    def _setup_state(self) -> None:
        from schooner.model import init

        from ._step import init_state

        cfg = self.config
        k_init, k_train = self._setup_abstract()
        mc = self.model_config

        def fresh_state(k_init: jax.Array, k_train: jax.Array) -> Any:
            # Two programs: the weights (drawn as one flat buffer, sliced: twice their size at the peak), then
            # the optimizer state around them (the weights donated). In one program both peaks coincided: a
            # 0.95B model's init did not fit a 15.7 GiB chip that trains it.
            model = jax.jit(lambda k: init(mc, key=k), out_shardings=self.state_sharding.model)(k_init)
            make = lambda m, k: init_state(m, self.tx, k)  # noqa: E731
            return jax.jit(make, out_shardings=self.state_sharding, donate_argnums=(0,))(model, k_train)

        self.recorded: dict[str, Any] | None = None
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
            self.recorded = check_same_run(self.config, self.root, path, self.start_step)
            self.state = restore_state(
                path, self.model_config, self.abstract_state, self.mesh, self.param_map
            )
            self.resumed_from = path
            logger.info(f"resuming from {path} (step {self.start_step})")

    def _initial_state(self, k_train: jax.Array) -> Any:
        """Step 0 from `initialize_from`'s weights, with a fresh optimizer state (see `_init`)."""
        from ._init import load_initial_model
        from ._step import init_state

        model, self.initialized_from = load_initial_model(
            os.fspath(self.config.initialize_from), self.model_config, self.config.initialize_from_step
        )
        make = lambda m, k: init_state(m, self.tx, k)  # noqa: E731
        return jax.jit(make, out_shardings=self.state_sharding)(model, k_train)

    def _compile_step(self) -> None:
        import haliax as hax

        from ._step import _split_microbatches, make_train_step

        cfg, obj = self.config, self.objective
        bs = self.batch_sharding
        step_fn = make_train_step(
            self.tx,
            z_loss_weight=float(cfg.z_loss_weight),
            microbatches=cfg.microbatches,
            lr_schedule=self.lr_schedule,
            constrain_batch=(lambda b: jax.lax.with_sharding_constraint(b, {k: bs for k in b}))
            if obj.constrain_batch
            else None,
            loss=obj.loss,
            shards=cfg.mesh.data_parallel_size(len(jax.devices())),
        )
        # Every array of the batch (tokens, segment ids, masks) split as [B, T]; or as the loader placed them.
        batch_in = bs if obj.constrain_batch else None
        # The step takes and returns the state's leaves: a sharding each (`state_sharding` is a prefix of the
        # state: one sharding stands for a leafless optimizer node such as a masked-out group's).
        state_in = jax.tree.leaves(jax.tree.broadcast(self.state_sharding, self.abstract_state))
        out = (state_in, replicated(self.mesh))
        if obj.frozen is None:

            def wrapped(state: Any, batch: dict[str, jax.Array]) -> Any:
                with hax.axis_mapping(self.compute_map):
                    return step_fn(state, batch)

            jitted = jax.jit(
                on_leaves(wrapped, self._state_def, self.metric_names),
                in_shardings=(state_in, batch_in),
                out_shardings=out,
                donate_argnums=(0,),
            )
            self.step_fn = CompiledStep(jitted, self.memory_hint(), log=logger.info)
            return
        import equinox as eqx

        from schooner.model import model_shardings

        frozen_sharding = model_shardings(
            eqx.filter_eval_shape(lambda m: m, obj.frozen), self.mesh, self.param_map
        )
        m, prepare = cfg.microbatches, obj.prepare

        def extra(frozen: Any, batch: dict[str, Any]) -> dict[str, Any]:
            if prepare is None:
                return {}
            if m == 1:
                return prepare(frozen, batch)
            # as many passes as the policy's microbatches, so the frozen model's activations fit as theirs do
            out = jax.lax.map(lambda b: prepare(frozen, b), _split_microbatches(batch, m))
            return {k: v.reshape((-1, *v.shape[2:])) for k, v in out.items()}

        def with_frozen(state: Any, frozen: Any, batch: dict[str, Any]) -> Any:
            with hax.axis_mapping(self.compute_map):
                return step_fn(state, batch | extra(frozen, batch))

        jitted = jax.jit(
            on_leaves(with_frozen, self._state_def, self.metric_names),
            in_shardings=(state_in, frozen_sharding, batch_in),
            out_shardings=out,
            donate_argnums=(0,),
        )
        self.step_fn = CompiledStep(jitted, self.memory_hint(), bound=(obj.frozen,), log=logger.info)

    def memory_hint(self) -> str:
        """What lowers this run's step memory (for the preflight check's message)."""
        return advice(self.model_config, max(self.config.batch_sizes), self.config.microbatches)

    # -- helpers -------------------------------------------------------------------------------------
    def _batch_size_fn(self) -> Any:
        bsz = self.config.batch_size
        return bsz if isinstance(bsz, int) else BatchSchedule(bsz.stages)

    def tokens_before(self, step: int) -> int:
        """Tokens consumed by steps [0, step)."""
        cfg = self.config
        per_row = cfg.seq_len * self.objective.sequences_per_row
        if isinstance(cfg.batch_size, int):
            return step * cfg.batch_size * per_row
        return sum(cfg.batch_size_at(s) for s in range(step)) * per_row

    def _write_checkpoint(self, folder: str, snapshot: Any) -> None:
        from schooner.model import save_model, save_pytree

        save_model(folder, snapshot.model, self.model_config)
        save_pytree(
            f"{folder}/train_state",
            {"step": snapshot.step, "opt_state": snapshot.opt_state, "key": snapshot.key},
        )

    def _batches(self, stack: Any) -> Iterator[tuple[int, dict[str, Any]]]:
        """`(step, placed batch)` from `start_step` to the end: from the data loader's threads, or, for a
        source that reads the policy, asked here with the model after the previous step."""
        total = self.config.steps
        if getattr(self.data, "on_policy", False):
            data: Any = self.data

            def place(x: np.ndarray) -> Any:
                spec = jax.sharding.PartitionSpec(
                    self.config.mesh.compute_axis_mapping["batch"], *[None] * (x.ndim - 1)
                )
                return jax.device_put(x, jax.sharding.NamedSharding(self.mesh, spec))

            for step in range(self.start_step, total):
                b = data.batch_for(step, self.config.batch_size_at(step), self.state.model)
                yield step, {k: place(np.asarray(v)) for k, v in b.items()}
            return
        from schooner.tokenize import DataLoader

        loader = stack.enter_context(
            DataLoader(
                cast(Any, self.data),  # not on_policy: a `Batches`, the loader's BatchSource
                self._batch_size_fn(),
                start_step=self.start_step,
                sharding=self.batch_sharding,
                prefetch=2,
                stop_step=total,
            )
        )
        yield from loader

    def run(self) -> dict[str, Any]:
        """Run (or resume) training; returns a summary (`steps`, `final_loss`, `checkpoint`, `eval`,
        `tokens_per_second`, `mfu`, ...)."""
        import contextlib

        from schooner.model import flops_per_token, resolve_compute_dtype

        from ._mfu import peak_flops

        cfg = self.config
        maybe_init_distributed()
        enable_compilation_cache()
        self._setup_state()
        self._compile_step()
        total = cfg.steps
        parameters = parameter_counts(self.model_config)
        run_info = {
            "config": config_record(cfg),
            "model_config": config_to_json(self.model_config),
            "versions": package_versions(),
            "devices": [str(d) for d in jax.devices()],
            "mesh": cfg.mesh.shape(len(jax.devices())),
            **self.metadata,
            "parameters": parameters,
        }
        logger.info(
            f"model: {parameters['total']:,} parameters ({parameters['non_embedding']:,} non-embedding)"
        )
        earlier = list((self.recorded or {}).get("earlier") or [])
        if self.recorded and self.recorded.get("config") != run_info["config"]:
            # a resumed run under other (allowed) settings: the config it ran under before is kept
            earlier.append({k: v for k, v in self.recorded.items() if k != "earlier"})
        if earlier:
            run_info["earlier"] = earlier
        primary = is_primary()  # on several hosts, process 0 alone writes the run's files
        if primary:
            # Paths as they read once the step's attempt folder is published (see schooner.cluster).
            storage.write_json(
                storage.join(self.root, "run.json"), published_paths(run_info), sort_keys=False, default=str
            )
        trackers = make_trackers(
            cfg.trackers if primary else None,
            run_dir=self.root,
            name=cfg.name,
            run_config=run_info,
            resume_step=self.start_step if self.resumed_from else None,
        )
        ckpt = CheckpointManager(self.root, cfg.checkpoint, log=logger.info)
        seq_tokens = cfg.seq_len * self.objective.sequences_per_row
        fpt = flops_per_token(self.model_config, cfg.seq_len)
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
            # One transfer for the step's metrics (a float32 vector, `metric_names` its order).
            values = np.asarray(dev_metrics).tolist()
            m = {f"train/{k}": v for k, v in zip(self.metric_names, values, strict=True)}
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
            for hook in self.hooks:
                if n % hook.every == 0:
                    extra = hook(StepInfo(step=n, metrics=dict(m), trainer=self))
                    if extra:
                        trackers.log(dict(extra), n)

        try:
            if self.start_step >= total:
                logger.info(f"nothing to do: the run already reached step {total}")
            with contextlib.ExitStack() as stack:
                for step, batch in self._batches(stack):
                    n = step + 1
                    t_dispatch = time.perf_counter()
                    leaves, metrics = self.step_fn(self._state_leaves(), batch)
                    self._state, self._leaves = None, leaves  # the old leaves were donated to the step
                    if "compile_seconds" not in summary:
                        # The first call traces and compiles synchronously; execution itself is asynchronous.
                        summary["compile_seconds"] = time.perf_counter() - t_dispatch
                        memory = next(iter(self.step_fn.memory.values()), None)
                        if memory is not None:  # what XLA said the compiled step holds per device
                            summary["step_memory_bytes"] = memory.total
                    if pending is not None:
                        finish(pending)
                    pending = (n, metrics, cfg.batch_size_at(step) * seq_tokens)
                    do_eval = bool(self.evaluators) and cfg.eval_every is not None and n % cfg.eval_every == 0
                    do_ckpt = ckpt.should_save(n, last_step=total)
                    if do_eval or do_ckpt or n == total:
                        finish(pending)  # a checkpoint or eval must see a verified-finite state
                        pending = None
                    if do_eval and n != total:
                        trackers.log(self._evaluate(), n)
                    if do_ckpt:
                        snapshot = jax.tree.map(jnp.copy, self.state)  # the loop donates self.state next step
                        meta = {
                            "tokens": self.tokens_before(n),
                            "metrics": last,
                            "seed": cfg.seed,
                            **self.metadata,
                        }
                        ckpt.save(n, snapshot, self._write_checkpoint, meta)
                        trackers.flush()  # rows up to this checkpoint survive a kill (object stores)
            if pending is not None:
                finish(pending)
            ckpt.wait()
            if self.evaluators and self.start_step < total:
                ev = self._evaluate()
                trackers.log(ev, max(total, self.start_step))
                summary["eval"] = ev
        finally:
            progress.close()
            trackers.finish()
            try:
                ckpt.close()
            finally:
                if primary and cfg.trackers.loss_plot and storage.exists(f"{self.root}/metrics.jsonl"):
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

    def _evaluate(self) -> dict[str, float]:
        import haliax as hax

        ev: dict[str, float] = {}
        with hax.axis_mapping(self.compute_map):
            for evaluator in self.evaluators:
                ev.update(evaluator(self.state.model))
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
