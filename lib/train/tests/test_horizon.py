"""The token-horizon recipe: its formulas against numpy written from issue 38's text, their monotonic
properties, Delphi's published shapes, the selection beside today's recipe, the reference search's pick of
eta0 (a parabola in log lr, against numpy.polyfit) and bad input named by field."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from schooner.cluster import StepRunner
from schooner.train import AdamConfig
from schooner.train._adamh import AdamHConfig
from schooner.train.scaling import (
    HorizonFamily,
    HorizonRecipe,
    HorizonRule,
    LearningRateRule,
    ScalingRecipe,
    pick_learning_rate,
    read_reference,
    recipe,
    reference_search,
)

ETA0, ADAM0, B0, T0, W0 = 0.02, 5e-3, 4096, 2e6, 128
RULE = HorizonRule(
    base_learning_rate=ETA0,
    base_adam_learning_rate=ADAM0,
    base_batch_tokens=B0,
    base_horizon=T0,
    base_width=W0,
    base_beta2=0.99,
    base_eps=1e-8,
    max_learning_rate=10.0,
    max_adam_learning_rate=10.0,
)  # fmt: skip  (caps out of the way: the formulas alone)
GRID = [(b, t, w) for b in (1024, 4096, 32768) for t in (2e5, 2e6, 6e7) for w in (64, 128, 512)]


def test_formulas_match_the_issue_written_in_numpy() -> None:
    """lr = eta0 sqrt(B/B0) (T0/T)^0.3; the Adam group's the same times W0/W; beta2 = beta2_0^(B/B0);
    eps = eps0 sqrt(B0/B) (T/T0)^0.3."""
    b, t, w = (np.array(x, np.float64) for x in zip(*GRID, strict=True))
    want_lr = ETA0 * np.sqrt(b / B0) * (T0 / t) ** 0.3
    want_adam = ADAM0 * np.sqrt(b / B0) * (T0 / t) ** 0.3 * (W0 / w)
    want_beta2 = np.clip(0.99 ** (b / B0), 0.9, 0.9999)
    want_eps = 1e-8 * np.sqrt(B0 / b) * (t / T0) ** 0.3
    got = np.array(
        [
            [
                RULE.learning_rate(batch_tokens=bb, tokens=tt),
                RULE.adam_learning_rate(width=ww, batch_tokens=bb, tokens=tt),
                RULE.beta2(batch_tokens=bb, tokens=tt),
                RULE.eps(batch_tokens=bb, tokens=tt),
            ]
            for bb, tt, ww in GRID
        ]
    )
    for col, want in enumerate((want_lr, want_adam, want_beta2, want_eps)):
        np.testing.assert_allclose(got[:, col], want, rtol=1e-12)
    # At the reference itself every quantity is its base value.
    assert RULE.learning_rate(batch_tokens=B0, tokens=T0) == pytest.approx(ETA0)
    assert RULE.adam_learning_rate(width=W0, batch_tokens=B0, tokens=T0) == pytest.approx(ADAM0)


def test_beta2_keeps_its_half_life_in_tokens_until_the_clip() -> None:
    half_life = lambda b: math.log(0.5) / math.log(RULE.beta2(batch_tokens=b, tokens=T0)) * b  # noqa: E731
    for b in (512, 2048, 8192):
        assert half_life(b) == pytest.approx(half_life(B0), rel=1e-9)
    assert RULE.beta2(batch_tokens=B0 * 100, tokens=T0) == 0.9  # 0.99^100 = 0.37: clipped
    assert RULE.beta2(batch_tokens=1, tokens=T0) == 0.9999  # 0.99^(1/4096): clipped
    follows = HorizonRule(beta2_horizon_exponent=1.0)  # the optional T rule: half-life a fixed share of T
    h = lambda t: math.log(0.5) / math.log(follows.beta2(batch_tokens=B0, tokens=t))  # noqa: E731
    assert h(4 * T0) == pytest.approx(4 * h(T0), rel=1e-9)


@pytest.mark.parametrize("rule", [RULE, HorizonRule()], ids=["uncapped", "default-caps"])
@pytest.mark.parametrize("width", [64, 256])
def test_longer_horizons_get_smaller_rates_and_bigger_batches_larger(rule: HorizonRule, width: int) -> None:
    """Strictly without the caps; never the wrong way with them (a capped rate stays at its cap)."""
    down = (lambda x, y: x > y) if rule is RULE else (lambda x, y: x >= y)  # noqa: E731
    up = lambda x, y: down(y, x)  # noqa: E731
    tokens = [1e5 * 3**k for k in range(8)]
    for b in (1024, 4096, 16384):
        lrs = [rule.learning_rate(batch_tokens=b, tokens=t) for t in tokens]
        adam = [rule.adam_learning_rate(width=width, batch_tokens=b, tokens=t) for t in tokens]
        eps = [rule.eps(batch_tokens=b, tokens=t) for t in tokens]
        assert all(down(x, y) for x, y in zip(lrs, lrs[1:])) and all(
            down(x, y) for x, y in zip(adam, adam[1:])
        )
        assert all(x < y for x, y in zip(eps, eps[1:]))
        assert lrs[-1] < lrs[0] and adam[-1] < adam[0]
    batches = [512 * 2**k for k in range(6)]
    for t in (1e6, 1e8):
        lrs = [rule.learning_rate(batch_tokens=b, tokens=t) for b in batches]
        adam = [rule.adam_learning_rate(width=width, batch_tokens=b, tokens=t) for b in batches]
        beta2 = [rule.beta2(batch_tokens=b, tokens=t) for b in batches]
        eps = [rule.eps(batch_tokens=b, tokens=t) for b in batches]
        assert all(up(x, y) for x, y in zip(lrs, lrs[1:])) and all(up(x, y) for x, y in zip(adam, adam[1:]))
        assert lrs[-1] > lrs[0] and adam[-1] > adam[0]
        assert all(x >= y for x, y in zip(beta2, beta2[1:])) and all(x > y for x, y in zip(eps, eps[1:]))
    wide = RULE.adam_learning_rate(width=2 * width, batch_tokens=B0, tokens=T0)
    assert wide == pytest.approx(RULE.adam_learning_rate(width=width, batch_tokens=B0, tokens=T0) / 2)
    if rule is not RULE:
        assert rule.learning_rate(batch_tokens=1e9, tokens=1e3) == rule.max_learning_rate  # capped


def test_family_follows_delphi_shapes_and_inits_by_fan_in() -> None:
    fam = HorizonFamily()
    # Delphi's released models (Hugging Face cards): hidden 640 -> 7 layers, 896 -> 10, 1280 -> 13.
    assert [fam.layers(w) for w in (640, 896, 1280)] == [7, 10, 13]
    assert [fam.layers(w) for w in (32, 64, 128, 256, 512)] == [2, 2, 2, 3, 6]  # never fewer than 2
    cfg = fam.config(256, 128)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.hidden_dim // cfg.num_heads) == (8, 8, 32)
    assert cfg.intermediate_dim == 1024 and cfg.qk_norm
    assert cfg.initializer_range == pytest.approx(1 / 16)


def test_fan_in_init_gives_q_unit_gain(nano) -> None:
    """With initializer_range = 1/sqrt(W) a q_proj maps a unit-RMS input to a unit-RMS output (fan-in init)."""
    import jax

    from schooner.model import init

    cfg = HorizonFamily(vocab_size=320).config(128, 64)
    q = np.asarray(init(cfg, key=jax.random.PRNGKey(0)).layers.stacked.attn.q_proj.array)[0]  # [heads, hd, E]
    x = np.random.default_rng(0).normal(size=(256, 128))
    out = np.einsum("ne,hde->nhd", x, q)
    assert 0.85 < out.std() < 1.05  # truncated at 3 std: slightly below 1


def test_the_horizon_recipe_is_selectable_beside_today_s() -> None:
    today = recipe(1e13)
    horizon = recipe(1e13, rule="horizon")
    assert isinstance(today.optimizer, AdamConfig) and isinstance(horizon.optimizer, AdamHConfig)
    assert recipe(1e13, rule="default") == today
    assert recipe(1e13, rules=HorizonRecipe()) == horizon
    r, h = horizon, HorizonRecipe().horizon
    batch_tokens = r.batch_size * r.seq_len
    opt = r.optimizer
    assert opt.learning_rate == h.learning_rate(batch_tokens=batch_tokens, tokens=r.tokens)
    assert opt.adam_learning_rate == h.adam_learning_rate(
        width=r.width, batch_tokens=batch_tokens, tokens=r.tokens
    )
    assert (opt.beta2, opt.eps) == (
        h.beta2(batch_tokens=batch_tokens, tokens=r.tokens),
        h.eps(batch_tokens=batch_tokens, tokens=r.tokens),
    )
    assert (opt.max_grad_norm, opt.schedule, opt.warmup, opt.decay, opt.min_lr_ratio) == (
        0.1,
        "wsd",
        0.1,
        0.2,
        0.0,
    )
    assert r.model.num_layers >= 2 and r.summary()["optimizer"] == "AdamHConfig"
    assert r.summary()["adam_learning_rate"] == opt.adam_learning_rate
    # The budget is still spent exactly, as today's recipe does.
    from schooner.model import flops_per_token

    assert r.flops == flops_per_token(r.model, r.seq_len) * r.tokens
    grid = HorizonRecipe(family=HorizonFamily(vocab_size=512)).isoflop_grid(3e13, sizes=3)
    assert len(grid) == 3 and all(isinstance(g.optimizer, AdamHConfig) for g in grid)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: recipe(1e13, rule="delphi"), r"recipe rule must be one of \('default', 'horizon'\); got rule='delphi'"),
        (lambda: recipe(1e13, rule="horizon", rules=ScalingRecipe()), r"rule='horizon' but rules is a ScalingRecipe"),
        (lambda: recipe(1e13, rule="default", rules=HorizonRecipe()), r"rule='default' but rules is a HorizonRecipe"),
        (
            lambda: HorizonRecipe(learning_rate=LearningRateRule(base=1e-3)),
            r"HorizonRecipe.learning_rate is today's AdamW rule .* set horizon=HorizonRule",
        ),
        (lambda: HorizonRule(base_learning_rate=0.0), r"HorizonRule.base_learning_rate must be a finite number > 0; got base_learning_rate=0.0"),
        (lambda: HorizonRule(base_horizon=float("nan")), r"HorizonRule.base_horizon must be a finite number > 0"),
        (lambda: HorizonRule(base_beta2=1.0), r"HorizonRule.base_beta2 must be a finite number in \(0, 1\); got base_beta2=1.0"),
        (lambda: HorizonRule(horizon_exponent=-0.3), r"HorizonRule.horizon_exponent must be a finite number >= 0"),
        (lambda: HorizonRule(base_width="128"), r"HorizonRule.base_width must be a finite number > 0; got base_width='128'"),
        (lambda: HorizonRule(min_beta2=0.99, max_beta2=0.95), r"min_beta2 <= max_beta2"),
        (lambda: RULE.learning_rate(batch_tokens=0, tokens=T0), r"HorizonRule.batch_tokens must be a finite number > 0"),
        (lambda: RULE.adam_learning_rate(width=-1, batch_tokens=B0, tokens=T0), r"HorizonRule.width must be"),
        (lambda: RULE.eps(batch_tokens=B0, tokens=float("inf")), r"HorizonRule.tokens must be a finite number > 0"),
        (lambda: HorizonFamily(head_dim=0), r"HorizonFamily.head_dim must be an int >= 1; got head_dim=0"),
        (lambda: HorizonFamily(min_width=48), r"multiples of head_dim=32"),
        (lambda: HorizonFamily(init_gain=0), r"HorizonFamily.init_gain must be a finite number > 0"),
    ],
)  # fmt: skip
def test_bad_input_names_the_field(call, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()


# -- picking eta0 -------------------------------------------------------------------------------------
def test_pick_recovers_the_vertex_of_an_exact_parabola() -> None:
    lrs = 0.02 * 2.0 ** np.arange(-4, 4)
    results = [(float(lr), 3.1 + 0.04 * (math.log(lr) - math.log(0.013)) ** 2) for lr in lrs]
    choice = pick_learning_rate(results)
    assert choice.learning_rate == pytest.approx(0.013, rel=1e-9)
    assert choice.loss == pytest.approx(3.1, abs=1e-12)


def test_pick_matches_numpy_polyfit_on_the_best_run_and_its_neighbours() -> None:
    rng = np.random.default_rng(0)
    lrs = 0.01 * 2.0 ** np.arange(-4, 5)
    x = np.log(lrs / 0.02)
    loss = 3.0 + 0.05 * x**2 + 0.02 * np.maximum(x, 0) ** 3 + rng.normal(0, 0.002, size=x.size)  # steep above
    results = [{"learning_rate": float(a), "loss": float(b)} for a, b in zip(lrs, loss)]
    choice = pick_learning_rate(results, neighbours=2)
    k = int(np.argmin(loss))
    window = slice(max(0, k - 2), k + 3)
    a, b, _ = np.polyfit(np.log(lrs[window]), loss[window], 2)
    assert choice.learning_rate == pytest.approx(math.exp(-b / (2 * a)), rel=1e-9)
    assert len(choice.used) == 5 and choice.best == (float(lrs[k]), float(loss[k]))
    assert 0.5 * 0.02 < choice.learning_rate < 2 * 0.02
    everything = pick_learning_rate(results, neighbours=10)  # every point: pulled down by the steep side
    assert everything.learning_rate < choice.learning_rate


def test_pick_averages_seeds_to_find_the_best_rate() -> None:
    lrs = [0.005, 0.01, 0.02, 0.04]
    results = [(lr, 3 + (math.log(lr / 0.015)) ** 2 * 0.05 + s) for lr in lrs for s in (-0.001, 0.001)]
    choice = pick_learning_rate(results)
    assert choice.learning_rate == pytest.approx(0.015, rel=1e-6) and len(choice.used) == 8


@pytest.mark.parametrize(
    ("results", "message"),
    [
        ([(0.01, 3.0), (0.02, 2.9)], r"3 or more distinct learning rates; got 2"),
        ([(0.01, 3.0), (0.02, 2.9), (0.04, 2.8)], r"grid's largest learning rate \(0.04.*extend the grid upwards"),
        ([(0.01, 2.7), (0.02, 2.9), (0.04, 3.0)], r"grid's smallest learning rate .* extend the grid downwards"),
        ([(0.01, 3.0), (0.02, float("nan")), (0.04, 3.0)], r"result 1 has loss=nan.*diverged run"),
        ([(0.01, 3.0), (-0.02, 2.9), (0.04, 3.0)], r"result 1 has learning_rate=-0.02; it must be > 0"),
        ([(0.01, 3.0), (0.02,), (0.04, 3.0)], r"result 1 must be \(lr, loss\)"),
    ],
)  # fmt: skip
def test_pick_refuses_bad_searches_by_name(results, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        pick_learning_rate(results)


TINY = HorizonRecipe(
    family=HorizonFamily(vocab_size=320, min_width=32, max_width=64),
    horizon=HorizonRule(base_batch_tokens=8 * 32, base_horizon=8 * 32 * 8, base_width=32),
    seq_len=32,
)
LRS = [0.005, 0.02, 0.08]


def test_reference_search_declares_one_cached_run_per_rate_and_seed(data_dir) -> None:
    h = reference_search("ref/tiny", data={data_dir: 1.0}, learning_rates=LRS, rules=TINY, seeds=(0, 1))
    runs = h.config.runs
    assert len(runs) == 6 and {r["seed"] for r in runs} == {0, 1}
    ratio = TINY.horizon.base_adam_learning_rate / TINY.horizon.base_learning_rate
    for r in runs:
        cfg = r["train"].config
        assert cfg.model.hidden_dim == 32 and cfg.batch_size == 8 and cfg.num_train_steps == 8
        assert isinstance(cfg.optimizer, AdamHConfig) and cfg.optimizer.learning_rate == r["learning_rate"]
        assert cfg.optimizer.adam_learning_rate == pytest.approx(r["learning_rate"] * ratio)
    again = reference_search(
        "ref/tiny", data={data_dir: 1.0}, learning_rates=[*LRS, 0.3], rules=TINY, seeds=(0, 1)
    )
    assert {r["train"].key for r in runs} < {r["train"].key for r in again.config.runs}  # nothing done reruns
    only = reference_search("ref/tiny", data={data_dir: 1.0}, learning_rates=LRS, rules=TINY, vary="adam")
    assert [r["train"].config.optimizer.adam_learning_rate for r in only.config.runs] == LRS
    assert {r["train"].config.optimizer.learning_rate for r in only.config.runs} == {
        TINY.horizon.learning_rate(batch_tokens=256, tokens=2048)
    }
    with pytest.raises(ValueError, match=r"vary must be one of"):
        reference_search("ref/x", data={data_dir: 1.0}, learning_rates=LRS, rules=TINY, vary="all")
    with pytest.raises(ValueError, match=r"learning_rates\[1\] must be a finite number > 0"):
        reference_search("ref/x", data={data_dir: 1.0}, learning_rates=[0.01, 0.0, 0.1], rules=TINY)
    with pytest.raises(ValueError, match=r"needs a HorizonRecipe"):
        reference_search("ref/x", data={data_dir: 1.0}, learning_rates=LRS, rules=ScalingRecipe())


@pytest.mark.slow  # three real runs through the step runner (~60 s under load)
def test_reference_search_runs_as_steps_and_its_result_sets_the_rule(data_dir, tmp_path) -> None:
    h = reference_search(
        "ref/tiny", data={data_dir: 1.0}, learning_rates=[0.002, 0.02, 0.2, 2.0], rules=TINY, resources=None,
        vary="both",
    )  # fmt: skip
    done = StepRunner(prefix=str(tmp_path)).run([h], max_concurrent=1)
    out = done[h].output_path
    ref = read_reference(out)
    with open(f"{out}/reference.json") as f:
        assert ref == json.load(f)
    losses = [r["loss"] for r in ref["runs"]]
    assert len(losses) == 4 and all(np.isfinite(losses))
    want = pick_learning_rate([(r["learning_rate"], r["loss"]) for r in ref["runs"]])
    assert ref["chosen"]["learning_rate"] == pytest.approx(want.learning_rate)
    rule = HorizonRule.from_reference(out)
    assert (rule.base_batch_tokens, rule.base_horizon, rule.base_width) == (256, 2048, 32)
    assert rule.base_learning_rate == pytest.approx(want.learning_rate)
