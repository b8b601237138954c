"""The RL tutorial (`experiments/tutorials/rl_tiny_model.py`): a fast test of its wiring (the step graph, the
one held-out evaluation shared by the SFT measurement and the RL run, the worked solutions it trains on and the
reward-hacking audit it prints), and a slow one that runs it end to end through `schooner run` at a tiny size,
as a new user would, pretraining included."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "experiments" / "tutorials" / "rl_tiny_model.py"


def test_the_tutorial_wires_sft_heldout_pass_at_k_rl_and_the_export() -> None:
    from experiments.tutorials import rl_tiny_model as t
    from schooner.cluster import lower
    from schooner.eval.arithmetic import arithmetic_problems
    from schooner.eval.rewards import exact_answer

    names = [s.name for s in lower([t.sft_eval, t.rl_eval, t.hf])]
    for name in (
        "checkpoints/tutorial-nano",
        "data/arithmetic",
        "tokenized/arithmetic-chat",
        "checkpoints/tutorial-nano-arith-sft",
        "eval/tutorial-nano-arith-sft",
        "checkpoints/tutorial-nano-arith-rl",
        "eval/tutorial-nano-arith-rl",
        "hf/checkpoints/tutorial-nano-arith-rl",
    ):
        assert name in names
    assert names.index("checkpoints/tutorial-nano-arith-sft") < names.index(
        "checkpoints/tutorial-nano-arith-rl"
    )
    # the SFT model is measured exactly as the RL run measures itself: one PassAtK, one prompt cap
    rl = t.rl_model.config
    assert rl.validation == {"arithmetic": t.HELDOUT_EVAL} and rl.eval_every >= 1
    assert t.sft_eval.config.task == t.rl_eval.config.task == t.HELDOUT_EVAL
    assert t.sft_eval.config.max_prompt_tokens == rl.seq_len - rl.objective.max_new_tokens
    assert rl.objective.max_new_tokens == t.HELDOUT_EVAL.max_new_tokens
    assert rl.objective.temperature == t.HELDOUT_EVAL.temperature
    assert rl.initialize_from is t.sft_model or getattr(rl.initialize_from, "key", None) == t.sft_model.key
    # the worked solutions keep every step and the answer, and earn the reward
    reward = exact_answer()
    for row in arithmetic_problems("train", 50, seed=0, min_steps=1, max_steps=2, max_value=20):
        text = t.worked_solution(row["solution"])
        assert len(text.splitlines()) == row["steps"] + 1 and reward(row["prompt"], text, row) == 1.0
        assert t.audit([{"completion": text}]) == dict.fromkeys(t.audit([]), 0.0)
    hacks = [
        {"completion": "#### 7"},
        {"completion": "3 + 4 = 8\n#### 7"},
        {"completion": "3 + 4 = 7\n#### 7 #### 7"},
    ]
    assert t.audit(hacks) == pytest.approx(
        {"answer_only": 1 / 3, "false_step": 1 / 3, "several_answers": 1 / 3, "no_answer": 0.0}
    )
    written = t.steps_written([*hacks, {"completion": "1 + 1 = 2\n2 + 1 = 3\n3 - 1 = 2\n2 * 2 = 4\n#### 4"}])
    assert written == {"0": 0.25, "1": 0.5, "2": 0.0, "3": 0.0, "4+": 0.25}
    # the cooler SFT evaluation differs from the shared one in its temperature alone
    assert t.sft_low_t_eval.config.task == dataclasses.replace(t.HELDOUT_EVAL, temperature=t.LOW_TEMPERATURE)
    # the summary's paired difference (per problem, then over problems) and strict pass@1 (worked_answer)
    before = [
        {"id": i, "reward": r}
        for i, r in (("a", 0.0), ("a", 1.0), ("b", 0.0), ("b", 0.0), ("c", 1.0), ("c", 1.0))
    ]
    after = [
        {"id": i, "reward": r}
        for i, r in (("a", 1.0), ("a", 1.0), ("b", 1.0), ("b", 0.0), ("c", 1.0), ("c", 1.0))
    ]
    diff, se = t.paired_difference(after, before)  # per problem +0.5, +0.5, 0: mean 1/3, s.d. 0.2887
    assert diff == pytest.approx(1 / 3) and se == pytest.approx((1 / 12) ** 0.5 / 3**0.5)
    worked = [{"id": "a", "prompt": "", "completion": c} for c in ("3 + 4 = 7\n#### 7", "3 + 4 = 8\n#### 7")]
    assert t.strict_pass_at_1(worked, {"a": 7}) == (0.5, 0.0)
    # the summary rescores every sample by exact_answer and by worked_answer, whatever reward the evaluation
    # used (the stored "reward" here is 0 throughout), and pairs the two models per problem
    answers = {"a": 7, "b": 3}
    texts = {
        "a": ("3 + 4 = 7\n#### 7", "3 + 4 = 8\n#### 7", "#### 6"),
        "b": ("1 + 2 = 3\n#### 3", "#### 3", "#### 2"),
    }
    rows = [{"id": i, "prompt": "", "completion": c, "reward": 0.0} for i, cs in texts.items() for c in cs]
    answered, strictly = t.correct_by(exact_answer(), answers), t.strictly_correct(answers)
    assert t.pass_at_k_of(rows, answered, 1) == pytest.approx((2 / 3, 0.0))
    assert t.pass_at_k_of(rows, strictly, 1) == pytest.approx((1 / 3, 0.0))
    assert t.pass_at_k_of(rows, answered, 3) == (1.0, 0.0)
    wrong = [dict(r, completion="#### 0") for r in rows]
    assert t.paired_difference(rows, wrong, answered) == pytest.approx((2 / 3, 0.0))
    assert t.paired_difference(rows, wrong) == (0.0, 0.0)  # by the stored reward
    with pytest.raises(ValueError, match="different problems"):
        t.paired_difference(rows, rows[:3], answered)
    # RL is compared with SFT at the same cooler temperature too
    assert t.rl_low_t_eval.config.task == t.sft_low_t_eval.config.task
    assert names_of([t.rl_low_t_eval])[-1] == "eval/tutorial-nano-arith-rl-cool"


def names_of(steps: list) -> list[str]:
    from schooner.cluster import lower

    return [s.name for s in lower(steps)]


def test_the_tutorial_s_task_and_reward_knobs(monkeypatch: pytest.MonkeyPatch) -> None:
    """SCHOONER_RL_MAX_VALUE=9 and SCHOONER_RL_REWARD=worked: the amounts-up-to-9 task, and worked_answer as
    the RL reward and the held-out evaluations' (so the SFT model's score is the RL curve's step 0)."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    false_step = ("", "3 + 4 = 8\n#### 7", {"answer": 7})
    assert t.REWARD(*false_step) == 1.0 and t.TASK.max_value == 10  # the defaults: exact_answer, up to 10
    try:
        monkeypatch.setenv("SCHOONER_RL_MAX_VALUE", "9")
        monkeypatch.setenv("SCHOONER_RL_REWARD", "worked")
        importlib.reload(t)
        assert t.TASK.max_value == 9 and t.HELDOUT_EVAL.max_prompts == t.TASK.heldout_size == 150
        for reward in (t.rl_model.config.objective.reward, t.sft_eval.config.reward, t.rl_eval.config.reward):
            assert reward(*false_step) == 0.0 and reward("", "3 + 4 = 7\n#### 7", {"answer": 7}) == 1.0
        monkeypatch.setenv("SCHOONER_RL_REWARD", "answer")
        with pytest.raises(ValueError, match="SCHOONER_RL_REWARD must be one of"):
            importlib.reload(t)
        monkeypatch.setenv("SCHOONER_RL_REWARD", "Worked")  # any case
        importlib.reload(t)
        assert t.REWARD(*false_step) == 0.0
        for value in ("ten", "0", "-5"):  # a bad number names its knob
            monkeypatch.setenv("SCHOONER_RL_STEPS", value)
            with pytest.raises(ValueError, match=f"SCHOONER_RL_STEPS must be a positive int, got '{value}'"):
                importlib.reload(t)
        monkeypatch.delenv("SCHOONER_RL_STEPS")
    finally:
        monkeypatch.delenv("SCHOONER_RL_MAX_VALUE")
        monkeypatch.delenv("SCHOONER_RL_REWARD")
        importlib.reload(t)
    assert t.REWARD(*false_step) == 1.0


def test_the_dynamic_rounds_knob_turns_on_dynamic_sampling_and_keeps_the_sft_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCHOONER_RL_DYNAMIC_ROUNDS=4: the RL step with dynamic sampling (up to 4 rounds), a new RL key, the same
    SFT step; unset, the RL step is the default's (the option off, its key as before the option existed)."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    default = t.rl_model
    assert not default.config.objective.dynamic_sampling
    try:
        monkeypatch.setenv("SCHOONER_RL_DYNAMIC_ROUNDS", "4")
        importlib.reload(t)
        objective = t.rl_model.config.objective
        assert objective.dynamic_sampling and objective.max_sampling_rounds == 4
        assert t.rl_model.key != default.key and t.sft_model.key == default.config.initialize_from.key
        for value in ("four", "-1", "1"):
            monkeypatch.setenv("SCHOONER_RL_DYNAMIC_ROUNDS", value)
            with pytest.raises(
                ValueError, match=f"SCHOONER_RL_DYNAMIC_ROUNDS must be 0 .off. or .*got '{value}'"
            ):
                importlib.reload(t)
    finally:
        monkeypatch.delenv("SCHOONER_RL_DYNAMIC_ROUNDS")
        importlib.reload(t)
    assert t.rl_model.key == default.key


def test_the_rl_seed_knob_moves_only_the_rl_step_and_keeps_the_heldout_samples(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCHOONER_RL_SEED=1: the RL run at seed 1 (its prompt order and rollout sampling), a new RL key; the SFT
    step, its evaluations and the held-out samples' seed unchanged, so RL at either seed is paired with the same
    SFT numbers. Unset or 0: the RL step's key as before the knob existed. A bad value is named."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    default = t.rl_model
    sft_eval_key = t.sft_low_t_eval.key
    assert default.config.seed == 0
    try:
        monkeypatch.setenv("SCHOONER_RL_SEED", "0")
        importlib.reload(t)
        assert t.rl_model.key == default.key
        monkeypatch.setenv("SCHOONER_RL_SEED", "1")
        importlib.reload(t)
        assert t.rl_model.config.seed == 1 and t.rl_model.key != default.key
        assert t.sft_model.key == default.config.initialize_from.key
        assert t.sft_low_t_eval.key == sft_eval_key
        assert t.rl_model.config.validation["arithmetic"].seed == 0
        for value in ("one", "-1", "1.5", "4294967296"):
            monkeypatch.setenv("SCHOONER_RL_SEED", value)
            with pytest.raises(
                ValueError, match=rf"SCHOONER_RL_SEED must be an int in \[0, 2\*\*32\), got '{value}'"
            ):
                importlib.reload(t)
    finally:
        monkeypatch.delenv("SCHOONER_RL_SEED", raising=False)
        importlib.reload(t)
    assert t.rl_model.key == default.key


def test_the_eval_every_knob_sets_the_rl_runs_heldout_cadence_and_keeps_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCHOONER_RL_EVAL_EVERY=40: the RL run evaluates held-out pass@k every 40 steps (a new RL key, the same SFT
    step); unset, every RL_STEPS // 2 steps, the RL step's key as before the knob existed."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    default = t.rl_model
    assert default.config.eval_every == t.RL_STEPS // 2 == 20
    try:
        monkeypatch.setenv("SCHOONER_RL_EVAL_EVERY", "20")  # the default's value: the very same step
        importlib.reload(t)
        assert t.rl_model.key == default.key
        monkeypatch.setenv("SCHOONER_RL_STEPS", "200")
        monkeypatch.setenv("SCHOONER_RL_EVAL_EVERY", "40")
        importlib.reload(t)
        assert t.rl_model.config.eval_every == 40 and t.rl_model.key != default.key
        assert t.sft_model.key == default.config.initialize_from.key
        monkeypatch.delenv("SCHOONER_RL_EVAL_EVERY")
        importlib.reload(t)
        assert t.rl_model.config.eval_every == 100  # halfway
        monkeypatch.setenv("SCHOONER_RL_EVAL_EVERY", "0")
        with pytest.raises(ValueError, match="SCHOONER_RL_EVAL_EVERY must be a positive int, got '0'"):
            importlib.reload(t)
    finally:
        monkeypatch.delenv("SCHOONER_RL_EVAL_EVERY", raising=False)
        monkeypatch.delenv("SCHOONER_RL_STEPS", raising=False)
        importlib.reload(t)
    assert t.rl_model.key == default.key


def test_the_curves_label_the_heldout_series_by_temperature_and_reward(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`curves.png`'s held-out series carries its temperature and reward in a legend (with `worked_answer` as
    the reward the curve is strict pass@1), read back from the drawn figure."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    run, sft = tmp_path / "run", tmp_path / "sft"
    run.mkdir(), sft.mkdir()
    rows = [{"step": 1, "rollout/reward": 0.2}, {"step": 2, "rollout/reward": 0.3}]
    rows.append({"step": 2, "eval/arithmetic/pass@1": 0.25, "eval/arithmetic/pass@1_stderr": 0.02})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (sft / "results.json").write_text(json.dumps({"scores": {"pass@1": 0.2, "pass@1_stderr": 0.02}}))
    out = tmp_path / "plot"
    out.mkdir()
    drawn = t.rl_curves(t.CurvesConfig(str(run), str(sft)), str(out))
    assert drawn["legend"] == ["T = 1, exact_answer"] and (out / "curves.png").stat().st_size > 0
    assert drawn["axis"] == ("held-out pass@1 (± 1 s.e.)", "pass@1")
    assert drawn["heldout_pass@1"] == [(0, 0.2, 0.02), (2, 0.25, 0.02)]
    try:
        monkeypatch.setenv("SCHOONER_RL_REWARD", "worked")
        importlib.reload(t)
        drawn = t.rl_curves(t.CurvesConfig(str(run), str(sft)), str(out))
        assert drawn["legend"] == ["T = 1, worked_answer (strict)"]
        # the curve is strict pass@1 (this doc's "pass@1" is exact_answer's): its title and axis say so
        assert drawn["axis"] == ("held-out strict pass@1 (± 1 s.e.)", "strict pass@1")
    finally:
        monkeypatch.delenv("SCHOONER_RL_REWARD")
        importlib.reload(t)


def test_the_heldout_steps_knob_keeps_sft_and_moves_rl_and_heldout_to_three_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SCHOONER_RL_HELDOUT_STEPS=3: the very same SFT step (1- and 2-step problems), RL prompts and held-out
    problems from a 3-step task, and caps that fit the prompts and worked solutions into the 128-token context."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t

    default_sft, default_rl = t.sft_model.key, t.rl_model.key
    assert t.rl_task is t.task and t.MAX_PROMPT_TOKENS + t.MAX_NEW_TOKENS == 128
    try:
        monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", "3")
        importlib.reload(t)
        assert t.sft_model.key == default_sft and t.rl_model.key != default_rl  # SFT unchanged, and cached
        assert (t.RL_TASK.min_steps, t.RL_TASK.max_steps, t.TASK.max_steps) == (3, 3, 2)
        assert t.rl_model.config.datasets == ((t.rl_task, 1.0),) and "data/arithmetic-3step" in names_of(
            [t.rl_model]
        )
        assert t.HELDOUT_EVAL.prompts == t.rl_task / "heldout.jsonl" and t.HELDOUT_EVAL.max_prompts == 200
        assert t.sft_eval.config.task == t.rl_eval.config.task == t.HELDOUT_EVAL
        rl = t.rl_model.config
        assert t.sft_eval.config.max_prompt_tokens == rl.seq_len - rl.objective.max_new_tokens == 96
        assert rl.seq_len == 128 and t.HELDOUT_EVAL.max_new_tokens == rl.objective.max_new_tokens == 32
        for value in ("4", "1"):
            monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", value)
            with pytest.raises(ValueError, match=f"SCHOONER_RL_HELDOUT_STEPS must be 2 or 3, got {value}"):
                importlib.reload(t)
        monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", "three")
        with pytest.raises(ValueError, match="SCHOONER_RL_HELDOUT_STEPS must be a positive int, got 'three'"):
            importlib.reload(t)
    finally:
        monkeypatch.delenv("SCHOONER_RL_HELDOUT_STEPS")
        importlib.reload(t)
    assert t.rl_model.key == default_rl


def test_three_step_prompts_and_worked_solutions_fit_the_caps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCHOONER_RL_HELDOUT_STEPS=3's caps (96 prompt + 32 new tokens = the 128-token context) hold every RL
    prompt and held-out problem, rendered as the RL run renders them, and every worked solution with room for
    the end of turn; the 2-step caps (88 + 40) would leave out the longest prompts."""
    import importlib

    from experiments.tokenizer_defs import default_tokenizer
    from experiments.tutorials import rl_tiny_model as t
    from schooner.cluster import StepRunner, lower
    from schooner.eval.arithmetic import arithmetic_task
    from schooner.eval.rewards import exact_answer
    from schooner.tokenize import load_tokenizer
    from schooner.train import HeldoutPassAtK, PassAtK

    try:
        monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", "3")
        importlib.reload(t)
        task, caps = t.RL_TASK, (t.MAX_PROMPT_TOKENS, t.MAX_NEW_TOKENS)
    finally:
        monkeypatch.delenv("SCHOONER_RL_HELDOUT_STEPS")
        importlib.reload(t)
    assert caps == (96, 32)
    # the tutorial's tokenizer, trained as its step trains it (a few seconds)
    result = StepRunner(prefix=str(tmp_path), quiet=True).run([lower(default_tokenizer)])
    tokenizer = load_tokenizer(result[default_tokenizer].output_path)
    paths = arithmetic_task(str(tmp_path / "task"), task)  # the tutorial's data/arithmetic-3step
    longest_prompt = longest_solution = 0
    for split, path in paths.items():
        # the prompts rendered as the RL run and its held-out evaluation render them (none left out at 128)
        rendered = HeldoutPassAtK(
            split, PassAtK(path), reward=exact_answer(), tokenizer=tokenizer, max_prompt_tokens=128
        )
        assert len(rendered.ids) == {"train": 800, "heldout": 200}[split] and not rendered.skipped
        longest_prompt = max(longest_prompt, *map(len, rendered.ids))
        with open(path, encoding="utf-8") as f:
            solutions = [t.worked_solution(json.loads(line)["solution"]) for line in f]
        longest_solution = max(longest_solution, *(len(tokenizer.encode(s)) for s in solutions))
    assert 88 < longest_prompt <= caps[0] and longest_solution + 2 <= caps[1], (
        longest_prompt,
        longest_solution,
    )


def test_the_sft_3step_share_knob_adds_3step_rows_apart_from_the_rl_prompts_and_heldout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SCHOONER_RL_SFT_3STEP_SHARE=0.05 with SCHOONER_RL_HELDOUT_STEPS=3: 5% of the SFT rows are 3-step worked
    solutions whose keys are neither a held-out problem's nor an RL prompt's; bad values name the knob; the
    default leaves the SFT data (and so the SFT step) as it was."""
    import importlib

    from experiments.tutorials import rl_tiny_model as t
    from schooner.data import read_shards
    from schooner.eval.arithmetic import arithmetic_task

    default_chats, default_sft = t.chats.key, t.sft_model.key
    assert t.SFT_3STEP_ROWS == 0 and t.chats.name == "data/arithmetic-chats"
    try:
        monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", "3")
        importlib.reload(t)
        assert t.sft_model.key == default_sft  # share 0: the SFT step unchanged
        monkeypatch.setenv("SCHOONER_RL_SFT_3STEP_SHARE", "0.05")
        importlib.reload(t)
        assert t.chats.name == "data/arithmetic-chats-3step" and t.sft_model.key != default_sft
        assert t.chats.config.three_step_rows == t.SFT_3STEP_ROWS == 42  # 42 of 842 rows: 4.99%
        # the step's data, written as the tutorial writes it
        task = arithmetic_task(str(tmp_path / "task"), t.TASK)
        rl = arithmetic_task(str(tmp_path / "rl"), t.RL_TASK)
        out = tmp_path / "chats"
        config = dataclasses.replace(t.chats.config, task=str(tmp_path / "task"))
        summary = t.arithmetic_chats_mixed(config, str(out))
        assert summary["records"] == 842 and summary["steps"]["3"] == 42
        records = list(read_shards(str(out), text_field=None))
        three = [r for r in records if r["id"].startswith("arith-train3-")]
        assert len(records) == 842 and len(three) / len(records) == pytest.approx(0.05, abs=0.001)
        # every 3-step row answered with 3 worked steps, none a held-out problem's or an RL prompt's key
        rows = t.three_step_sft_rows(t.RL_TASK, 42)
        assert [r["id"] for r in rows] == sorted(r["id"] for r in three)
        assert all(r["steps"] == 3 and len(t.worked_solution(r["solution"]).splitlines()) == 4 for r in rows)
        keys = {r["key"] for r in rows}
        for split in ("train", "heldout"):
            with open(rl[split]) as f:
                assert not keys & {json.loads(line)["key"] for line in f}, split
        with open(task["train"]) as f:
            assert len(list(f)) == 800  # all the 1- and 2-step rows stay
        for value in ("0.5", "-0.1", "five"):
            monkeypatch.setenv("SCHOONER_RL_SFT_3STEP_SHARE", value)
            with pytest.raises(
                ValueError,
                match=f"SCHOONER_RL_SFT_3STEP_SHARE must be a number in \\[0, 0.5\\), got '{value}'",
            ):
                importlib.reload(t)
        monkeypatch.setenv("SCHOONER_RL_SFT_3STEP_SHARE", "0.05")
        monkeypatch.setenv("SCHOONER_RL_HELDOUT_STEPS", "2")
        with pytest.raises(
            ValueError, match="SCHOONER_RL_SFT_3STEP_SHARE=0.05 needs SCHOONER_RL_HELDOUT_STEPS=3"
        ):
            importlib.reload(t)
    finally:
        monkeypatch.delenv("SCHOONER_RL_HELDOUT_STEPS", raising=False)
        monkeypatch.delenv("SCHOONER_RL_SFT_3STEP_SHARE", raising=False)
        importlib.reload(t)
    assert t.chats.key == default_chats and t.sft_model.key == default_sft


@pytest.mark.slow  # pretraining, SFT, two evaluations and RL, all tiny: minutes on 2 cores
def test_the_tutorial_runs_end_to_end_at_a_tiny_size(tmp_path: Path) -> None:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", env.get("XLA_FLAGS", "")).strip()
    env["XLA_FLAGS"] = flags
    env.pop("SCHOONER_CLUSTER", None)
    env.update(
        SCHOONER_TUTORIAL_STEPS="8", SCHOONER_RL_SFT_STEPS="8", SCHOONER_RL_STEPS="2", SCHOONER_RL_HELDOUT="5",
        SCHOONER_PREFIX=str(tmp_path), COLUMNS="200",
    )  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "schooner.cluster.cli", "run", str(TUTORIAL)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert proc.returncode == 0, f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}"
    out = proc.stdout
    assert re.search(r"SFT\s+pass@1 \d\.\d+ ± \d\.\d+\s+pass@8", out), out[-3000:]
    assert re.search(r"SFT \+ RL\s+pass@1 \d\.\d+ ± \d\.\d+", out) and "Audit of every" in out
    assert re.search(r"Steps written per completion .*\n\s+SFT\s+0: \d\.\d+   1: ", out), out[-3000:]
    for t in ("1", "0.3"):  # the comparison at the same temperature, plain and strict
        assert re.search(
            rf"temperature {re.escape(t)} +pass@1 [-+]\d\.\d+ ± \d\.\d+ .*strict pass@1 [-+]", out
        )
    assert re.search(r"RL - SFT, paired over the same problems: pass@1 [-+]\d\.\d+ ± \d\.\d+", out), out[
        -3000:
    ]
    (run,) = tmp_path.glob("checkpoints/tutorial-nano-arith-rl-*")
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/arithmetic/pass@1" in r]
    assert evals and evals[-1]["step"] == 2 and 0 <= evals[-1]["eval/arithmetic/pass@1"] <= 1
    assert (run / "reward.png").read_bytes().startswith(b"\x89PNG")
    (rl_eval,) = (p for p in tmp_path.glob("eval/tutorial-nano-arith-rl-*") if "-rl-cool-" not in p.name)
    assert len(list(tmp_path.glob("eval/tutorial-nano-arith-rl-cool-*"))) == 1
    scores = json.loads((rl_eval / "results.json").read_text())["scores"]
    # the standalone measurement of the final checkpoint is the run's own final evaluation
    assert scores["pass@1"] == pytest.approx(evals[-1]["eval/arithmetic/pass@1"], abs=1e-12)
    (hf,) = tmp_path.glob("hf/checkpoints/tutorial-nano-arith-rl-*")
    assert (hf / "config.json").exists() and (hf / "tokenizer.json").exists()
