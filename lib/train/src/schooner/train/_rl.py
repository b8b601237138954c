"""GRPO-family RL from verifiable rewards as a configuration of the trainer: the `Grpo` objective config (the
`objective` of an `rl_train` step's `TrainerConfig`) and what its `setup` builds.

One trainer step is one optimizer update. Every `num_iterations` steps the batch source (`RolloutBatches`,
`on_policy`) takes the policy the trainer hands it and makes a new rollout batch:

1. **prompts**: `P = batch_size / num_generations` rows of the task, a pure function of `(seed, group)`
   (an epoch-wise permutation of the rows, `group = step // num_iterations`);
2. **rollouts**: `G = num_generations` samples of each (`_rl_rollout.rollout`, the RNG `fold_in(key(seed),
   group)`), prompts rendered as SFT renders chats (`chat_prompts`), stopping at EOS / end of turn;
3. **scoring**: the user's reward callable `(prompt, completion, fields) -> float` on the host, per row; a row
   whose reward raises (or returns no finite number) gets `nan` (left out of its group's statistics, advantage
   0, as TRL does) and is counted (`rollout/reward_errors/<ExceptionType>`) and named in the log and in
   `reward_errors.jsonl`: never a crash of the run;
4. **advantages**: `group_advantages(rewards (P, G), advantage)` of the batch's groups (those step 5 keeps);
5. **dynamic sampling** (`dynamic_sampling=True`, DAPO): groups whose rewards all agree give no gradient, so
   steps 1-3 repeat in rounds (round `r >= 1`: P prompts of a second prompt stream, `round_prompt_indices`,
   and the RNG `fold_in(fold_in(key, ROUND_TAG), r)`, both pure functions of `(seed, group, round)`) until P
   groups with signal are found or `max_sampling_rounds` rounds are spent; the batch is the first P of them
   (`select_groups`), any shortfall filled with groups without signal, counted and logged. Round 0 is the
   batch made without the option;
6. the batch `tokens, mask, old_logprobs, advantages` then serves `num_iterations` updates with
   `policy_loss` (and, with `loss.beta > 0`, the k3 KL to a frozen copy of the starting weights, scored in
   the train step as `dpo`'s live reference is).

**Exact resume.** The prompts and the rollout RNG are pure functions of `(seed, group)`, the rollouts are
sampled from the checkpointed weights, and the rewards are deterministic functions of the text, so a run
resumed at a group's first step samples and scores what the uninterrupted run did. A run resumed in the middle
of a group (`num_iterations > 1`) reads the group's rollouts back from `rollouts/group-NNNNNN.npz` (written
when made, removed once a checkpoint lies past them): the weights they were sampled from are gone.

**Metrics.** The loss's (under `train/`): `loss`, `policy_loss`, `kl` (beta > 0), `clip_ratio/*`, `entropy`
(mean over completion tokens of the policy's next-token entropy). The rollouts' (logged by a hook at each
step that made rollouts): `rollout/reward`, `rollout/reward_std`, `rollout/frac_reward_zero_std`,
`rollout/completions/{mean,min,max}_length`, `rollout/completions/clipped_ratio`, `rollout/reward_errors`
(and per exception type), `rollout/skipped_prompts` (rows over the prompt cap, left out at setup and named
in the log and `run.json`); with dynamic sampling (the reward, length and clipping metrics above are then the
batch's; reward errors and skipped prompts count every round's)
`rollout/dynamic/rounds`, `sampled_groups`, `kept_groups` (with signal), `shortfall`, and `first_round/` and
`sampled/` `reward` and `frac_reward_zero_std` (round 0's groups: what plain GRPO would train on; all
rounds'); and at every step `time/rollout`, `time/scoring`, `time/update` (seconds).
`reward.png` draws the reward curve at the end, beside `loss.png`.

**Held-out pass@k.** Each `TrainerConfig.validation` (and `evals`) entry is a held-out evaluation (a
`_rl_eval.PassAtK`, which builds its evaluator with `spec.evaluator(name, grpo, tokenizer, ...)`): every
`eval_every` steps and at the end, `eval/<name>/pass@k` and its standard error.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import math
import numbers
import os
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np

from schooner.cluster import added_field, runtime_field

from ._config import TrainerConfig, check_run
from ._lm import resolve_model_config
from ._objective import Objective, Setup, StepInfo
from ._rl_objective import ADVANTAGES, SCALES, PolicyLossConfig
from ._rl_sampling import has_signal, round_prompt_indices, select_groups
from ._rl_workers import RolloutPool

logger = logging.getLogger("schooner.train")


class RewardFunction:
    """A user's reward callable `(prompt, completion, fields) -> float` in a config: named by its module and
    qualified name in `run.json` (so a resumed run compares equal), keyed by its code in a step's version.

    Example:
        >>> def length(prompt, completion, fields): return float(len(completion))
        >>> str(RewardFunction(length)).endswith(":length")
        True
    """

    __slots__ = ("fn",)
    fn: Callable[[str, str, Mapping[str, Any]], float]

    def __init__(self, fn: Callable[[str, str, Mapping[str, Any]], float]) -> None:
        if isinstance(fn, RewardFunction):
            fn = fn.fn
        if not callable(fn):
            raise TypeError(
                f"reward must be a callable (prompt, completion, fields) -> float, got {type(fn).__name__}"
            )
        self.fn = fn

    @property
    def name(self) -> str:
        fn = self.fn
        qual = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        return f"{getattr(fn, '__module__', None) or type(fn).__module__}:{qual}"

    def __call__(self, prompt: str, completion: str, fields: Mapping[str, Any]) -> float:
        return self.fn(prompt, completion, fields)

    def __str__(self) -> str:
        return self.name

    __repr__ = __str__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RewardFunction) and other.fn == self.fn

    def __hash__(self) -> int:
        return hash(self.name)

    def __schooner_canonical__(self) -> Any:
        return self.fn  # a step's key: the function's name and its code's fingerprint

    def __reduce__(self) -> Any:
        return (RewardFunction, (self.fn,))


@dataclass(frozen=True)
class Grpo:
    """GRPO-family RL (GRPO, Dr. GRPO, RLOO advantages; TRL's clipped loss and aggregations) on prompts with
    a verifiable reward: the `objective` of a `TrainerConfig` whose `datasets` is one prompts file (JSON
    lines, each with `prompt_field` and the task's fields) or a folder holding `train.jsonl`. The policy
    starts from `TrainerConfig.initialize_from`; `TrainerConfig.tokenizer` renders and decodes; `batch_size`
    counts completions (prompts x `num_generations`); `seq_len` = prompt cap + `max_new_tokens`.

    Example:
        >>> def reward(prompt, completion, fields): return float(completion.strip() == str(fields["answer"]))
        >>> Grpo(reward=reward, num_generations=4, max_new_tokens=32).advantage
        'grpo'
    """

    reward: Any
    """The reward callable `(prompt, completion, fields) -> float` (e.g. `schooner.eval.rewards
    .exact_answer()`): configuration passed in by the experiment, never imported by the trainer."""
    num_generations: int = 4
    """G: completions per prompt."""
    max_new_tokens: int = 64
    """The completion cap (tokens, stop id included)."""
    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    num_iterations: int = 1
    """Policy updates (trainer steps) per rollout batch (TRL's `num_iterations`); the importance ratio is
    against the sampler's log-probs."""
    advantage: str = "grpo"
    """"grpo", "dr_grpo" or "rloo" (`_rl_objective.group_advantages`)."""
    scale_rewards: str = "group"
    """GRPO's std: "group", "batch" or "none"."""
    loss: PolicyLossConfig = field(default_factory=PolicyLossConfig)
    """Clipping, KL weight `beta` (> 0: a frozen reference, the starting weights), aggregation."""
    chat: bool = True
    """Render prompts with the tokenizer's chat template (as SFT does); False: the raw text (BOS first when
    the tokenizer has one), stopping at EOS."""
    prompt_field: str = "prompt"
    """The field holding the prompt: a user message's text, or a conversation `[{"role", "content"}]`."""
    id_field: str = "id"
    """The field naming a row in errors and logs (absent: `<file>:<line>`)."""
    required_fields: tuple[str, ...] | None = None
    """Fields every prompt row must hold, checked when the run starts (a row without one is an error naming
    the file, line and field); None: those the reward declares in its `fields` attribute (`exact_answer()`'s
    answer field, `code_tests()`'s tests field), none for a plain function."""
    rollout_chunk: int | None = None
    """Prompts per sampling call (`_rl_workers`): a group is sampled in chunks of this many prompts, each
    with its own key; None: one call for the group (with `rollout_workers`, the group split evenly over
    them). The rollouts depend on it, never on `rollout_workers`."""
    rollout_workers: int = runtime_field(0)
    """N > 0: the chunks are sampled by N workers of the current cluster client (Ray tasks on Ray, local
    processes otherwise), from weights the trainer publishes each rollout group (`_rl_workers`); 0: in the
    trainer. Same seed and `rollout_chunk`: the same rollouts and weights for every N (runtime-only)."""
    dynamic_sampling: bool = added_field(False)
    """DAPO's dynamic sampling: a rollout batch keeps only groups whose rewards differ (at least two finite
    rewards, not all equal: the groups that give a gradient), sampling further rounds of P prompts (each
    round its own prompts and RNG, pure functions of `(seed, group, round)`) until P such groups are found
    or `max_sampling_rounds` rounds are spent; a shortfall is filled with groups without signal (advantage 0,
    as plain GRPO trains on them), counted (`rollout/dynamic/shortfall`) and logged. Round 0 is the batch
    plain GRPO samples. False (the default): one round, every group kept (and the step's key as before the
    option existed)."""
    max_sampling_rounds: int = added_field(3)
    """With `dynamic_sampling`: the most rounds of P prompts sampled for one rollout batch, the first
    included (verl's `max_num_gen_batches`)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "reward", RewardFunction(self.reward))
        if self.required_fields is not None:
            if isinstance(self.required_fields, str) or not all(
                isinstance(f, str) for f in self.required_fields
            ):
                raise TypeError(
                    f"grpo: required_fields must be a tuple of field names, got {self.required_fields!r}"
                )
            object.__setattr__(self, "required_fields", tuple(self.required_fields))
        for f in ("num_generations", "max_new_tokens", "num_iterations"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"grpo: {f} must be an int >= 1, got {f}={v!r}")
        w = self.rollout_workers
        if isinstance(w, bool) or not isinstance(w, int) or w < 0:
            raise ValueError(f"grpo: rollout_workers must be an int >= 0, got rollout_workers={w!r}")
        if not isinstance(self.dynamic_sampling, bool):
            raise ValueError(f"grpo: dynamic_sampling must be True or False, got {self.dynamic_sampling!r}")
        r = self.max_sampling_rounds
        if isinstance(r, bool) or not isinstance(r, int) or r < 1:
            raise ValueError(f"grpo: max_sampling_rounds must be an int >= 1, got max_sampling_rounds={r!r}")
        if r != 3 and not self.dynamic_sampling:
            raise ValueError(
                f"grpo: max_sampling_rounds={r} applies only with dynamic sampling: set dynamic_sampling=True, "
                "or leave max_sampling_rounds at its default"
            )
        c = self.rollout_chunk
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise ValueError(f"grpo: rollout_chunk must be an int >= 1, got rollout_chunk={c!r}")
        if self.num_generations < 2:
            raise ValueError(
                f"grpo: num_generations must be >= 2, got num_generations={self.num_generations}: advantages "
                "are relative to the other samples of the same prompt, so with one sample every advantage is 0 "
                "and the run learns nothing"
            )
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, numbers.Real) or not t > 0:
            raise ValueError(f"grpo: temperature must be a number > 0, got temperature={t!r}")
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"grpo: advantage must be one of {ADVANTAGES}, got advantage={self.advantage!r}")
        if self.scale_rewards not in SCALES:
            raise ValueError(f"grpo: scale_rewards must be one of {SCALES}, got {self.scale_rewards!r}")
        if not isinstance(self.loss, PolicyLossConfig):
            raise TypeError(f"grpo: loss must be a PolicyLossConfig, got {type(self.loss).__name__}")
        if self.loss.aggregation == "dr_grpo" and self.loss.max_completion_length != self.max_new_tokens:
            raise ValueError(
                "grpo: the dr_grpo aggregation divides by the completion cap: set loss.max_completion_length="
                f"{self.max_new_tokens} (max_new_tokens), got {self.loss.max_completion_length!r}"
            )

    def reward_fields(self) -> tuple[str, ...]:
        """The fields each row must hold: `required_fields`, else the reward's declared `fields`."""
        if self.required_fields is not None:
            return self.required_fields
        declared = getattr(self.reward.fn, "fields", ())
        return tuple(declared) if isinstance(declared, tuple | list) else ()

    def sampling(self, stop_ids: Sequence[int]) -> Any:
        from schooner.model import SamplingConfig

        return SamplingConfig(
            temperature=float(self.temperature),
            top_p=self.top_p,
            top_k=self.top_k,
            n=self.num_generations,
            max_new_tokens=self.max_new_tokens,
            stop_ids=tuple(stop_ids),
        )

    def setup(self, config: TrainerConfig, output_path: str) -> Setup:
        """The prompts, the rollout batch source, the policy loss (with the frozen reference when beta > 0)
        and the hook that logs the rollouts' metrics."""
        import jax

        from schooner.tokenize import load_tokenizer

        from ._init import load_initial_model

        if len(config.datasets) != 1:
            raise ValueError(f"grpo: datasets must be one prompts file or folder, got {len(config.datasets)}")
        if config.initialize_from is None:
            raise ValueError(
                "grpo: give TrainerConfig.initialize_from (the SFT or pretrained policy to start from)"
            )
        if config.tokenizer is None:
            raise ValueError(
                "grpo: give TrainerConfig.tokenizer (it renders prompts and decodes completions)"
            )
        cap = config.seq_len - self.max_new_tokens
        if cap < 1:
            raise ValueError(
                f"grpo: seq_len={config.seq_len} leaves no room for a prompt after max_new_tokens="
                f"{self.max_new_tokens}; seq_len is the prompt cap plus max_new_tokens"
            )
        for size in config.batch_sizes:
            if size % self.num_generations:
                raise ValueError(
                    f"grpo: batch_size {size} counts completions: it must be a multiple of num_generations="
                    f"{self.num_generations} (prompts x samples)"
                )
        tokenizer = load_tokenizer(os.fspath(config.tokenizer))
        model_config = resolve_model_config(config, tokenizer.vocab_size)
        check_run(dataclasses.replace(config, model=model_config), num_devices=len(jax.devices()))
        rows = read_prompts(
            os.fspath(config.datasets[0][0]),
            self.prompt_field,
            self.id_field,
            required=self.reward_fields(),
            reward=str(self.reward),
        )
        prompts, stop_ids = encode_prompts(tokenizer, [r.prompt for r in rows], chat=self.chat)
        kept = [i for i, p in enumerate(prompts) if 0 < len(p) <= cap]
        skipped = [(rows[i].row_id, len(prompts[i])) for i in range(len(rows)) if i not in set(kept)]
        if skipped:
            named = ", ".join(f"{r} ({n} tokens)" for r, n in skipped[:5])
            logger.warning(
                f"grpo: left out {len(skipped)} of {len(rows)} prompts longer than the prompt cap {cap} "
                f"(seq_len - max_new_tokens) or empty: {named}{' ...' if len(skipped) > 5 else ''}"
            )
        if not kept:
            raise ValueError(
                f"grpo: every prompt is longer than the prompt cap {cap} (seq_len {config.seq_len} - "
                f"max_new_tokens {self.max_new_tokens}), e.g. row {skipped[0][0]} ({skipped[0][1]} tokens); "
                "raise seq_len"
            )
        pad_id = tokenizer.pad_id if tokenizer.pad_id is not None else 0
        reference = None
        if self.loss.beta > 0:
            from ._trainer import place_params

            reference, _ = load_initial_model(
                os.fspath(config.initialize_from), model_config, config.initialize_from_step
            )
            reference, _ = place_params(reference, config)
            logger.info("grpo: KL to a frozen copy of the starting weights, scored in the train step")
        data = RolloutBatches(
            self,
            rows=[rows[i] for i in kept],
            prompts=[prompts[i] for i in kept],
            tokenizer=tokenizer,
            sampling=self.sampling(stop_ids),
            seed=config.seed,
            max_prompt_tokens=cap,
            pad_id=pad_id,
            root=output_path,
            skipped=len(skipped),
            pool=RolloutPool(self.rollout_workers, output_path, model_config),
        )
        evaluators = []  # held-out evaluations (`_rl_eval.PassAtK`): each builds its own evaluator
        for name, spec in {**(config.validation or {}), **(config.evals or {})}.items():
            if not callable(getattr(spec, "evaluator", None)):
                raise ValueError(
                    f"grpo: validation[{name!r}] must be a held-out evaluation such as schooner.train.PassAtK("
                    f"prompts, samples=8, ks=(1, 8)), got {spec!r}"
                )
            evaluators.append(
                spec.evaluator(str(name), self, tokenizer, max_prompt_tokens=cap, pad_id=pad_id)
            )
        return Setup(
            model_config=model_config,
            evaluators=evaluators,
            objective=Objective(
                loss=make_grpo_loss(self),
                frozen=reference,
                prepare=make_reference_logprobs(self.temperature) if reference is not None else None,
                constrain_batch=False,  # [B] advantages beside the [B, T] arrays
            ),
            data=data,
            hooks=[RolloutMetrics(data, config.steps, name=config.name)],
            metadata={
                "tokenizer_fingerprint": tokenizer.fingerprint,
                "tokenizer_special_ids": {
                    k: v
                    for k, v in (("bos_id", tokenizer.bos_id), ("eos_id", tokenizer.eos_id))
                    if v is not None
                },
                "rl": {
                    "prompts": len(kept),
                    "skipped_prompts": [{"row": r, "tokens": n} for r, n in skipped],
                    "stop_ids": list(stop_ids),
                    "reward": str(self.reward),
                },
            },
        )


# -- prompts ---------------------------------------------------------------------------------------------
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
) -> list[PromptRow]:
    """The rows of a prompts file (JSON lines), or of `train.jsonl` in a folder; each must hold the
    `required` fields (those `reward` reads).

    Raises:
        FileNotFoundError: no such file (or a folder without `train.jsonl`).
        ValueError: a line that is not a JSON object, or lacks the prompt field or a required one, naming the
            file and line; a file with no rows.
    """
    from schooner.cluster import storage

    if storage.isdir(path):
        path = storage.join(path, "train.jsonl")
    if not storage.exists(path):
        raise FileNotFoundError(
            f"grpo: no prompts file {path!r}; give a JSON-lines file (or a folder with train.jsonl) whose rows "
            f"hold {prompt_field!r} and the task's fields"
        )
    rows: list[PromptRow] = []
    for n, line in enumerate(storage.read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path}:{n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"grpo: {where} is not valid JSON ({e}); one JSON object per line") from None
        if not isinstance(row, dict):
            raise ValueError(f"grpo: {where} is a {type(row).__name__}, not a JSON object")
        prompt = row.get(prompt_field)
        if not (isinstance(prompt, str) and prompt) and not (isinstance(prompt, list) and prompt):
            raise ValueError(
                f"grpo: {where} has no {prompt_field!r} field holding text or a conversation (got "
                f"{prompt!r}; its fields: {sorted(row)}); set prompt_field= to the field that holds it"
            )
        row_id = str(row.get(id_field, where))
        missing = [f for f in required if f not in row]
        if missing:
            raise ValueError(
                f"grpo: {where} (row {row_id}) has no {missing[0]!r} field, which {reward} reads (the row's "
                f"fields: {sorted(row)}); add it to every row, or point the reward at the field that holds the "
                f"answer (e.g. exact_answer(field=...)), or set Grpo(required_fields=...) to what it reads"
            )
        rows.append(PromptRow(row_id, prompt, row))
    if not rows:
        raise ValueError(
            f"grpo: {path} holds no rows: give one JSON object per line, each with {prompt_field!r} and the "
            "fields the reward reads"
        )
    return rows


def encode_prompts(tokenizer: Any, prompts: Sequence[Any], *, chat: bool) -> tuple[list[list[int]], tuple]:
    """Token ids of each prompt and the stop ids: chat-rendered (`chat_prompts`), or the raw text."""
    from ._rl_rollout import chat_prompts

    if chat:
        return chat_prompts(tokenizer, prompts)
    bos = [tokenizer.bos_id] if tokenizer.bos_id is not None else []
    ids = []
    for p in prompts:
        if not isinstance(p, str):
            raise ValueError(f"grpo: chat=False takes text prompts, got a {type(p).__name__}: {p!r:.80}")
        ids.append(bos + tokenizer.encode(p))
    stops = () if tokenizer.eos_id is None else (int(tokenizer.eos_id),)
    return ids, stops


# -- the loss --------------------------------------------------------------------------------------------
def make_grpo_loss(cfg: Grpo) -> Any:
    """`loss(model, batch, key) -> (loss, (metrics, None))` for the train step: `policy_loss` of the batch's
    completions. The microbatch weight (`token_count`) makes the accumulated gradient the whole batch's:
    completion tokens for the token-level aggregations (`dapo`, `bnpo`), sequences for `grpo` and `dr_grpo`.
    With one update per rollout batch the old log-probs are the policy's own (TRL: ratio exactly 1)."""
    import jax
    import jax.numpy as jnp

    from ._rl_objective import entropy_from_logits, policy_loss, token_logprobs

    temperature, loss_config = float(cfg.temperature), cfg.loss
    per_sequence = loss_config.aggregation in ("grpo", "dr_grpo")
    own_old = cfg.num_iterations == 1

    def loss(model: Any, b: dict, key: Any) -> tuple[Any, tuple]:
        del key
        tokens = b["tokens"]
        logits = model(tokens)[:, :-1].astype(jnp.float32)
        logp = token_logprobs(logits, tokens[:, 1:], temperature=temperature)
        mask = b["mask"].astype(jnp.float32)
        old = jax.lax.stop_gradient(logp) if own_old else b["old_logprobs"]
        value, metrics = policy_loss(
            logp, old, b["advantages"], mask, loss_config, ref_logprobs=b.get("ref_logprobs")
        )
        ent = entropy_from_logits(jax.lax.stop_gradient(logits), temperature=temperature)
        metrics["entropy"] = (ent * mask).sum() / jnp.maximum(mask.sum(), 1.0)
        weight = jnp.asarray(tokens.shape[0], jnp.float32) if per_sequence else mask.sum()
        return value, ({"loss": value, "token_count": weight, **metrics}, None)

    return loss


def make_reference_logprobs(temperature: float) -> Any:
    """`prepare(reference, batch) -> {"ref_logprobs"}`: the frozen reference's log-probs of the batch's
    tokens (the same temperature as the policy's), inside the train step, no gradient."""
    import jax
    import jax.numpy as jnp

    from ._rl_objective import token_logprobs

    def prepare(reference: Any, b: dict) -> dict:
        tokens = b["tokens"]
        logits = reference(tokens)[:, :-1].astype(jnp.float32)
        ref = token_logprobs(logits, tokens[:, 1:], temperature=float(temperature))
        return {"ref_logprobs": jax.lax.stop_gradient(ref)}

    return prepare


# -- the batch source ------------------------------------------------------------------------------------
class RolloutBatches:
    """The trainer's on-policy batch source: rollouts, rewards and advantages every `num_iterations` steps
    (module docstring); the host metrics of each step wait in `metrics` for the `RolloutMetrics` hook."""

    on_policy = True

    def __init__(
        self,
        cfg: Grpo,
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
        batches, rewards, signal, errors = [], [], [], []
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
