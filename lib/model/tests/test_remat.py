"""Remat policies: the same loss and gradients as no remat, and what the "dots" policy keeps and recomputes.

What the backward keeps is read from jax's own tooling (``jax.ad_checkpoint.print_saved_residuals``); what
it recomputes, from the matrix products of the gradient's jaxpr (dead code removed, as XLA would) counted
per source line of the model, against the same count without remat.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import io
import linecache
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.ad_checkpoint import print_saved_residuals

from schooner.model import LlamaConfig, MoEConfig, init, loss_fn

B, T = 2, 24


def _dense(**kw) -> LlamaConfig:
    base = dict(
        vocab_size=97,
        hidden_dim=32,
        intermediate_dim=48,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=64,
        compute_dtype="float32",
        kernels="xla",
    )
    return LlamaConfig(**{**base, **kw})


def _moe(**kw) -> MoEConfig:
    base = dict(
        vocab_size=97,
        hidden_dim=32,
        intermediate_dim=16,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        max_seq_len=64,
        num_experts=4,
        num_experts_per_token=2,
        compute_dtype="float32",
        kernels="xla",
        load_balancing="aux_loss",  # a loss term that reaches the router through the routing statistics
    )
    return MoEConfig(**{**base, **kw})


def _batch():
    toks = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 97)
    segs = jnp.asarray([[0] * 10 + [1] * 14, [0] * 24], jnp.int32)
    return toks, segs


@functools.lru_cache(maxsize=8)  # the no-remat baselines are shared by the parametrized cases
@functools.cache  # the no-remat baseline is the same for each policy: computed once a process
def _loss_and_grads(cfg):
    toks, segs = _batch()
    model = init(cfg, key=jax.random.PRNGKey(0))
    f = eqx.filter_jit(eqx.filter_value_and_grad(lambda m: loss_fn(m, toks, segment_ids=segs)[0]))
    value, grads = f(model)
    return float(value), [np.asarray(g) for g in jax.tree_util.tree_leaves(grads)]


@pytest.mark.parametrize(
    "moe,policy,scan",
    [
        (False, "dots", True),
        (False, "save_carries", True),
        (False, "full", True),
        pytest.param(True, "dots", True, marks=pytest.mark.slow),  # ~18 s of CPU (two MoE compiles)
        pytest.param(False, "dots", False, marks=pytest.mark.slow),  # unrolled layers
        pytest.param(True, "save_carries", True, marks=pytest.mark.slow),
        pytest.param(False, "dots", True, marks=pytest.mark.slow, id="cpu-kernels-dots"),
    ],
)
def test_each_policy_gives_the_loss_and_gradients_of_no_remat(moe, policy, scan, request):
    make = _moe if moe else _dense
    kernels = "cpu" if "cpu-kernels" in request.node.name else "xla"
    base = _loss_and_grads(make(gradient_checkpointing="none", scan_layers=scan, kernels=kernels))
    got = _loss_and_grads(make(gradient_checkpointing=policy, scan_layers=scan, kernels=kernels))
    assert got[0] == pytest.approx(base[0], rel=1e-6)
    assert len(got[1]) == len(base[1])
    for a, b in zip(got[1], base[1], strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)


def _saved(cfg) -> list[str]:
    """``print_saved_residuals`` of the loss in the model's parameters: one description per residual."""
    toks, segs = _batch()
    model = init(cfg, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_saved_residuals(lambda p: loss_fn(eqx.combine(p, static), toks, segment_ids=segs)[0], params)
    return [line for line in out.getvalue().splitlines() if "from the argument" not in line]


def _count(lines: list[str], pattern: str) -> int:
    return sum(1 for line in lines if re.search(pattern, line))


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_dots_keeps_what_it_documents(moe):
    """Per layer (layers unrolled, splash attention): q, k and v after RoPE, the attention output and the
    kernel's output and log-sum-exp, the SwiGLU's gate and up products (the inputs of the recomputed
    down part), the experts' routing; and of the [B, T, D] residual stream only the blocks' inputs (and
    the final norm's): the stream between attention and MLP is recomputed."""
    layers, d, mlp = 2, 32, 16 if moe else 48
    make = _moe if moe else _dense
    lines = _saved(make(gradient_checkpointing="dots", scan_layers=False, attention_implementation="splash"))
    assert _count(lines, r"named 'attention_qkv'") == 3 * layers
    assert _count(lines, r"named 'attention_output'") == layers
    assert _count(lines, r"_splash_attention") == 2 * layers  # output and log-sum-exp, nothing [T, T]
    if moe:
        assert _count(lines, r"named 'moe_routing'") == 3 * layers  # chosen experts, order, inverse
        rows = B * T * 2  # one row per (token, choice)
        assert _count(lines, rf"f32\[{rows},{mlp}\] output of remat") == 2 * layers
    else:
        assert _count(lines, rf"f32\[{B},{T},{mlp}\] output of remat") == 2 * layers
    assert _count(lines, rf"f32\[{B},{T},{d}\]") == layers + 1
    # Without remat the backward keeps far more: every float intermediate of each block.
    plain = _saved(make(gradient_checkpointing="none", scan_layers=False, attention_implementation="splash"))
    assert _count(plain, rf"f32\[{B},{T},{d}\]") > 2 * layers + 1


_MATMULS = ("dot_general", "ragged_dot_general", "pallas_call")
_MODEL_FILES = ("_attention.py", "_layers.py", "_moe.py", "_xent.py", "_splash.py")


def _matmuls_by_line(cfg) -> collections.Counter[str]:
    """Matrix products (and Pallas kernels) in the gradient's jaxpr, dead code removed, by the model's
    source line that issued them (its text, so the counts survive edits elsewhere in the file)."""
    from jax._src import core
    from jax._src.interpreters import partial_eval as pe

    toks, segs = _batch()
    model = init(cfg, key=jax.random.PRNGKey(0))
    params, static = eqx.partition(model, eqx.is_inexact_array)
    grad = jax.grad(lambda p: loss_fn(eqx.combine(p, static), toks, segment_ids=segs)[0])
    jaxpr = jax.make_jaxpr(grad)(params).jaxpr
    jaxpr, _ = pe.dce_jaxpr(jaxpr, [True] * len(jaxpr.outvars))
    counts: collections.Counter[str] = collections.Counter()

    def walk(j) -> None:
        for eqn in j.eqns:
            if eqn.primitive.name in _MATMULS:
                frames = [f for f in eqn.source_info.traceback.frames if f.file_name.endswith(_MODEL_FILES)]
                where = "?"
                if frames:  # the outermost model frame: the line of the layer that asked for the product
                    f = frames[-1]
                    where = f"{f.file_name.rsplit('/', 1)[-1]}: {linecache.getline(f.file_name, f.line_num).strip()}"
                counts[where] += 1
            for sub in core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jaxpr)
    return counts


def _recomputed(moe: bool) -> dict[str, int]:
    make = _moe if moe else _dense
    kw = dict(scan_layers=False, attention_implementation="splash")
    none = _matmuls_by_line(make(gradient_checkpointing="none", **kw))
    dots = _matmuls_by_line(make(gradient_checkpointing="dots", **kw))
    return {line: dots[line] - none[line] for line in dots if dots[line] != none[line]}


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_what_dots_recomputes(moe):
    """Pins what the "dots" policy computes twice (see ``_dots_remat``), once per layer: the attention's
    output projection (the residual stream ``x + h`` between attention and MLP is not kept, and the MLP
    norm's backward needs it), and in a MoE layer the router logits (the softmax's backward needs them)
    and the experts' down projection (the combine weights' gradient needs its output). Nothing else: not
    q/k/v, not the splash kernel, not gate/up, not the dense SwiGLU's down projection."""
    got = _recomputed(moe)
    layers = 2
    want = {"o_proj": layers}
    if moe:
        want.update({"self.router": layers, "gmm(jax.nn.silu(g) * u": layers})
    found = {key: sum(n for line, n in got.items() if key in line) for key in want}
    assert found == want, got
    assert sum(got.values()) == sum(want.values()), got


@pytest.mark.xfail(
    strict=True,
    reason="'dots' recomputes the attention's output projection (and in MoE layers the router logits and "
    "the experts' down projection): x + h, the router logits and the experts' outputs are not kept",
)
@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_dots_recomputes_no_projection(moe):
    """The ideal of a dots-saveable policy: with splash attention (which keeps its own statistics) no matrix
    product of the forward runs again in the backward."""
    assert _recomputed(moe) == {}
