"""Quantile load balancing holds through the real train step (``make_train_step``, ``AdamConfig()``'s defaults).

A toy MoE (2 layers, width 64, 8 experts, top-2) learns the bytes of real text (stdlib source), batches drawn
from a fixed seed. The earlier algorithm (quantiles of softmax-probability margins, the bias nudged by rate 0.1
after the optimizer step) brought the load down early and then drifted back up to a max/mean of 2.3-2.9 while
the router trained (issue 15's measurement through the same train step).
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import MoEConfig, init, loss_and_balance, loss_fn
from schooner.train import AdamConfig, build_optimizer, init_state, make_train_step

from .conftest import stdlib_texts

BATCH, SEQ = 128, 64  # 8,192 tokens: the data's own batch-to-batch variation stays well below 1.3 (see below)
# The bias is set from the batch before, so it lags the router's inputs by a step: while they move fastest
# (the first ~35 steps here) the load reaches 1.75 (1.34 at step 31); afterwards the data's noise dominates.
STEPS, WARMUP = 100, 40
CFG = MoEConfig(
    vocab_size=256, hidden_dim=64, intermediate_dim=64, num_layers=2, num_heads=4, num_kv_heads=2,
    max_seq_len=SEQ, num_experts=8, num_experts_per_token=2, compute_dtype="float32",
)  # fmt: skip


def _batches(seed: int, batch: int = BATCH):
    stream = np.frombuffer("\n\n".join(stdlib_texts()).encode(), np.uint8).astype(np.int32)
    rng = np.random.default_rng(seed)
    while True:
        starts = rng.integers(0, len(stream) - SEQ, size=batch)
        yield {
            "tokens": jnp.asarray(np.stack([stream[s : s + SEQ] for s in starts])),
            "segment_ids": jnp.zeros((batch, SEQ), jnp.int32),
        }


def _run(load_balancing: str):
    """The final train state, and max/mean expert load (busiest layer) and cross-entropy at every step."""
    cfg = dataclasses.replace(CFG, load_balancing=load_balancing)
    opt = AdamConfig()
    model = init(cfg, key=jax.random.PRNGKey(0))
    tx = build_optimizer(opt, model, STEPS)
    state = init_state(model, tx, jax.random.PRNGKey(1))
    step = jax.jit(
        make_train_step(tx, z_loss_weight=0.0, microbatches=1, lr_schedule=opt.lr_schedule(STEPS)),
        donate_argnums=0,
    )
    data, rows = _batches(0), []
    for _ in range(STEPS):
        state, metrics = step(state, next(data))
        rows.append(jax.device_get((metrics["moe/max_load_ratio"], metrics["ce_loss"], metrics["finite"])))
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
    1800
)  # two 100-step runs of 8,192 tokens: 321 s on the shared 2-core machine at load 6-9
def test_quantile_balancing_holds_every_step_through_the_train_step() -> None:
    """At 8,192-token batches, after a 40-step warm-up, no step sends the busiest expert more than 1.3x its
    share with quantile balancing (the default MoEConfig), at a loss no worse than the auxiliary loss's; the
    auxiliary loss, same batches, exceeds 1.3. The data permits the bound: a frozen router with the best
    fixed bias shows a 95th percentile well below it on fresh batches of this size."""
    state, load, ce = _run("quantile")
    after = load[WARMUP:]
    rounded = np.round(load, 2).tolist()
    assert load[0] > 1.5  # there was something to balance
    floor = _noise_floor(state.model)
    assert floor < 1.25, floor
    assert after.max() <= 1.3, rounded
    _, aux_load, aux_ce = _run("aux_loss")
    assert aux_load[WARMUP:].max() > 1.3, np.round(aux_load, 2).tolist()
    assert ce[-10:].mean() <= aux_ce[-10:].mean() + 0.005, (ce[-10:].mean(), aux_ce[-10:].mean())
    assert ce[-10:].mean() < ce[:5].mean() - 1.0  # and the model learned
