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
import logging
import numbers
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from schooner.cluster import added_field, runtime_field

from ._config import TrainerConfig, check_run
from ._lm import resolve_model_config
from ._objective import Objective, Setup
from ._rl_batches import RolloutBatches, RolloutMetrics, encode_prompts, read_prompts
from ._rl_objective import ADVANTAGES, SCALES, PolicyLossConfig
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
        if r == 1 and self.dynamic_sampling:
            raise ValueError(
                "grpo: max_sampling_rounds=1 samples no round beyond the first, so the batch is the one plain GRPO "
                "makes: use max_sampling_rounds >= 2 (it counts the first round), or dynamic_sampling=False"
            )
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
