"""Quantile load balancing holds through the real train step (``make_train_step``, ``AdamConfig()``'s defaults).

A toy MoE (2 layers, width 64, 8 experts, top-2) learns the bytes of real text (stdlib source), batches drawn
from a fixed seed. The earlier algorithm (quantiles of softmax-probability margins, the bias nudged by rate 0.1
after the optimizer step) brought the load down early and then drifted back up to a max/mean of 2.3-2.9 while
the router trained (issue 15's measurement through the same train step). The bias set from the step's own
forward pass alone lags the router's inputs by a step while they drift (up to 1.75 in the first ~35 steps
here); the post-step re-solve (``MoEConfig.router_bias_resolve``, the default) removes that lag.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import haliax as hax
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from haliax import NamedArray

from schooner.model import (
    BalanceStats,
    MoEConfig,
    balance_router,
    balance_stats,
    init,
    loss_and_balance,
    loss_fn,
    rate_take_back,
)
from schooner.model._balancing import SOLVER_DAMPING, SOLVER_STEPS
from schooner.model._layers import EMBED, rms_norm, rope_cos_sin
from schooner.train import AdamConfig, build_optimizer, init_state, make_train_step

from .conftest import stdlib_texts

BATCH, SEQ = 128, 64  # 8,192 tokens: the data's own batch-to-batch variation stays well below 1.3 (see below)
# Without the re-solve the bias lags the router's inputs by a step while they move fastest (the first ~35
# steps here); with it every step after the warm-up stays at or under 1.3. The measured loads: lib/model/README.md
# (MoE load balancing); `pytest -s` prints this test's.
STEPS, WARMUP = 100, 29
CFG = MoEConfig(
    vocab_size=256, hidden_dim=64, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
    max_seq_len=SEQ, num_experts=8, num_experts_per_token=2, compute_dtype="float32",
)  # fmt: skip


def _np_shift(select: np.ndarray, k: int) -> np.ndarray:
    """numpy reference of the quantile solve: per expert j, the 1 - k/E quantile over tokens of j's biased
    logit minus the k-th largest biased logit of the OTHER experts; the shift moves by the damped, centred
    quantiles, SOLVER_STEPS times."""
    e = select.shape[1]
    shift = np.zeros(e)
    for _ in range(SOLVER_STEPS):
        s = select + shift
        q = np.array(
            [np.quantile(s[:, j] - np.sort(np.delete(s, j, 1), 1)[:, -k], 1 - k / e) for j in range(e)]
        )
        shift = shift - SOLVER_DAMPING * (q - q.mean())
    return shift


@eqx.filter_jit
def _block_io(block, x: NamedArray, cos: jax.Array, sin: jax.Array) -> tuple[jax.Array, NamedArray]:
    """A block's router input [tokens, embed] and its output."""
    attn_out = block.attn(rms_norm(x, block.attn_norm, EMBED, block.norm_eps), cos, sin, None, kernels="xla")
    inputs = rms_norm(x + attn_out, block.mlp_norm, EMBED, block.norm_eps).array
    return inputs.reshape(-1, inputs.shape[-1]), block(x, cos, sin, None, kernels="xla")[0]


def _np_solve(
    model, tokens: np.ndarray, *, rebalance: bool = False, take_back: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(shift [layers, experts], mean router input [layers, embed]) of `tokens` under `model`, in numpy, the
    blocks run one by one. `rebalance` (the re-solve pass): each layer routes its tokens with the shift just
    solved for it, less its row of `take_back`, before the next layer runs; otherwise with the model's bias as
    it is."""
    cfg = model.config
    x = hax.named(model.embed.array[jnp.asarray(tokens)], ("batch", "position", "embed"))
    cos, sin = rope_cos_sin(tokens.shape[1], cfg.resolved_head_dim, cfg.rope)
    shifts, means = [], []
    for i in range(cfg.num_layers):
        block = model.layers.get_layer(i)
        inputs = np.asarray(_block_io(block, x, cos, sin)[0], np.float64)
        router, bias = (
            np.asarray(a, np.float64) for a in (block.mlp.router.array, block.mlp.router_bias.array)
        )
        shifts.append(_np_shift(inputs @ router.T + bias, cfg.num_experts_per_token))
        means.append(inputs.mean(0))
        if rebalance:
            routed = jnp.asarray(
                bias + shifts[-1] - (0.0 if take_back is None else take_back[i]), jnp.float32
            )
            block = eqx.tree_at(lambda blk: blk.mlp.router_bias.array, block, routed)
        x = _block_io(block, x, cos, sin)[1]
    return np.stack(shifts), np.stack(means)


TINY = MoEConfig(
    vocab_size=50, hidden_dim=16, intermediate_dim=8, num_layers=2, num_heads=2, num_kv_heads=1,
    max_seq_len=16, num_experts=4, num_experts_per_token=2, compute_dtype="float32", router_bias_rate=0.6,
)  # fmt: skip
TINY_OPT = AdamConfig(learning_rate=3e-2, warmup=0)


def _tiny_step(cfg: MoEConfig, microbatches: int = 2):
    """A state of TINY's parameters (config `cfg`) with a non-zero router bias, and its jitted train step."""
    model = init(TINY, key=jax.random.PRNGKey(0))
    bias = jax.random.normal(jax.random.PRNGKey(2), model.layers.stacked.mlp.router_bias.array.shape)
    model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, bias)
    shapes = eqx.filter_eval_shape(init, cfg, key=jax.random.PRNGKey(0))
    model = jax.tree.unflatten(jax.tree.structure(shapes), jax.tree.leaves(model))
    tx = build_optimizer(TINY_OPT, model, 10)
    step = make_train_step(tx, z_loss_weight=0.0, microbatches=microbatches, lr_schedule=lambda s: 0.0)
    return init_state(model, tx, jax.random.PRNGKey(1)), jax.jit(step)


def _tiny_batch() -> dict[str, jax.Array]:
    return {"tokens": jnp.asarray(np.random.default_rng(0).integers(0, 50, size=(4, 16)), jnp.int32)}


def _bias(state) -> np.ndarray:
    return np.asarray(state.model.layers.stacked.mlp.router_bias.array, np.float64)


def _router(state) -> np.ndarray:
    return np.asarray(state.model.layers.stacked.mlp.router.array, np.float64)


def _centred(a: np.ndarray) -> np.ndarray:
    return a - a.mean(-1, keepdims=True)


def _todays_bias(before, after, tokens: np.ndarray, rate: float = TINY.router_bias_rate) -> np.ndarray:
    """numpy: the bias the step's own forward pass sets (no re-solve): the microbatches' shifts and mean router
    inputs under the parameters BEFORE the step, averaged (equal token counts), the rate applied, and the
    router's move compensated."""
    shift, x_mean = _own_stats(before, tokens)
    moved = np.einsum("ld,led->le", x_mean, _router(after) - _router(before))
    return _bias(before) + rate * _centred(shift) - _centred(moved)


def _own_stats(before, tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """numpy: the step's own (shift, mean router input), its two microbatches solved on their own and averaged."""
    solved = [_np_solve(before.model, half) for half in (tokens[:2], tokens[2:])]
    return np.mean([s[0] for s in solved], axis=0), np.mean([s[1] for s in solved], axis=0)


def test_the_re_solve_balances_the_batch_under_the_model_as_it_is() -> None:
    """The re-solve's two parts outside the train step (whose compile is too slow for the default run; the
    slow tests above check the wiring): `balance_stats` is the numpy solve of the batch under the model's own
    parameters and non-zero bias, layer by layer, each layer routed with its solution less a take-back, and
    `balance_router(model, model, stats)` adds the rate times that shift and nothing else; configs that ask
    for no re-solve get None."""
    model = init(TINY, key=jax.random.PRNGKey(0))
    bias = jax.random.normal(jax.random.PRNGKey(2), model.layers.stacked.mlp.router_bias.array.shape)
    model = eqx.tree_at(lambda m: m.layers.stacked.mlp.router_bias.array, model, bias)
    tokens = _tiny_batch()["tokens"]
    back = np.asarray(jax.random.normal(jax.random.PRNGKey(3), bias.shape), np.float64) * 0.5
    stats = eqx.filter_jit(balance_stats)(model, tokens, take_back=jnp.asarray(back, jnp.float32))
    assert stats is not None
    shift, x_mean = _np_solve(model, np.asarray(tokens), rebalance=True, take_back=back)
    assert np.abs(shift).max() > 1e-2  # the non-zero bias leaves something to balance
    np.testing.assert_allclose(np.asarray(stats.shift), shift, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.input_mean), x_mean, rtol=1e-4, atol=1e-5)
    moved = balance_router(model, model, stats).layers.stacked.mlp.router_bias.array
    want = np.asarray(model.layers.stacked.mlp.router_bias.array, np.float64) + TINY.router_bias_rate * shift
    np.testing.assert_allclose(np.asarray(moved), want, rtol=1e-4, atol=1e-5)
    for off in ({"router_bias_resolve": False}, {"load_balancing": "aux_loss"}):
        cfg = dataclasses.replace(TINY, **off)
        assert balance_stats(eqx.filter_eval_shape(init, cfg, key=jax.random.PRNGKey(0)), tokens) is None


def test_the_re_solve_balances_its_own_batch_in_every_layer() -> None:
    """The re-solve routes each layer with the shift just solved for it before the next layer runs, so a deep
    layer is solved on the inputs it gets under the new biases of the layers before it: after
    `balance_router(model, model, balance_stats(model, tokens))` the same tokens load every expert of every
    layer evenly. The experts' outputs are scaled up so that a layer's routing moves the next layer's inputs
    (as in a trained model); solving every layer on one pass under the old biases left layers 2-4 at
    1.08-1.10 here."""
    cfg = dataclasses.replace(
        CFG, hidden_dim=32, intermediate_dim=32, num_layers=4, num_heads=2, num_kv_heads=1
    )
    model = init(cfg, key=jax.random.PRNGKey(0))
    down = lambda m: m.layers.stacked.mlp.down.array  # noqa: E731
    model = eqx.tree_at(down, model, down(model) * 100.0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(16, 64)), jnp.int32)
    loads = eqx.filter_jit(lambda m: jnp.max(m.hidden_states(tokens)[1]["load"], axis=-1) * cfg.num_experts)
    assert np.asarray(loads(model))[1:].max() > 1.1  # something to balance in the deeper layers
    balanced = balance_router(model, model, eqx.filter_jit(balance_stats)(model, tokens))
    np.testing.assert_array_less(np.asarray(loads(balanced)), 1.02)  # 1.02: 5 of each expert's 256 tokens


def test_the_next_forward_pass_routes_as_the_re_solve_pass_did() -> None:
    """With a rate below 1 the re-solve takes (1 - rate) times the step's own shift back inside the pass, layer
    by layer, so the new bias routes the batch exactly as the pass routed it in every layer: each deeper layer
    was solved under the biases the layers before it really get. (Taking it back only after the pass left
    layers 2-4 routed differently from how they were solved.)"""
    cfg = dataclasses.replace(
        CFG,
        hidden_dim=32,
        intermediate_dim=32,
        num_layers=4,
        num_heads=2,
        num_kv_heads=1,
        router_bias_rate=0.5,
    )
    model = init(cfg, key=jax.random.PRNGKey(0))
    down = lambda m: m.layers.stacked.mlp.down.array  # noqa: E731
    model = eqx.tree_at(down, model, down(model) * 100.0)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, size=(16, 64)), jnp.int32)
    own = BalanceStats(
        shift=jax.random.normal(jax.random.PRNGKey(5), (4, cfg.num_experts)), input_mean=jnp.zeros((4, 32))
    )
    back = rate_take_back(model, own, step=10)
    loads = eqx.filter_jit(lambda m, r: m.hidden_states(tokens, rebalance=r)[1]["load"])
    in_pass = np.asarray(loads(model, back))
    stats = eqx.filter_jit(balance_stats)(model, tokens, take_back=back)
    after = np.asarray(loads(balance_router(model, model, stats, rate=1.0, take_back=back), None))
    assert np.abs(in_pass - 0.25).max() > 0.02  # the take-back leaves the pass unbalanced: something to match
    np.testing.assert_allclose(after, in_pass, atol=1.5 / 2048)  # up to a token at a tie


@pytest.mark.slow  # compiles a MoE train step with two microbatches: ~13 s of CPU, 131 s at load 15
def test_the_train_step_re_solves_the_router_bias_on_the_batch_just_trained() -> None:
    """With `router_bias_resolve` (the default) the step's bias is the shift that balances the batch just
    trained on under the UPDATED parameters (each microbatch solved on its own, layer by layer, the shifts
    averaged; the solver starts from the bias the step's own statistics set at rate 1), less (1 - rate) times
    the step's own shift, by which each layer of the re-solve pass already routes: checked against a numpy
    solve, two microbatches, rate 0.6 so the rate's place shows
    (at step 3: the rate is at least 1 / (step + 1))."""
    state, step = _tiny_step(TINY)
    state = eqx.tree_at(lambda s: s.step, state, state.step + 3)  # past the first steps' rate 1 / (step + 1)
    batch = _tiny_batch()
    new, _ = step(state, batch)
    tokens = np.asarray(batch["tokens"])
    first = _todays_bias(state, new, tokens, rate=1.0)
    where = lambda m: m.layers.stacked.mlp.router_bias.array  # noqa: E731
    between = eqx.tree_at(where, new.model, jnp.asarray(first, jnp.float32))  # new parameters, first bias
    own = _centred(_own_stats(state, tokens)[0])
    assert np.abs(own).max() > 1e-2  # the rate has something to take back
    back = (1 - TINY.router_bias_rate) * own
    halves = (tokens[:2], tokens[2:])
    again = np.mean([_np_solve(between, h, rebalance=True, take_back=back)[0] for h in halves], axis=0)
    assert np.abs(_centred(again)).max() > 1e-2  # the re-solve has something to do
    want = first + _centred(again) - back
    np.testing.assert_allclose(_bias(new), want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow  # two MoE train steps compiled: ~25 s of CPU
@pytest.mark.parametrize("resolve_tokens,rows", [(16, 1), (32, 2)])
def test_the_re_solve_reads_the_batch_s_first_rows_up_to_its_token_budget(resolve_tokens, rows) -> None:
    """`router_bias_resolve_tokens`: the re-solve pass reads the batch's first ceil(tokens / seq) rows (here
    16-token rows: 16 tokens -> row 0, less than a microbatch; 32 -> rows 0-1, the first of the two
    microbatches), the same numpy reference as above on those rows only; the gradient step is the same."""
    cfg = dataclasses.replace(TINY, router_bias_resolve_tokens=resolve_tokens)
    state, step = _tiny_step(cfg)
    state = eqx.tree_at(lambda s: s.step, state, state.step + 3)
    batch = _tiny_batch()
    new, _ = step(state, batch)
    tokens = np.asarray(batch["tokens"])
    first = _todays_bias(state, new, tokens, rate=1.0)
    where = lambda m: m.layers.stacked.mlp.router_bias.array  # noqa: E731
    between = eqx.tree_at(where, new.model, jnp.asarray(first, jnp.float32))
    back = (1 - TINY.router_bias_rate) * _centred(_own_stats(state, tokens)[0])
    again = _np_solve(between, tokens[:rows], rebalance=True, take_back=back)[0]
    want = first + _centred(again) - back
    np.testing.assert_allclose(_bias(new), want, rtol=1e-4, atol=1e-5)
    whole = np.mean(
        [_np_solve(between, h, rebalance=True, take_back=back)[0] for h in (tokens[:2], tokens[2:])], axis=0
    )
    assert np.abs(_centred(again) - _centred(whole)).max() > 1e-3  # the rows made a difference
    full_state, full_step = _tiny_step(dataclasses.replace(TINY, router_bias_resolve_tokens=None))
    full_state = eqx.tree_at(lambda s: s.step, full_state, full_state.step + 3)
    np.testing.assert_array_equal(_router(full_step(full_state, batch)[0]), _router(new))


@pytest.mark.parametrize(
    "args,rows",
    [
        ((16, 2048, 1, 1, 16384), 8),  # 16384 / 2048
        ((16, 2048, 1, 1, None), 16),  # None: the whole batch
        ((16, 2048, 1, 1, 16385), 9),  # rounded up to whole rows
        ((16, 2048, 4, 1, 16384), 8),  # past one microbatch (4 rows): whole microbatches
        ((16, 2048, 4, 1, 10000), 8),  # 5 rows -> 2 microbatches of 4
        ((16, 2048, 4, 1, 4096), 2),  # within one microbatch: just the rows
        ((64, 512, 1, 8, 1000), 8),  # 2 rows -> a multiple of the 8 data shards
        ((64, 512, 8, 8, 20000), 40),  # 40 rows: 5 microbatches of 8
        ((4, 2048, 1, 1, 1 << 20), 4),  # at most the batch
    ],
)
def test_resolve_rows(args, rows) -> None:
    from schooner.train._step import resolve_rows

    assert resolve_rows(*args) == rows


@pytest.mark.slow
def test_without_the_re_solve_the_step_is_today_s_and_the_aux_loss_s_is_unchanged() -> None:
    """`router_bias_resolve=False`: the same gradient step, and the bias the step's own statistics set (numpy
    reference). The auxiliary loss compiles to the same program with the switch either way."""
    cfg = dataclasses.replace(TINY, router_bias_resolve=False)
    state, step = _tiny_step(cfg)
    batch = _tiny_batch()
    new, _ = step(state, batch)
    np.testing.assert_allclose(
        _bias(new), _todays_bias(state, new, np.asarray(batch["tokens"])), rtol=1e-4, atol=1e-5
    )
    state_on, step_on = _tiny_step(TINY)
    np.testing.assert_array_equal(_router(step_on(state_on, batch)[0]), _router(new))
    lowered = [
        step.lower(st, batch).as_text()
        for st, step in (
            _tiny_step(dataclasses.replace(TINY, load_balancing="aux_loss", router_bias_resolve=r))
            for r in (True, False)
        )
    ]
    assert lowered[0] == lowered[1]


def _batches(seed: int, batch: int = BATCH):
    stream = np.frombuffer("\n\n".join(stdlib_texts()).encode(), np.uint8).astype(np.int32)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(stream) - SEQ, size=batch)
        yield {
            "tokens": jnp.asarray(np.stack([stream[s : s + SEQ] for s in starts])),
            "segment_ids": jnp.zeros((batch, SEQ), jnp.int32),
        }


def _run(
    load_balancing: str,
    resolve: bool = True,
    stop_above: float | None = None,
    resolve_tokens: int | None = None,
):
    """The final train state, and max/mean expert load (busiest layer) and cross-entropy at every step
    (`stop_above`: stop after the first step past the warm-up whose load exceeds it; `resolve_tokens`: the
    re-solve's token budget, None: the whole batch)."""
    cfg = dataclasses.replace(
        CFG,
        load_balancing=load_balancing,
        router_bias_resolve=resolve,
        router_bias_resolve_tokens=resolve_tokens,
    )
    opt = AdamConfig()
    model = init(cfg, key=jax.random.PRNGKey(0))
    tx = build_optimizer(opt, model, STEPS)
    state = init_state(model, tx, jax.random.PRNGKey(1))
    step = jax.jit(
        make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=opt.lr_schedule(STEPS)),
        donate_argnums=0,
    )
    data, rows = _batches(0), []
    for i in range(STEPS):
        state, metrics = step(state, next(data))
        rows.append(jax.device_get((metrics["moe/max_load_ratio"], metrics["ce_loss"], metrics["finite"])))
        if stop_above is not None and i >= WARMUP and rows[-1][0] > stop_above:
            break
    load, ce, finite = (np.asarray(c, np.float64) for c in zip(*rows, strict=True))
    assert finite.all()
    return state, load, ce


def _noise_floor(model) -> float:
    """95th percentile of max/mean load on 20 fresh batches, the router frozen with the best FIXED bias (solved
    on 1,024 held-out sequences): what the data's batch-to-batch variation alone gives at this batch size."""
    shift = jax.jit(lambda m, t: loss_and_balance(m, t)[1][1].shift)
    probe = jax.jit(lambda m, t: loss_fn(m, t)[1]["moe/max_load_ratio"])
    pool = next(_batches(2, batch=1024))["tokens"]
    where = lambda m: m.layers.stacked.mlp.router_bias.array  # noqa: E731
    for _ in range(4):  # the layers interact: a few rounds
        model = eqx.tree_at(where, model, where(model) + shift(model, pool))
    fresh = _batches(1)
    return float(np.percentile([float(probe(model, next(fresh)["tokens"])) for _ in range(20)], 95))


@pytest.mark.slow
@pytest.mark.timeout(
    5400
)  # two 100-step runs of 8,192 tokens and a 30-step one: 995 s on the shared 2-core machine at load 12-14
def test_quantile_balancing_holds_every_step_through_the_train_step() -> None:
    """At 8,192-token batches, after a 29-step warm-up, no step sends the busiest expert more than 1.3x its
    share with quantile balancing (the default MoEConfig: the bias re-solved after each step), at a loss no
    worse than the auxiliary loss's; the auxiliary loss, same batches, exceeds 1.3, and so does quantile
    balancing without the re-solve, which during the warm-up also exceeds 1.3 more often and is higher on
    average. The data permits the bound: a frozen router with the best fixed bias shows a 95th percentile
    well below it on fresh batches of this size."""
    state, load, ce = _run("quantile")
    after = load[WARMUP:]
    rounded = np.round(load, 2).tolist()
    print("quantile, re-solved: max/mean load per step", rounded, "CE of the last 10", ce[-10:].mean())
    assert load[0] > 1.5  # there was something to balance
    floor = _noise_floor(state.model)
    assert floor < 1.25, floor
    assert after.max() <= 1.3, rounded
    _, aux_load, aux_ce = _run("aux_loss")
    print("aux loss: max/mean load per step", np.round(aux_load, 2).tolist(), "CE", aux_ce[-10:].mean())
    assert aux_load[WARMUP:].max() > 1.3, np.round(aux_load, 2).tolist()
    assert ce[-10:].mean() <= aux_ce[-10:].mean() + 0.005, (ce[-10:].mean(), aux_ce[-10:].mean())
    assert ce[-10:].mean() < ce[:5].mean() - 1.0  # and the model learned
    _, lagging, _ = _run("quantile", resolve=False, stop_above=1.3)
    print("quantile without the re-solve: max/mean load per step", np.round(lagging, 2).tolist())
    assert lagging[WARMUP:].max() > 1.3, np.round(lagging, 2).tolist()
    drift, lag_drift = load[1:WARMUP], lagging[1:WARMUP]  # steps 2-29, while the router's inputs move
    assert np.sum(drift > 1.3) < np.sum(lag_drift > 1.3) and drift.mean() < lag_drift.mean(), (
        rounded,
        lagging,
    )


@pytest.mark.slow
@pytest.mark.timeout(
    3600
)  # a 100-step run of 8,192 tokens and a shorter one: ~300 s on the shared 2-core machine
def test_a_re_solve_on_part_of_the_batch_still_follows_the_drift() -> None:
    """`router_bias_resolve_tokens=2048`: the re-solve reads a quarter of each 8,192-token batch (32 of 128
    rows). It still removes the lag while the router's inputs drift (steps 2-29: fewer steps above 1.3 and a
    lower mean than without the re-solve) and the model learns. After the warm-up the smaller sample's noise
    shows (printed; measured: mean 1.17, max 1.40, against no re-solve's mean 1.14, max 1.55, and the whole
    batch's max 1.30): the trade documented at `MoEConfig.router_bias_resolve_tokens`."""
    _, load, ce = _run("quantile", resolve_tokens=2048)
    rounded = np.round(load, 2).tolist()
    print("quantile, re-solved on 2,048 tokens: max/mean load per step", rounded, "CE", ce[-10:].mean())
    assert load[0] > 1.5
    assert ce[-10:].mean() < ce[:5].mean() - 1.0
    _, lagging, _ = _run("quantile", resolve=False)
    print("without the re-solve:", np.round(lagging, 2).tolist())
    print("after the warm-up, mean/max:", load[WARMUP:].mean(), load[WARMUP:].max(), "without the re-solve:",
          lagging[WARMUP:].mean(), lagging[WARMUP:].max())  # fmt: skip
    drift, lag_drift = load[1:WARMUP], lagging[1:WARMUP]
    assert np.sum(drift > 1.3) < np.sum(lag_drift > 1.3) and drift.mean() < lag_drift.mean(), (
        rounded,
        lagging,
    )


@pytest.mark.parametrize("shards", [0, -1, 2.0, True])
def test_make_train_step_refuses_a_shard_count_that_is_not_a_positive_int(shards) -> None:
    with pytest.raises(ValueError, match="shards .* must be an int >= 1"):
        make_train_step(build_optimizer(TINY_OPT, init(TINY, key=jax.random.PRNGKey(0)), 10), z_loss_weight=0.0,
                        microbatches=1, lr_schedule=lambda s: 0.0, shards=shards)  # fmt: skip
