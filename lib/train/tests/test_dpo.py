"""DPO: the losses and their gradients against closed forms in numpy, log 2 at step 0 with the policy
equal to the reference, sequence log-probs against a numpy softmax of each sequence alone, and the steps
(tokenized_preferences -> reference_logprobs -> dpo) raising held-out reward accuracy on learnable pairs."""

from __future__ import annotations

import json
import math
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.train._dpo import dpo_loss, make_dpo_loss, score_pairs


def _np_log_sigmoid(x: np.ndarray) -> np.ndarray:
    return -np.logaddexp(0.0, -x)


def _np_sigmoid(x: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-x))


def _reference(kind: str, z: np.ndarray, beta: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-pair loss and its derivative in z, written out (TRL's formulas)."""
    if kind == "sigmoid":
        loss = -(1 - eps) * _np_log_sigmoid(beta * z) - eps * _np_log_sigmoid(-beta * z)
        dz = -(1 - eps) * beta * _np_sigmoid(-beta * z) + eps * beta * _np_sigmoid(beta * z)
    elif kind == "hinge":
        loss = np.maximum(0.0, 1 - beta * z)
        dz = np.where(1 - beta * z > 0, -beta, 0.0)
    else:
        loss = (z - 1 / (2 * beta)) ** 2
        dz = 2 * (z - 1 / (2 * beta))
    return loss, dz


@pytest.mark.parametrize(("kind", "eps"), [("sigmoid", 0.0), ("sigmoid", 0.2), ("hinge", 0.0), ("ipo", 0.0)])
def test_losses_and_gradients_match_the_closed_forms(kind: str, eps: float) -> None:
    jax.config.update("jax_enable_x64", True)
    try:
        rng = np.random.default_rng(0)
        pc, pr, rc, rr = (rng.normal(-20, 5, 64) for _ in range(4))
        beta = 0.3

        def mean_loss(pc, pr):
            losses, _, _ = dpo_loss(
                pc, pr, jnp.asarray(rc), jnp.asarray(rr), beta=beta, loss_type=kind, label_smoothing=eps
            )
            return jnp.mean(losses)

        loss, (g_pc, g_pr) = jax.value_and_grad(mean_loss, argnums=(0, 1))(jnp.asarray(pc), jnp.asarray(pr))
        z = (pc - rc) - (pr - rr)
        ref_loss, dz = _reference(kind, z, beta, eps)
        np.testing.assert_allclose(float(loss), ref_loss.mean(), rtol=1e-12)
        np.testing.assert_allclose(np.asarray(g_pc), dz / z.size, rtol=1e-10, atol=1e-15)
        np.testing.assert_allclose(np.asarray(g_pr), -dz / z.size, rtol=1e-10, atol=1e-15)
        _, chosen, rejected = dpo_loss(pc, pr, rc, rr, beta=beta, loss_type=kind)
        np.testing.assert_allclose(np.asarray(chosen), beta * (pc - rc))
        np.testing.assert_allclose(np.asarray(rejected), beta * (pr - rr))
    finally:
        jax.config.update("jax_enable_x64", False)


def _pairs(n: int, seed: int = 0) -> list[dict]:
    """Learnable preferences: the chosen answer is the sum, the rejected one hedges it."""
    from schooner.tokenize import preference_record

    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        a, b = (int(x) for x in rng.integers(0, 50, 2))
        out.append(
            preference_record(
                prompt=f"What is {a} + {b}? ",
                chosen=f"{a + b}.",
                rejected=f"maybe {a + b + 1}, I guess",
                source="arith",
                id=f"p{i}",
            )
        )
    return out


@pytest.fixture(scope="module")
def records(tmp_path_factory) -> str:
    from schooner.data import write_records

    folder = str(tmp_path_factory.mktemp("prefs") / "records")
    write_records(_pairs(240), folder, num_shards=2)
    return folder


@pytest.fixture(scope="module")
def pref_cache(records, data_dir, tmp_path_factory) -> str:
    from schooner.cluster import LocalClient
    from schooner.tokenize import build_cache

    out = str(tmp_path_factory.mktemp("prefcache") / "out")
    build_cache(
        records,
        out,
        f"{data_dir}/tokenizer.json",
        kind="preference",
        prepend_bos=True,
        validation_fraction=0.2,
        client=LocalClient(max_workers=1),
    )
    return out


def test_sequence_logps_and_log2_at_step_0(nano, pref_cache) -> None:
    import equinox as eqx

    from schooner.model import init
    from schooner.tokenize import PreferenceDataset

    model = init(nano(), key=jax.random.PRNGKey(0))
    ds = PreferenceDataset(f"{pref_cache}/train", seq_len=48)

    class FirstPairs:  # the cache's first 16 pairs: what the checks read, a tenth of the scoring time
        num_pairs = 16
        pairs = ds.pairs

    ref = score_pairs(model, FirstPairs(), batch_size=8)

    # Against a numpy softmax of each sequence alone, over its answer tokens.
    forward = eqx.filter_jit(lambda m, t: m(t))
    offsets = ds.cache.offsets()
    for pair in range(3):
        for j, role in enumerate(("chosen", "rejected")):
            d = 2 * pair + j
            toks = np.asarray(ds.cache.tokens(int(offsets[d]), int(offsets[d + 1])))
            mask = np.asarray(ds.cache.loss_mask(int(offsets[d]), int(offsets[d + 1])))
            padded = np.zeros((1, 48), np.int32)
            padded[0, : toks.size] = toks
            logits = np.asarray(forward(model, padded), np.float64)[0, : toks.size]
            logp = logits - logits.max(-1, keepdims=True)
            logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
            expected = sum(logp[t, toks[t + 1]] for t in range(toks.size - 1) if mask[t + 1])
            assert ref[f"{role}_logps"][pair] == pytest.approx(expected, rel=1e-5)
            assert ref[f"{role}_count"][pair] == mask[1:].sum() > 0

    # The policy is the reference: z = 0 everywhere, the sigmoid loss is log 2, rewards 0.
    from schooner.train._dpo_run import WithReference

    batch = WithReference(ds, ref).add(ds.pairs(np.arange(3, 11)))
    loss_fn = eqx.filter_jit(make_dpo_loss(beta=0.1, loss_type="sigmoid", label_smoothing=0.0))
    loss, (metrics, _) = loss_fn(model, batch, None)
    assert float(loss) == pytest.approx(math.log(2), abs=1e-6)
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins"):
        assert abs(float(metrics[k])) < 1e-5  # float32 rounding of the same sums, no more
    # Under the gradient, as in the train step, the policy's log-probs differ from the reference's forward
    # pass in the last bits. Told that the policy is the reference (a run's step 1 from it): exactly TRL's
    # 0 rewards, strict accuracy 0.0 and log 2, not that noise.
    objective = make_dpo_loss(beta=0.1, loss_type="sigmoid", label_smoothing=0.0)
    grad_fn = eqx.filter_jit(eqx.filter_value_and_grad(objective, has_aux=True))
    same = batch | {"ref_is_policy": np.ones(8, bool)}
    (loss, (metrics, _)), _ = grad_fn(model, same, None)
    assert float(loss) == np.float32(math.log(2))
    for k in ("rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies"):
        assert float(metrics[k]) == 0.0, k


@pytest.mark.slow
def test_dpo_steps_raise_held_out_reward_accuracy(nano, data_dir, records, tmp_path) -> None:
    from schooner.cluster import StepRunner, lower
    from schooner.model import init, save_model
    from schooner.tokenize.steps import tokenized_preferences
    from schooner.train import AdamConfig
    from schooner.train.steps import dpo, reference_logprobs

    init_folder = str(tmp_path / "init")
    save_model(init_folder, init(nano(), key=jax.random.PRNGKey(3)), nano())
    prefs = tokenized_preferences(
        "tokenized/prefs", source=records, tokenizer=f"{data_dir}/tokenizer.json", validation_fraction=0.2
    )
    ref = reference_logprobs("dpo/ref", init_folder, prefs, seq_len=48, resources=None)
    tuned = dpo(
        "checkpoints/dpo",
        initialize_from=init_folder,
        reference=ref,
        preferences=prefs,
        beta=0.1,
        batch_size=16,
        seq_len=48,
        num_train_steps=40,
        eval_every=40,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=4),
        resources=None,
    )
    result = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([lower(tuned)])
    summary = result[tuned].result["summary"]
    ev = summary["eval"]
    assert ev["eval/rewards/accuracies"] >= 0.9, ev
    assert ev["eval/loss"] < math.log(2) and ev["eval/rewards/margins"] > 0
    with open(f"{result[tuned].output_path}/metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    first = next(r for r in rows if "train/loss" in r)
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-5)  # step 1: the policy is the reference
    assert {
        "train/rewards/chosen",
        "train/rewards/rejected",
        "train/logps/chosen",
        "train/logps/rejected",
    } <= set(first)


def logged_first_loss(folder: str) -> float:
    with open(f"{folder}/metrics.jsonl") as f:
        return next(r["train/loss"] for r in map(json.loads, f) if "train/loss" in r)


@pytest.mark.slow
def test_a_live_reference_model_gives_the_cached_reference_steps_losses(
    nano, data_dir, records, tmp_path
) -> None:
    """`dpo(reference=<a model>)` scores the reference inside the train step; on the same data and start it
    logs what `dpo(reference=<reference_logprobs step>)` logs, to float32 rounding (rel 1e-5)."""
    from schooner.cluster import StepRunner, lower
    from schooner.model import init, save_model
    from schooner.tokenize.steps import tokenized_preferences
    from schooner.train import AdamConfig
    from schooner.train.steps import dpo, reference_logprobs

    # a reference that is not the policy's start, so the reference terms matter from step 1
    policy, reference = str(tmp_path / "policy"), str(tmp_path / "reference")
    save_model(policy, init(nano(), key=jax.random.PRNGKey(3)), nano())
    save_model(reference, init(nano(), key=jax.random.PRNGKey(4)), nano())
    prefs = tokenized_preferences(
        "tokenized/prefs", source=records, tokenizer=f"{data_dir}/tokenizer.json", validation_fraction=0.2
    )
    common = dict(
        initialize_from=policy, preferences=prefs, batch_size=16, seq_len=48, num_train_steps=3, eval_every=3,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1), resources=None,
    )  # fmt: skip
    cached = dpo(
        "dpo/cached",
        reference=reference_logprobs("dpo/ref", reference, prefs, seq_len=48, resources=None),
        **common,
    )
    live = dpo("dpo/live", reference=reference, checkpoint_every=1, **common)  # keeps steps 2 and 3
    # with gradient accumulation the reference is scored per microbatch too
    live_mb = dpo("dpo/live-mb", reference=reference, microbatches=2, **common)
    runner = StepRunner(prefix=str(tmp_path / "p"), quiet=True)
    result = runner.run([lower(cached), lower(live), lower(live_mb)])

    def logged(handle) -> list[dict]:
        with open(f"{result[handle].output_path}/metrics.jsonl") as f:
            rows = [json.loads(line) for line in f]
        return [
            {
                k: v
                for k, v in r.items()
                if k.startswith(("train/loss", "train/rewards", "train/logps", "eval/"))
            }
            for r in rows
        ]

    want = logged(cached)
    assert sum("train/loss" in r for r in want) == 3 and any("eval/loss" in r for r in want)
    for got in (logged(live), logged(live_mb)):
        assert len(got) == len(want)
        for w, g in zip(want, got, strict=True):
            assert set(w) == set(g)
            for k in w:
                assert g[k] == pytest.approx(w[k], rel=1e-5, abs=1e-6), k
    assert abs(want[0]["train/loss"] - math.log(2)) > 1e-3  # the reference is another model: not log 2

    # A run's handle as the live reference, at a checkpoint before its last: the policy starting from that
    # same checkpoint is its reference, so the first loss is log 2. reference_step with cached log-probs is
    # refused.
    one = dict(common, num_train_steps=1, eval_every=None, initialize_from=live, initialize_from_step=2)
    same = dpo("dpo/from-run", reference=live, reference_step=2, **one)
    bad = dpo("dpo/bad", reference=cached.config.objective.reference, reference_step=2, **one)
    result = runner.run([lower(same), lower(bad)], raise_on_failure=False)
    assert logged_first_loss(result[same].output_path) == pytest.approx(math.log(2), abs=1e-6)
    assert "leave reference_step out" in result[bad].error


def test_an_empty_validation_split_is_said_not_silently_skipped(data_dir, tmp_path, caplog) -> None:
    """SFT's default validation sets and DPO's held-out pairs skip an empty `validation/` cache with a warning
    naming it (no held-out metrics), instead of dropping it silently or failing on a cache of no pairs."""
    import logging

    from schooner.tokenize import load_tokenizer, write_cache
    from schooner.train._dpo_run import split_folder as _split_folder
    from schooner.train._evaluate import default_validation

    tok = load_tokenizer(f"{data_dir}/tokenizer.json")
    ids = tok.encode("def f(): pass")
    chat, prefs = tmp_path / "chat", tmp_path / "prefs"
    write_cache(str(chat / "train"), [ids], tok, loss_masks=[[0] + [1] * (len(ids) - 1)], kind="chat")
    write_cache(str(chat / "validation"), [], tok, loss_masks=[], kind="chat")
    write_cache(str(prefs / "validation"), [], tok, loss_masks=[], kind="preference")
    with caplog.at_level(logging.WARNING, logger="schooner.train"):
        assert default_validation({str(chat / "train"): 1.0}) == {}
        assert _split_folder(str(prefs), "validation") is None
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 2
    assert all("is empty" in m and "no held-out" in m and "validation_fraction" in m for m in said)
    assert str(chat / "validation") in said[0] and str(prefs / "validation") in said[1]


@pytest.mark.slow
@pytest.mark.parametrize("live", [False, True])
def test_first_step_rewards_are_exactly_zero_as_in_trl(nano, pref_cache, tmp_path, live: bool) -> None:
    """Starting from the reference, step 1's policy is the reference: TRL's rewards `beta * (policy - ref)`
    are 0 and its accuracy `(chosen > rejected).mean()` (strict) is 0.0 exactly, with a cached reference
    (scored in another program) and with a live one. Before, float noise between the two computations gave
    rewards of +-1e-6 and an accuracy like 0.375."""
    from schooner.model import init, save_model
    from schooner.train import Dpo, TrainerConfig
    from schooner.train.steps._dpo import ReferenceConfig, _run_reference
    from schooner.train.steps._lm import run_training

    start = str(tmp_path / "start")
    save_model(start, init(nano(), key=jax.random.PRNGKey(5)), nano())
    reference = start
    if not live:
        reference = str(tmp_path / "ref")
        os.makedirs(reference)
        _run_reference(ReferenceConfig(model=start, preferences=pref_cache, seq_len=48), reference)
    from schooner.train import AdamConfig

    config = TrainerConfig(
        model=nano(), initialize_from=start, datasets=[(pref_cache, 1.0)], validation={},
        objective=Dpo(reference=reference, beta=0.1, loss_type="sigmoid", label_smoothing=0.0),
        optimizer=AdamConfig(learning_rate=1e-3), batch_size=32, seq_len=48, num_train_steps=2,
    )  # fmt: skip
    out = str(tmp_path / "run")
    run_training(config, out)
    with open(f"{out}/metrics.jsonl") as f:
        row, second = [r for r in map(json.loads, f) if "train/loss" in r]
    # TRL's formulas in numpy on the same log-probs (the policy's are the reference's: one model)
    pc = pr = None
    if not live:
        ref = np.load(f"{reference}/train.npz")
        pc, pr = ref["chosen_logps"], ref["rejected_logps"]
    else:
        pc, pr = np.full(32, row["train/logps/chosen"]), np.full(32, row["train/logps/rejected"])
    rc, rr = pc, pr
    chosen, rejected = 0.1 * (pc - rc), 0.1 * (pr - rr)
    assert row["train/rewards/chosen"] == chosen.mean() == 0.0
    assert row["train/rewards/rejected"] == rejected.mean() == 0.0
    assert row["train/rewards/margins"] == 0.0
    assert row["train/rewards/accuracies"] == float((chosen > rejected).mean()) == 0.0
    assert row["train/loss"] == pytest.approx(math.log(2), abs=1e-7)
    assert second["train/rewards/chosen"] != 0.0  # step 2's policy has moved: its own rewards again


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(beta="0.1"), "dpo: beta must be a number > 0, got beta='0.1'"),
        (dict(beta=True), "dpo: beta must be a number > 0, got beta=True"),
        (
            dict(label_smoothing=None),
            "dpo: label_smoothing must be a number in [0, 0.5), got label_smoothing=None",
        ),
    ],
)
def test_dpo_numbers_of_the_wrong_type_are_named(kw: dict, message: str) -> None:
    """From a YAML file or a command line: not "'>' not supported between 'str' and 'int'"."""
    import re

    from schooner.train import Dpo

    args = dict(reference="y", beta=0.1, loss_type="sigmoid", label_smoothing=0.0)
    with pytest.raises(ValueError, match=re.escape(message)):
        Dpo(**{**args, **kw})


def test_a_preferences_folder_that_is_not_a_cache_is_named_by_its_field(nano, tmp_path) -> None:
    from schooner.train import Dpo, TrainerConfig, train

    empty = tmp_path / "prefs"
    empty.mkdir()
    config = TrainerConfig(model=nano(), datasets=[(str(empty), 1.0)], seq_len=32, num_train_steps=1,
                           objective=Dpo(reference=str(tmp_path / "ref")), validation={})  # fmt: skip
    with pytest.raises(ValueError, match=r"TrainerConfig\.datasets\[0\] \(dpo's preferences\): token cache"):
        train(config, str(tmp_path / "run"))
