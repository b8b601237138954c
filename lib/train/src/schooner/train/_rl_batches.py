"""The GRPO objective's batch source and its metrics hook: `RolloutBatches` makes each rollout group's batch
(prompts, rollouts, rewards, advantages, dynamic sampling: the steps listed in `schooner.train._rl`), `score`
runs the user's reward on the host, `RolloutMetrics` logs the rollouts' host metrics after each step and draws
`reward.png` at the end."""

from __future__ import annotations

import io
import json
import logging
import math
import numbers
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from ._objective import StepInfo
from ._rl_sampling import has_signal, round_prompt_indices, select_groups
from ._rl_workers import RolloutPool

logger = logging.getLogger("schooner.train")


@dataclass(frozen=True)
class PromptRow:
    """One task row: its id, its prompt and every field (for the reward)."""

    row_id: str
    prompt: Any
    fields: Mapping[str, Any]


def read_prompts(
    path: str,
    prompt_field: str = "prompt",
    id_field: str = "id",
    *,
    required: Sequence[str] = (),
    reward: str = "the reward",
    what: str = "grpo",
    kind: str = "prompts",
    inner: str = "train.jsonl",
) -> list[PromptRow]:
    """The rows of a prompts file (JSON lines, `.gz` too: `storage.read_json_lines`), or of `inner` in a
    folder; each must hold the `required` fields (those `reward` reads). Every message starts with `what`
    (who reads: "grpo", or a held-out evaluation's "pass@k 'name'") and calls the file `kind`.

    Raises:
        FileNotFoundError: no such file (or a folder without `inner`).
        ValueError: a line that is not UTF-8, not JSON or not a JSON object, or lacks the prompt field or a
            required one, naming the file and line; a file with no rows.
    """
    from schooner.cluster import storage

    if storage.isdir(path):
        folder, path = path, storage.join(path, inner)
        if not storage.exists(path):
            raise FileNotFoundError(
                f"{what}: the folder {folder!r} holds no {inner}; give the {kind} file itself, or a folder "
                f"holding {inner}"
            )
    if not storage.exists(path):
        raise FileNotFoundError(
            f"{what}: no {kind} file {path!r}; give a JSON-lines file (or a folder with {inner}) whose rows "
            f"hold {prompt_field!r} and the task's fields"
        )
    rows: list[PromptRow] = []
    for n, row in storage.read_json_lines(path, what=what):
        where = f"{path}:{n}"
        prompt = row.get(prompt_field)
        if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
            raise ValueError(
                f"{what}: {where} has no {prompt_field!r} field holding text or a conversation (got "
                f"{prompt!r}; its fields: {sorted(row)}); set prompt_field= to the field that holds it"
            )
        row_id = str(row.get(id_field, where))
        missing = [f for f in required if f not in row]
        if missing:
            raise ValueError(
                f"{what}: {where} (row {row_id}) has no {missing[0]!r} field, which {reward} reads (the row's "
                f"fields: {sorted(row)}); add it to every row, or point the reward at the field that holds the "
                f"answer (e.g. exact_answer(field=...)), or set Grpo(required_fields=...) to what it reads"
            )
        rows.append(PromptRow(row_id, prompt, row))
    if not rows:
        raise ValueError(
            f"{what}: {path} holds no rows: give one JSON object per line, each with {prompt_field!r} and the "
            "fields the reward reads"
        )
    return rows


def encode_prompts(
    tokenizer: Any, prompts: Sequence[Any], *, chat: bool, what: str = "grpo"
) -> tuple[list[list[int]], tuple]:
    """Token ids of each prompt and the stop ids: chat-rendered (`chat_prompts`), or the raw text (errors start
    with `what`, who encodes)."""
    from ._rl_rollout import chat_prompts

    if chat:
        return chat_prompts(tokenizer, prompts)
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    ids = []
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError(f"{what}: chat=False takes text prompts, got a {type(p).__name__}: {p!r:.80}")
        ids.append(bos + tokenizer.encode(p))
    stops = () if tokenizer.eos_id is None else (int(tokenizer.eos_id),)
    return ids, stops


# -- the loss --------------------------------------------------------------------------------------------


# -- the batch source ------------------------------------------------------------------------------------
class RolloutBatches:
    """The trainer's on-policy batch source: rollouts, rewards and advantages every `num_iterations` steps
    (module docstring); the host metrics of each step wait in `metrics` for the `RolloutMetrics` hook."""

    on_policy = True

    def __init__(
        self,
        cfg: Any,
        *,
        rows: Sequence[PromptRow],
        prompts: Sequence[Sequence[int]],
        tokenizer: Any,
        sampling: Any,
        seed: int,
        max_prompt_tokens: int,
        pad_id: int,
        root: str,
        skipped: int = 0,
        pool: RolloutPool | None = None,
    ) -> None:
        self.cfg, self.rows, self.prompts, self.tokenizer = cfg, list(rows), list(prompts), tokenizer
        self.sampling, self.seed, self.cap, self.pad_id = sampling, seed, max_prompt_tokens, pad_id
        self.root, self.skipped = root.rstrip("/"), skipped
        self.pool = pool if pool is not None else RolloutPool(0, root, None)
        self.metrics: dict[int, dict[str, float]] = {}
        """step (0-based) -> host metrics, popped by the hook."""
        self.ready_at: dict[int, float] = {}
        """step -> when its batch was handed over (for `time/update`)."""
        self._group: tuple[int, dict[str, np.ndarray]] | None = None

    # the trainer's interface
    def batch_for(self, step: int, batch_size: int, model: Any) -> dict[str, np.ndarray]:
        import jax

        jax.block_until_ready(model)  # the previous update is done: its time ends here
        if step - 1 in self.ready_at:
            self.metrics.setdefault(step - 1, {})["time/update"] = (
                time.perf_counter() - self.ready_at[step - 1]
            )
        group = step // self.cfg.num_iterations
        m: dict[str, float] = {}
        if self._group is None or self._group[0] != group:
            if step % self.cfg.num_iterations and self._stored(group):
                batch = self._load(group)  # resumed mid-group: the rollouts of weights no longer held
                m.update({"time/rollout": 0.0, "time/scoring": 0.0})
            else:
                batch, m = self.make(group, batch_size, model)
                if self.cfg.num_iterations > 1:
                    self._store(group, batch)
            self._group = (group, batch)
        else:
            m.update({"time/rollout": 0.0, "time/scoring": 0.0})
        batch = self._group[1]
        if batch["tokens"].shape[0] != batch_size:
            raise ValueError(
                f"grpo: step {step} wants {batch_size} completions but its rollout group has "
                f"{batch['tokens'].shape[0]}; a batch-size schedule must change at multiples of num_iterations"
            )
        self.metrics[step] = self.metrics.get(step, {}) | m
        self.ready_at[step] = time.perf_counter()
        return batch

    def make(self, group: int, batch_size: int, model: Any) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        """Rollouts of group `group` from `model`: the batch and its host metrics (with dynamic sampling, of
        the groups `select_groups` keeps from up to `max_sampling_rounds` rounds)."""
        from ._rl_objective import group_advantages, rollout_metrics
        from ._rl_workers import _concat

        g, dynamic = self.cfg.num_generations, self.cfg.dynamic_sampling
        per_group = batch_size // g
        rounds = self.cfg.max_sampling_rounds if dynamic else 1
        batches: list[Any] = []
        rewards: list[np.ndarray] = []
        signal: list[np.ndarray] = []
        errors: list[dict[str, Any]] = []
        timing = {"time/rollout": 0.0, "time/scoring": 0.0}
        for r in range(rounds):
            rb, grouped, errs, t_roll, t_score = self._sample_round(group, r, rounds, per_group, model)
            batches.append(rb)
            rewards.append(grouped)
            errors += [dict(e, round=r) for e in errs] if dynamic else errs
            timing["time/rollout"] += t_roll
            timing["time/scoring"] += t_score
            signal.append(has_signal(grouped))
            if sum(int(x.sum()) for x in signal) >= per_group:
                break
        m: dict[str, float] = {}
        if dynamic:
            rb = batches[0] if len(batches) == 1 else _concat(batches)
            every = np.concatenate(rewards)
            chosen, kept = select_groups(signal, per_group)
            rows = (chosen[:, None] * g + np.arange(g)).reshape(-1)
            grouped = every[chosen]
            tokens, mask, old = rb.tokens[rows], rb.mask[rows], rb.old_logprobs[rows]
            stop_reasons = [rb.stop_reasons[i] for i in rows]
            first = rollout_metrics(cast(Any, rewards[0]), cast(Any, batches[0].mask))
            sampled = rollout_metrics(cast(Any, every), cast(Any, rb.mask))
            m = {
                "rollout/dynamic/rounds": float(len(batches)),
                "rollout/dynamic/sampled_groups": float(len(every)),
                "rollout/dynamic/kept_groups": float(kept),
                "rollout/dynamic/shortfall": float(per_group - kept),
                "rollout/dynamic/first_round/reward": float(first["reward"]),
                "rollout/dynamic/first_round/frac_reward_zero_std": float(first["frac_reward_zero_std"]),
                "rollout/dynamic/sampled/reward": float(sampled["reward"]),
                "rollout/dynamic/sampled/frac_reward_zero_std": float(sampled["frac_reward_zero_std"]),
            }
            if kept < per_group:
                logger.warning(
                    f"grpo: rollout group {group}: dynamic sampling found {kept} of {per_group} prompt groups with "
                    f"reward signal in {len(batches)} round(s) ({len(every)} groups sampled); the batch holds "
                    f"{per_group - kept} without (advantage 0, as plain GRPO would): raise max_sampling_rounds "
                    "or num_generations"
                )
        else:
            (rb,), (grouped,) = batches, rewards
            tokens, mask, old, stop_reasons = rb.tokens, rb.mask, rb.old_logprobs, list(rb.stop_reasons)
        kwargs = {"scale": self.cfg.scale_rewards} if self.cfg.advantage == "grpo" else {}
        advantages = np.asarray(group_advantages(grouped, self.cfg.advantage, **kwargs), np.float32)
        m |= {
            f"rollout/{k}": float(v) for k, v in rollout_metrics(cast(Any, grouped), cast(Any, mask)).items()
        }
        m["rollout/completions/clipped_ratio"] = sum(w == "length" for w in stop_reasons) / max(
            len(stop_reasons), 1
        )
        m["rollout/skipped_prompts"] = float(self.skipped + sum(len(b.skipped) for b in batches))
        m["rollout/reward_errors"] = float(len(errors))
        for kind, count in Counter(e["type"] for e in errors).items():
            m[f"rollout/reward_errors/{kind}"] = float(count)
        if errors:
            self._report(group, errors)
        m.update(timing)
        batch = {"tokens": tokens, "mask": mask, "old_logprobs": old, "advantages": advantages.reshape(-1)}
        return batch, m

    def _sample_round(
        self, group: int, sampling_round: int, rounds: int, per_group: int, model: Any
    ) -> tuple[Any, np.ndarray, list[dict[str, str]], float, float]:
        """One round's rollouts of `per_group` prompts (round 0: the group's own) and their rewards, grouped
        `(P, G)`: the rollout batch, the rewards, the reward errors and the rollout and scoring seconds."""
        g = self.cfg.num_generations
        idx = round_prompt_indices(group, sampling_round, per_group, len(self.rows), self.seed, rounds)
        rows = [self.rows[i] for i in idx]
        t0 = time.perf_counter()
        rb = self.pool.rollout(
            model,
            [self.prompts[i] for i in idx],
            sampling=self.sampling,
            seed=self.seed,
            group=group,
            max_prompt_tokens=self.cap,
            row_ids=[r.row_id for r in rows],
            pad_id=self.pad_id,
            chunk=self.cfg.rollout_chunk,
            sampling_round=sampling_round,
        )
        t1 = time.perf_counter()
        stops = set(self.sampling.stop_ids)
        completions = []
        for ids, why in zip(rb.completions(), rb.stop_reasons, strict=True):
            if why == "stop_id" and ids and ids[-1] in stops:
                ids = ids[:-1]
            completions.append(self.tokenizer.decode(ids))
        prompt_texts = [_prompt_text(r.prompt) for r in rows]
        rewards, errors = score(
            self.cfg.reward,
            [prompt_texts[i // g] for i in range(len(completions))],
            completions,
            [rows[i // g].fields for i in range(len(completions))],
            [f"{rows[i // g].row_id}#{i % g}" for i in range(len(completions))],
        )
        t2 = time.perf_counter()
        return rb, rewards.reshape(-1, g), errors, t1 - t0, t2 - t1

    # errors and stored rollouts
    def _report(self, group: int, errors: list[dict[str, str]]) -> None:
        from schooner.cluster import storage

        kinds = Counter(f"{e['type']}: {e['message']}" for e in errors)
        top = "; ".join(f"{k} (x{n})" for k, n in kinds.most_common(3))
        logger.warning(
            f"grpo: rollout group {group}: the reward failed on {len(errors)} completion(s), scored nan (left "
            f"out, advantage 0): {top}; first row {errors[0]['row']}"
        )
        path = storage.join(self.root, "reward_errors.jsonl")
        lines = "".join(json.dumps({"group": group, **e}) + "\n" for e in errors)
        if storage.is_local(path):
            with open(storage.local_path(path), "a", encoding="utf-8") as f:
                f.write(lines)
        else:  # an object store cannot append: the file is written again
            old = storage.read_text(path) if storage.exists(path) else ""
            storage.atomic_write(path, old + lines)

    def _path(self, group: int) -> str:
        from schooner.cluster import storage

        return storage.join(self.root, "rollouts", f"group-{group:06d}.npz")

    def _stored(self, group: int) -> bool:
        from schooner.cluster import storage

        return storage.exists(self._path(group))

    def _load(self, group: int) -> dict[str, np.ndarray]:
        from schooner.cluster import storage

        with np.load(io.BytesIO(storage.read_bytes(self._path(group)))) as z:
            return {k: z[k] for k in z.files}

    def _store(self, group: int, batch: Mapping[str, np.ndarray]) -> None:
        """Keep the group's rollouts until a checkpoint lies past it (a resume inside it reads them)."""
        from schooner.cluster import storage

        from ._checkpoint import latest_checkpoint

        buf = io.BytesIO()
        np.savez(buf, allow_pickle=False, **batch)
        storage.makedirs(storage.join(self.root, "rollouts"))
        storage.atomic_write(self._path(group), buf.getvalue())
        latest = latest_checkpoint(self.root)
        done = latest[0] // self.cfg.num_iterations if latest else 0
        for name in storage.list_folder(storage.join(self.root, "rollouts")):
            base = os.path.basename(name.rstrip("/"))
            if base.startswith("group-") and base.endswith(".npz") and int(base[6:12]) < min(done, group):
                storage.remove(storage.join(self.root, "rollouts", base))


def _prompt_text(prompt: Any) -> str:
    """A prompt as the reward sees it: the text, or a conversation's last user message."""
    if isinstance(prompt, str):
        return prompt
    users = [m.get("content", "") for m in prompt if isinstance(m, Mapping) and m.get("role") == "user"]
    return str(users[-1]) if users else ""


def score(
    reward: Callable[[str, str, Mapping[str, Any]], float],
    prompts: Sequence[str],
    completions: Sequence[str],
    fields: Sequence[Mapping[str, Any]],
    row_ids: Sequence[str],
) -> tuple[np.ndarray, list[dict[str, str]]]:
    """float64 rewards, `nan` where the function raised an `Exception` or returned no finite real number,
    and those failures (`{"row", "type", "message"}`). KeyboardInterrupt and SystemExit propagate."""
    out = np.empty(len(completions), np.float64)
    errors: list[dict[str, str]] = []
    for i, (p, c, f) in enumerate(zip(prompts, completions, fields, strict=True)):
        try:
            v = reward(p, c, f)
            if isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v):
                raise ValueError(f"a reward must be a finite real number, got {v!r}")
            out[i] = float(v)
        except Exception as e:  # noqa: BLE001 - a user's reward failing is counted, never fatal
            out[i] = np.nan
            errors.append({"row": str(row_ids[i]), "type": type(e).__name__, "message": str(e)[:200]})
    return out, errors


# -- the hook ----------------------------------------------------------------------------------------------
class RolloutMetrics:
    """After each step: the rollouts' host metrics and the time split; at the last step, `reward.png`."""

    every = 1

    def __init__(self, data: RolloutBatches, total: int, name: str = "") -> None:
        self.data, self.total, self.name = data, total, name

    def __call__(self, info: StepInfo) -> Mapping[str, float] | None:
        s = info.step - 1
        m = self.data.metrics.pop(s, {})
        ready = self.data.ready_at.pop(s, None)
        if "time/update" not in m and ready is not None:  # the step's metrics were read: it is done
            m["time/update"] = time.perf_counter() - ready
        if info.step == self.total:
            try:
                plot_rewards(self.data.root, m, info.step, title=self.name)
            except Exception as e:  # noqa: BLE001 - a plot never fails a finished run
                logger.warning(f"grpo: could not draw reward.png: {e}")
        return m


def plot_rewards(root: str, last: Mapping[str, float], step: int, *, title: str = "") -> None:
    """`reward.png`: the mean reward (and +- its std) per rollout step, from `metrics.jsonl` and `last`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from schooner.cluster import storage

    from ._tracking import read_metrics

    rows = [r for r in read_metrics(root) if r.get("step", 0) < step]
    rows.append({"step": step, **last})
    pts = [
        (r["step"], r["rollout/reward"], r.get("rollout/reward_std") or 0.0)
        for r in rows
        if isinstance(r.get("rollout/reward"), float | int)
    ]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    if pts:
        x, y, sd = (np.asarray(v, float) for v in zip(*sorted(pts)))
        ax.plot(x, y, label="rollout/reward", linewidth=1)
        ax.fill_between(x, y - sd, y + sd, alpha=0.2, label="+- reward_std")
        ax.legend()
    ax.set_xlabel("step")
    ax.set_ylabel("reward")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    with storage.atomic_open(storage.join(root, "reward.png"), "wb") as f:
        fig.savefig(f, format="png")
    plt.close(fig)
