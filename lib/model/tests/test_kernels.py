"""The backend switch (`LlamaConfig.kernels`): the GPU/TPU path ("xla") compiles here, on CPU, and computes
what the CPU path computes; each path is what it says it is.

Tolerances, from the measured differences on these models: in float32 the paths differ only in summation
order (loss identical, gradients 5e-7 relative to their largest entry; held to 5e-6). In bfloat16 each path
rounds at different points: the losses differ by 2e-6 relative (held to 1e-4), and each gradient's error
against float32 is about 1e-2 on both paths; the "xla" path is held to 1.5x the CPU path's error against
float32, and the two paths to 2x of it from each other.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from schooner.model import init, loss_fn


def _loss_and_grads(cfg, tokens, segs):
    model = init(cfg, key=jax.random.PRNGKey(0))
    f = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss_fn(m, tokens, segment_ids=segs)[0]))
    value, grads = f(model)
    leaves = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(grads)]
    return float(value), leaves


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


@pytest.fixture
def batch(tokens):
    toks = tokens(2, 24, 97)
    segs = jnp.asarray([[0] * 10 + [1] * 14, [0] * 24], jnp.int32)
    return toks, segs


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_xla_path_matches_cpu_path_in_float32(tiny_dense, tiny_moe, batch, moe):
    cfg = dataclasses.replace(tiny_moe if moe else tiny_dense, compute_dtype="float32")
    cfg = dataclasses.replace(cfg, load_balancing="aux_loss") if moe else cfg
    cpu = _loss_and_grads(dataclasses.replace(cfg, kernels="cpu"), *batch)
    xla = _loss_and_grads(dataclasses.replace(cfg, kernels="xla"), *batch)
    assert xla[0] == pytest.approx(cpu[0], rel=1e-6)
    for g_xla, g_cpu in zip(xla[1], cpu[1], strict=True):
        assert _rel(g_xla, g_cpu) < 5e-6


@pytest.mark.slow  # one of the default suite's heaviest (20-70 s on 2 cores); covered in part by faster tests
def test_xla_path_matches_cpu_path_in_bfloat16(tiny_dense, batch):
    fp32 = _loss_and_grads(dataclasses.replace(tiny_dense, compute_dtype="float32", kernels="cpu"), *batch)
    cfg = dataclasses.replace(tiny_dense, compute_dtype="bfloat16")
    cpu = _loss_and_grads(dataclasses.replace(cfg, kernels="cpu"), *batch)
    xla = _loss_and_grads(dataclasses.replace(cfg, kernels="xla"), *batch)
    assert cpu[0] != fp32[0]  # bf16 is really in use
    assert xla[0] == pytest.approx(cpu[0], rel=1e-4)
    for g_xla, g_cpu, g32 in zip(xla[1], cpu[1], fp32[1], strict=True):
        err_cpu = _rel(g_cpu, g32)
        assert 0 < err_cpu < 0.05
        assert _rel(g_xla, g32) < 1.5 * err_cpu and _rel(g_xla, g_cpu) < 2 * err_cpu


def _jaxpr_text(cfg, batch) -> str:
    model = init(cfg, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_array)

    def f(p):
        return loss_fn(eqx.combine(p, static), batch[0], segment_ids=batch[1])[0]

    return str(jax.make_jaxpr(jax.grad(f))(params))


def test_each_path_is_what_it_says(tiny_dense, batch):
    cfg = dataclasses.replace(tiny_dense, compute_dtype="bfloat16")
    xla = _jaxpr_text(dataclasses.replace(cfg, kernels="xla"), batch)
    cpu = _jaxpr_text(dataclasses.replace(cfg, kernels="cpu"), batch)
    # The plain path: autodiff only, no hand-written backward, no barriers, no integer-carried floats.
    for trick in ("custom_vjp_call", "optimization_barrier", "bitcast_convert_type"):
        assert trick not in xla, trick
        assert trick in cpu, trick
    assert "preferred_element_type=float32" in xla  # float32 logits of bf16 operands


def test_auto_picks_the_cpu_path_here_and_bad_values_are_refused(tiny_dense):
    from schooner.model._kernels import resolve_kernels

    assert jax.default_backend() == "cpu" and resolve_kernels("auto") == "cpu"
    assert resolve_kernels("xla") == "xla"
    with pytest.raises(ValueError, match="kernels must be one of"):
        dataclasses.replace(tiny_dense, kernels="gpu")
