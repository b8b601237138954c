"""Held-out pass@k (`schooner.train.PassAtK`, `HeldoutPassAtK`, `evaluate_pass_at_k`, the `pass_at_k_eval`
step): the scores equal numpy's unbiased estimator (and `schooner.eval.passk`'s) on the recorded correctness;
the same seed gives the same completions and numbers, another seed others; an RL run logs the evaluation every
`eval_every` steps, and the standalone evaluation of its final checkpoint gives the run's final numbers."""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import numpy as np
import pytest

from schooner.train import (
    AdamConfig,
    CheckpointConfig,
    Grpo,
    HeldoutPassAtK,
    PassAtK,
    PassAtKEvalConfig,
    TrackerConfig,
    TrainerConfig,
    evaluate_pass_at_k,
    read_metrics,
    train,
)
from schooner.train._rl_eval import pass_at_k

# RL tasks, rewards and evaluate_lm come from schooner-eval, a test-time extra of this package (the exact guard
# runs train's tests without it): skip cleanly there.
pytest.importorskip("schooner.eval")

CAP, NEW = 112, 12


def even_length(prompt: str, completion: str, fields) -> float:
    """A reward a random model earns about half the time: varied correct counts per prompt."""
    return float(len(completion) % 2 == 0)


@pytest.fixture(scope="module")
def task(arithmetic_folder) -> str:
    return arithmetic_folder(train_size=24, heldout_size=10, min_steps=1, max_steps=1, max_value=12)


@pytest.fixture(scope="module")
def start(nano, saved_model) -> str:
    return saved_model(nano(), jax.random.PRNGKey(2))


@pytest.fixture(scope="module")
def model_and_tok(start, data_dir):
    from schooner.model import load_model
    from schooner.tokenize import load_tokenizer

    model, _ = load_model(start)
    return model, load_tokenizer(f"{data_dir}/tokenizer.json")


def _evaluator(task, tok, **kw) -> HeldoutPassAtK:
    spec = PassAtK(
        f"{task}/heldout.jsonl",
        **({"samples": 6, "ks": (1, 3, 6), "max_prompts": 6, "prompts_per_batch": 6} | kw),
    )
    return HeldoutPassAtK(
        "arith", spec, reward=even_length, tokenizer=tok, max_prompt_tokens=CAP, max_new_tokens=NEW
    )


def test_pass_at_k_equals_numpy_on_the_recorded_correctness(task, model_and_tok) -> None:
    from schooner.eval.passk import mean_pass_at_k

    model, tok = model_and_tok
    ev = _evaluator(task, tok)
    metrics = ev(model)
    res = ev.last
    n = 6
    rewards = np.asarray(res.rewards)
    assert rewards.shape == (len(res.row_ids), n) and np.isfinite(rewards).all()
    correct = (rewards >= 1.0).sum(axis=1)
    assert res.correct == correct.tolist() and 0 < correct.sum() < correct.size * n  # not trivial
    # the recorded rewards are the reward of the recorded completions
    assert [[even_length("", c, {}) for c in row] for row in res.completions] == res.rewards
    for k in (1, 3, 6):
        per = np.array(
            [1.0 if n - c < k else 1.0 - np.prod(1.0 - k / np.arange(n - c + 1, n + 1)) for c in correct]
        )
        assert metrics[f"eval/arith/pass@{k}"] == pytest.approx(per.mean(), abs=1e-12)
        se = per.std(ddof=1) / math.sqrt(len(per))
        assert metrics[f"eval/arith/pass@{k}_stderr"] == pytest.approx(se, abs=1e-12)
        ref, ref_se = mean_pass_at_k([(n, int(c)) for c in correct], k)
        assert (metrics[f"eval/arith/pass@{k}"], metrics[f"eval/arith/pass@{k}_stderr"]) == pytest.approx(
            (ref, ref_se)
        )
    assert metrics["eval/arith/pass@1"] == pytest.approx(rewards.mean())  # pass@1 is the mean correctness
    assert metrics["eval/arith/prompts"] == len(res.row_ids) == 6
    assert 1 <= metrics["eval/arith/completion_length"] <= NEW
    # the exact estimator: C(n-c, k) / C(n, k)
    assert pass_at_k(6, 2, 3) == pytest.approx(1 - math.comb(4, 3) / math.comb(6, 3), abs=1e-15)


def test_the_same_seed_gives_the_same_numbers_and_another_seed_others(task, model_and_tok) -> None:
    model, tok = model_and_tok
    a, b = _evaluator(task, tok), _evaluator(task, tok)
    first, again = a(model), b(model)
    assert first == again and a.last.completions == b.last.completions
    other = _evaluator(task, tok, seed=1)
    other(model)
    assert other.last.completions != a.last.completions


def test_rl_train_wires_heldout_evaluations_sampled_as_the_rollouts(data_dir, task, start) -> None:
    from schooner.tokenize import load_tokenizer
    from schooner.train.steps import rl_train

    spec = PassAtK(f"{task}/heldout.jsonl", samples=4, ks=(1, 4))
    handle = rl_train(
        "rl/x", checkpoint=start, prompts=task, reward=even_length, tokenizer=f"{data_dir}/tokenizer.json",
        num_train_steps=4, max_prompt_tokens=CAP, max_new_tokens=NEW, temperature=0.7,
        heldout={"arith": spec, "plain": f"{task}/heldout.jsonl"}, eval_every=2, resources=None,
    )  # fmt: skip
    config = handle.config
    assert config.eval_every == 2  # a plain path is the default PassAtK of those prompts
    assert config.validation == {"arith": spec, "plain": PassAtK(f"{task}/heldout.jsonl")}
    tok = load_tokenizer(f"{data_dir}/tokenizer.json")
    evs = [
        v.evaluator(k, config.objective, tok, max_prompt_tokens=CAP, pad_id=0)
        for k, v in config.validation.items()
    ]
    assert [e.name for e in evs] == ["arith", "plain"]
    for e in evs:  # the run's sampling where the task leaves it open
        assert e.sampling.temperature == 0.7 and e.sampling.max_new_tokens == NEW
        assert e.sampling.stop_ids and e.cap == CAP and len(e.rows) + len(e.skipped) == 10
    assert evs[0].sampling.n == 4 and evs[1].task == PassAtK(f"{task}/heldout.jsonl")


def test_an_rl_validation_entry_that_is_no_evaluation_is_an_error_naming_it(data_dir, task, start, tmp_path):
    from schooner.model import read_config

    config = TrainerConfig(
        model=read_config(start), datasets={task: 1.0}, seq_len=CAP + NEW,
        objective=Grpo(reward=even_length, max_new_tokens=NEW), batch_size=8, num_train_steps=1,
        validation={"arith": f"{task}/heldout.jsonl"}, tokenizer=f"{data_dir}/tokenizer.json",
        initialize_from=start,
    )  # fmt: skip
    with pytest.raises(
        ValueError, match=r"validation\['arith'\] must be a held-out evaluation such as .*PassAtK"
    ):
        config.objective.setup(config, str(tmp_path / "run"))


def _heldout_error(prompts, tokenizer=None, *, chat: bool = True) -> str:
    with pytest.raises((ValueError, FileNotFoundError)) as info:
        HeldoutPassAtK(
            "arith",
            PassAtK(prompts),
            reward=even_length,
            tokenizer=tokenizer,
            chat=chat,
            max_prompt_tokens=CAP,
        )
    return str(info.value)


def test_a_bad_heldout_file_is_named_by_the_evaluation_not_grpo(tmp_path, model_and_tok) -> None:
    """A held-out pass@k (an RL run's or `pass_at_k_eval`'s, no GRPO involved in the second) names the
    evaluation and the file: the messages came from the RL prompts reader, prefixed "grpo:"."""
    bad = {
        "missing": tmp_path / "nowhere.jsonl",
        "folder": tmp_path,  # no heldout.jsonl in it
        "not_object": tmp_path / "array.jsonl",
        "no_prompt": tmp_path / "question.jsonl",
        "empty": tmp_path / "empty.jsonl",
    }
    bad["not_object"].write_text('{"prompt": "1+1?"}\n[2]\n')
    bad["no_prompt"].write_text('{"question": "1+1?"}\n')
    bad["empty"].write_text("\n")
    messages = {kind: _heldout_error(path) for kind, path in bad.items()}
    chat = tmp_path / "chat.jsonl"
    chat.write_text(json.dumps({"prompt": [{"role": "user", "content": "1+1?"}]}) + "\n")
    messages["chat_false"] = _heldout_error(chat, model_and_tok[1], chat=False)
    for kind, message in messages.items():
        assert message.startswith("pass@k 'arith': "), (kind, message)
        assert "grpo" not in message.lower(), (kind, message)
    assert str(bad["missing"]) in messages["missing"] and "held-out prompts" in messages["missing"]
    assert "heldout.jsonl" in messages["folder"] and "train.jsonl" not in messages["folder"]
    assert f"{bad['not_object']}:2 is an array" in messages["not_object"]
    assert f"{bad['no_prompt']}:1 has no 'prompt' field" in messages["no_prompt"]
    assert f"{bad['empty']} holds no rows" in messages["empty"]
    assert "chat=False takes text prompts" in messages["chat_false"]


def test_pass_at_k_refuses_what_cannot_be_estimated(task) -> None:
    with pytest.raises(ValueError, match=r"pass@8 needs at least that many samples.*samples=4"):
        PassAtK(task, samples=4, ks=(1, 8))
    with pytest.raises(ValueError, match=r"temperature must be a number > 0"):
        PassAtK(task, temperature=0)
    with pytest.raises(ValueError, match=r"need 0 <= c <= n"):
        pass_at_k(3, 4, 1)
    for seed in (2**32, -1):  # JAX's keys hold 32 bits: 2**32 sampled as seed 0 did
        with pytest.raises(
            ValueError, match=rf"PassAtK: seed must be an int in \[0, 2\*\*32\), got seed={seed}"
        ):
            PassAtK(task, seed=seed)


@pytest.mark.slow  # an RL run with two evaluations and a standalone one: ~1-2 min on 2 busy cores
def test_an_rl_run_logs_heldout_pass_at_k_and_a_checkpoint_scores_the_same_alone(
    data_dir, task, start, tmp_path
) -> None:
    from schooner.model import read_config

    spec = PassAtK(f"{task}/heldout.jsonl", samples=4, ks=(1, 4), max_prompts=6, prompts_per_batch=3, seed=7)
    out = str(tmp_path / "run")
    config = TrainerConfig(
        model=read_config(start),
        datasets={task: 1.0},
        seq_len=CAP + NEW,
        objective=Grpo(reward=even_length, num_generations=4, max_new_tokens=NEW),
        batch_size=8,
        num_train_steps=2,
        validation={"arith": spec},
        eval_every=1,
        seed=3,
        optimizer=AdamConfig(learning_rate=3e-3, weight_decay=0.0, warmup=0, schedule="constant"),
        tokenizer=f"{data_dir}/tokenizer.json",
        initialize_from=start,
        output_path=out,
        checkpoint=CheckpointConfig(every=None),
        trackers=TrackerConfig(loss_plot=False, log_every=1),
    )
    summary = train(config)
    logged = {}
    for row in read_metrics(out):
        if "eval/arith/pass@1" in row:
            logged[row["step"]] = row
    assert sorted(logged) == [1, 2]
    for row in logged.values():
        assert 0 <= row["eval/arith/pass@1"] <= row["eval/arith/pass@4"] <= 1
        assert row["eval/arith/pass@1_stderr"] >= 0 and row["eval/arith/prompts"] == 6
    alone = evaluate_pass_at_k(
        PassAtKEvalConfig(
            checkpoint=out,
            task=dataclasses.replace(spec, max_new_tokens=NEW),
            reward=even_length,
            tokenizer=f"{data_dir}/tokenizer.json",
            name="arith",
            max_prompt_tokens=CAP,
        ),
        str(tmp_path / "alone"),
    )
    assert alone["checkpoint"] == summary["checkpoint"]
    final = {k.removeprefix("eval/arith/"): v for k, v in logged[2].items() if k.startswith("eval/arith/")}
    assert alone["scores"] == pytest.approx(final, abs=1e-12)
    with open(tmp_path / "alone" / "results.json") as f:
        assert json.load(f)["scores"]["pass@1"] == final["pass@1"]
    samples = [json.loads(line) for line in (tmp_path / "alone" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 * 4 and {s["reward"] for s in samples} <= {0.0, 1.0}
