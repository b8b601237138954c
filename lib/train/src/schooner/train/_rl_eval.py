"""Held-out pass@k of a policy on a verifiable task: during RL training (an evaluator of the `Grpo`
objective, from `TrainerConfig.validation`) and of any checkpoint on its own (`evaluate_pass_at_k`, the
`pass_at_k_eval` step), measured the same way in both.

For each of the first `max_prompts` rows of a held-out prompts file, `samples` (= n) completions are drawn at
a fixed seed (prompt chunk `c` uses the key `fold_in(key(seed), c)`: the same prompts, weights and settings
give the same completions, whatever the training step), decoded as the rollouts are (the stop id cut off),
and scored by the run's reward; a sample is correct when its reward is >= `threshold`. A row's `c` correct of
`n` gives the unbiased pass@k of Chen et al. 2021, `1 - C(n - c, k) / C(n, k)`, and the task's pass@k is its
mean over the rows with the standard error of that mean (sample std / sqrt(rows)), as
`schooner.eval.passk.mean_pass_at_k` computes it (the trainer does not import `schooner.eval`). A reward that
raises counts the sample incorrect and is counted (`reward_errors`), never a crash.

Metrics (`<name>` the key in `validation`): `eval/<name>/pass@<k>` and `eval/<name>/pass@<k>_stderr` for each
k, `eval/<name>/reward` (mean reward), `eval/<name>/completion_length` (mean tokens, stop id included),
`eval/<name>/clipped_ratio`, `eval/<name>/reward_errors`, `eval/<name>/prompts`.

    >>> round(pass_at_k(n=10, c=3, k=5), 6)
    0.916667
"""

from __future__ import annotations

import logging
import math
import numbers
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

logger = logging.getLogger("schooner.train")


@dataclass(frozen=True)
class PassAtK:
    """A held-out pass@k evaluation: the value of a `validation={name: PassAtK(...)}` entry of an RL run (a
    plain path there means `PassAtK(prompts=path)`), or the task of `evaluate_pass_at_k`.

    Example:
        >>> PassAtK("arithmetic/heldout.jsonl", samples=8, ks=(1, 8)).ks
        (1, 8)
    """

    prompts: Any
    """The held-out prompts: a JSON-lines file (rows as `rl_train`'s prompts), or a folder holding
    `heldout.jsonl` (e.g. `schooner.eval.arithmetic.arithmetic_task`'s), or a step producing one."""
    samples: int = 8
    """n: completions per prompt."""
    ks: tuple[int, ...] = (1,)
    """The k of each pass@k reported (each <= samples)."""
    max_prompts: int | None = None
    """Score the first this many rows (fixed: comparable across steps and runs); None: all."""
    seed: int = 0
    """The sampling seed (fixed, apart from the run's)."""
    temperature: float | None = None
    """Sampling temperature; None: the RL objective's (1.0 on its own)."""
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    """The completion cap; None: the RL objective's (64 on its own)."""
    prompts_per_batch: int = 16
    """Prompts sampled together (rows = prompts_per_batch x samples); never changes which prompts are scored,
    but the sampling keys go by chunk: keep it fixed to compare numbers."""
    threshold: float = 1.0
    """A sample is correct when its reward is >= this."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "ks", tuple(self.ks))
        for f in ("samples", "prompts_per_batch"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"PassAtK: {f} must be an int >= 1, got {f}={v!r}")
        if not self.ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in self.ks):
            raise ValueError(f"PassAtK: ks must be ints >= 1, got ks={self.ks!r}")
        if max(self.ks) > self.samples:
            raise ValueError(
                f"PassAtK: pass@{max(self.ks)} needs at least that many samples per prompt, got "
                f"samples={self.samples}; raise samples or lower ks"
            )
        for f in ("max_prompts", "max_new_tokens", "top_k"):
            v = getattr(self, f)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"PassAtK: {f} must be an int >= 1 or None, got {f}={v!r}")
        t = self.temperature
        if t is not None and (isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0):
            raise ValueError(f"PassAtK: temperature must be a number > 0 or None, got temperature={t!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**32:
            # JAX's keys hold 32 bits of a seed: 2**32 would sample as seed 0 does
            raise ValueError(f"PassAtK: seed must be an int in [0, 2**32), got seed={self.seed!r}")

    def evaluator(
        self, name: str, grpo: Any, tokenizer: Any, *, max_prompt_tokens: int, pad_id: int
    ) -> HeldoutPassAtK:
        """The evaluator of this task in an RL run (`Grpo.setup` calls it for each `validation` entry):
        sampled as the run's rollouts are (its temperature, completion cap, chat rendering) where this task
        leaves them None, scored with the run's reward."""
        return HeldoutPassAtK(
            name,
            self,
            reward=grpo.reward,
            tokenizer=tokenizer,
            chat=grpo.chat,
            max_prompt_tokens=max_prompt_tokens,
            temperature=float(grpo.temperature),
            max_new_tokens=grpo.max_new_tokens,
            prompt_field=grpo.prompt_field,
            id_field=grpo.id_field,
            pad_id=pad_id,
        )


# -- the estimator -----------------------------------------------------------------------------------------
def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k of one problem with `c` correct of `n` samples: `1 - C(n-c, k) / C(n, k)`, as
    the product `1 - prod_{i=n-c+1}^{n} (1 - k / i)` (Chen et al. 2021's numpy form)."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def mean_pass_at_k(samples: Sequence[int], correct: Sequence[int], k: int) -> tuple[float, float]:
    """The mean pass@k over problems and its standard error (sample std / sqrt(problems); 0 for one)."""
    values = [pass_at_k(int(n), int(c), k) for n, c in zip(samples, correct, strict=True)]
    if not values:
        raise ValueError("mean_pass_at_k: no problems")
    mean = math.fsum(values) / len(values)
    if len(values) == 1:
        return mean, 0.0
    var = math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1)
    return mean, math.sqrt(var / len(values))


# -- the evaluation ----------------------------------------------------------------------------------------
@dataclass
class HeldoutResult:
    """One evaluation's record: the scores and, per prompt row, its id, samples, correct count, completions
    and rewards (nan where the reward failed)."""

    scores: dict[str, float]
    row_ids: list[str]
    correct: list[int]
    samples: list[int]
    completions: list[list[str]]
    rewards: list[list[float]]
    prompts: list[str]
    skipped: list[tuple[str, int]]

    def sample_rows(self) -> list[dict[str, Any]]:
        """Each completion as a JSON-ready row: `{"id", "sample", "prompt", "completion", "reward"}`."""
        return [
            {"id": rid, "sample": j, "prompt": p, "completion": text, "reward": None if math.isnan(r) else r}
            for rid, p, texts, rs in zip(
                self.row_ids, self.prompts, self.completions, self.rewards, strict=True
            )
            for j, (text, r) in enumerate(zip(texts, rs, strict=True))
        ]


class HeldoutPassAtK:
    """`evaluator(model) -> {"eval/<name>/pass@k", ...}`: `PassAtK` of a policy (module docstring). `last`
    holds the latest evaluation's `HeldoutResult`.

    Args:
        name: the task's name in the metrics.
        task: what to sample and score.
        reward: `(prompt, completion, fields) -> float`.
        tokenizer: renders prompts and decodes completions.
        chat: render prompts with the chat template (as the RL run does).
        max_prompt_tokens: longer prompts are left out, counted and named.
        temperature, max_new_tokens: used where `task` leaves them None.
        prompt_field, id_field: the rows' prompt and id fields.
        pad_id: fills sampled rows after their end.
    """

    def __init__(
        self,
        name: str,
        task: PassAtK,
        *,
        reward: Any,
        tokenizer: Any,
        chat: bool = True,
        max_prompt_tokens: int,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        prompt_field: str = "prompt",
        id_field: str = "id",
        pad_id: int | None = None,
    ) -> None:
        from schooner.model import SamplingConfig

        from ._rl_batches import _prompt_text, encode_prompts

        self.name, self.task, self.reward, self.tokenizer = name, task, reward, tokenizer
        who = f"pass@k {name!r}"
        rows = read_heldout(os.fspath(task.prompts), prompt_field, id_field, what=who)
        if task.max_prompts is not None:
            rows = rows[: task.max_prompts]
        ids, stop_ids = encode_prompts(tokenizer, [r.prompt for r in rows], chat=chat, what=who)
        keep = [i for i, p in enumerate(ids) if 0 < len(p) <= max_prompt_tokens]
        kept = set(keep)
        self.skipped = [(rows[i].row_id, len(ids[i])) for i in range(len(rows)) if i not in kept]
        if self.skipped:
            named = ", ".join(f"{r} ({n} tokens)" for r, n in self.skipped[:5])
            logger.warning(
                f"{who}: left out {len(self.skipped)} of {len(rows)} prompts longer than the prompt "
                f"cap {max_prompt_tokens} or empty: {named}"
            )
        if not keep:
            raise ValueError(
                f"{who}: every held-out prompt of {task.prompts} is longer than the prompt cap "
                f"{max_prompt_tokens}; raise max_prompt_tokens (RL: seq_len - max_new_tokens)"
            )
        self.rows = [rows[i] for i in keep]
        self.ids = [ids[i] for i in keep]
        self.texts = [_prompt_text(r.prompt) for r in self.rows]
        self.cap = max_prompt_tokens
        self.pad_id = (
            pad_id if pad_id is not None else (tokenizer.pad_id if tokenizer.pad_id is not None else 0)
        )
        self.sampling = SamplingConfig(
            temperature=float(task.temperature if task.temperature is not None else temperature),
            top_p=task.top_p,
            top_k=task.top_k,
            n=task.samples,
            max_new_tokens=task.max_new_tokens if task.max_new_tokens is not None else max_new_tokens,
            stop_ids=tuple(stop_ids),
        )
        self.last: HeldoutResult | None = None

    @property
    def names(self) -> list[str]:
        return [self.name]

    def run(self, model: Any) -> HeldoutResult:
        """Sample, decode and score every kept prompt: the full record."""
        import jax

        from schooner.model import sample

        from ._rl_batches import score

        n, per = self.task.samples, self.task.prompts_per_batch
        stops = set(self.sampling.stop_ids)
        completions: list[list[str]] = []
        lengths: list[int] = []
        clipped = 0
        for c, start in enumerate(range(0, len(self.ids), per)):
            chunk = self.ids[start : start + per]
            real = len(chunk)
            chunk = chunk + [chunk[-1]] * (per - real)  # one shape per chunk: compiled once
            key = jax.random.fold_in(jax.random.key(self.task.seed), c)
            out = sample(model, chunk, self.sampling, key=key, pad_id=self.pad_id)
            for p in range(real):
                texts = []
                for r in range(p * n, (p + 1) * n):
                    m = int(out.mask[r].sum())
                    ids = out.tokens[r, :m].tolist()
                    lengths.append(m)
                    if out.stop_reasons[r] == "stop_id" and ids and ids[-1] in stops:
                        ids = ids[:-1]
                    else:
                        clipped += out.stop_reasons[r] == "length"
                    texts.append(self.tokenizer.decode(ids))
                completions.append(texts)
        flat = [(i, j) for i in range(len(completions)) for j in range(n)]
        rewards, errors = score(
            self.reward,
            [self.texts[i] for i, _ in flat],
            [completions[i][j] for i, j in flat],
            [self.rows[i].fields for i, _ in flat],
            [f"{self.rows[i].row_id}#{j}" for i, j in flat],
        )
        if errors:
            logger.warning(
                f"pass@k {self.name!r}: the reward failed on {len(errors)} sample(s) (counted incorrect), first "
                f"{errors[0]['row']}: {errors[0]['type']}: {errors[0]['message']}"
            )
        grid = rewards.reshape(len(completions), n)
        correct = [int(np.sum(np.nan_to_num(g, nan=-np.inf) >= self.task.threshold)) for g in grid]
        samples = [n] * len(correct)
        scores: dict[str, float] = {}
        for k in self.task.ks:
            scores[f"pass@{k}"], scores[f"pass@{k}_stderr"] = mean_pass_at_k(samples, correct, k)
        finite = rewards[np.isfinite(rewards)]
        scores["reward"] = float(finite.mean()) if finite.size else float("nan")
        scores["completion_length"] = float(np.mean(lengths))
        scores["clipped_ratio"] = clipped / len(lengths)
        scores["reward_errors"] = float(len(errors))
        scores["prompts"] = float(len(correct))
        self.last = HeldoutResult(
            scores=scores,
            row_ids=[r.row_id for r in self.rows],
            correct=correct,
            samples=samples,
            completions=completions,
            rewards=[[float(x) for x in g] for g in grid],
            prompts=list(self.texts),
            skipped=list(self.skipped),
        )
        return self.last

    def __call__(self, model: Any) -> dict[str, float]:
        return {f"eval/{self.name}/{k}": v for k, v in self.run(model).scores.items()}


def read_heldout(
    path: str, prompt_field: str = "prompt", id_field: str = "id", *, what: str = "pass@k"
) -> list[Any]:
    """The rows of a held-out prompts file, or of `heldout.jsonl` in a folder (errors start with `what`: the
    evaluation, e.g. "pass@k 'arithmetic'")."""
    from ._rl_batches import read_prompts

    return read_prompts(
        path, prompt_field, id_field, what=what, kind="held-out prompts", inner="heldout.jsonl"
    )


# -- on its own --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class PassAtKEvalConfig:
    """The config of the `pass_at_k_eval` step (and of `evaluate_pass_at_k`)."""

    checkpoint: Any
    """A run folder (its latest checkpoint, or `checkpoint_step`'s), a checkpoint folder, or a step
    (`pass_at_k_eval` pins a path to the checkpoint it resolves to when the step is declared)."""
    task: PassAtK
    reward: Any
    """`(prompt, completion, fields) -> float`."""
    tokenizer: Any
    name: str = "heldout"
    checkpoint_step: int | None = None
    chat: bool = True
    max_prompt_tokens: int = 128
    prompt_field: str = "prompt"
    id_field: str = "id"

    def __post_init__(self) -> None:
        from ._rl import RewardFunction

        object.__setattr__(self, "reward", RewardFunction(self.reward))
        if not isinstance(self.task, PassAtK):
            object.__setattr__(self, "task", PassAtK(prompts=self.task))


def evaluate_pass_at_k(config: PassAtKEvalConfig, output_path: str | None = None) -> dict[str, Any]:
    """Held-out pass@k of a checkpoint, sampled exactly as an RL run's evaluator samples it (the same task,
    seed and sampling give the same numbers as that run's evaluation of the same weights). With
    `output_path`: writes `results.json` (scores, per-row correct counts) and `samples.jsonl` (every
    completion with its reward)."""
    from schooner.cluster import storage
    from schooner.model import load_model
    from schooner.tokenize import load_tokenizer

    from ._init import resolve_source

    kind, folder = resolve_source(os.fspath(config.checkpoint), config.checkpoint_step)
    if kind != "schooner":
        raise ValueError(
            f"pass@k {config.name!r}: {folder} is a Hugging Face folder; give a schooner run or checkpoint"
        )
    model, _ = load_model(folder)
    tokenizer = load_tokenizer(os.fspath(config.tokenizer))
    evaluator = HeldoutPassAtK(
        config.name,
        config.task,
        reward=config.reward,
        tokenizer=tokenizer,
        chat=config.chat,
        max_prompt_tokens=config.max_prompt_tokens,
        prompt_field=config.prompt_field,
        id_field=config.id_field,
    )
    result = evaluator.run(model)
    out = {
        "checkpoint": folder,
        "task": config.name,
        "scores": {k: None if math.isnan(v) else v for k, v in result.scores.items()},
        "correct": dict(zip(result.row_ids, result.correct, strict=True)),
        "samples": result.samples[0] if result.samples else 0,
        "skipped": [{"row": r, "tokens": n} for r, n in result.skipped],
    }
    if output_path is not None:
        storage.makedirs(output_path)
        storage.write_json(storage.join(output_path, "results.json"), out)
        lines = "".join(storage.dumps_json(r, indent=None) + "\n" for r in result.sample_rows())
        storage.write_text(storage.join(output_path, "samples.jsonl"), lines)
    logger.info(
        f"pass@k {config.name!r} of {folder}: "
        + ", ".join(f"{k} {v:.4f}" for k, v in result.scores.items() if k.startswith("pass@"))
    )
    return out
