import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.extend import core as jex_core

from schooner.model import flops_per_token, forward_flops_per_token, init, model_shapes, num_parameters


def _dot_flops(jaxpr, mult: int = 1) -> int:
    """Matmul FLOPs of a jaxpr (2 * output size * contracted size per dot), recursing into sub-jaxprs."""
    total = 0
    for eqn in jaxpr.eqns:
        name = eqn.primitive.name
        if name == "dot_general":
            (lc, _), _ = eqn.params["dimension_numbers"]
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            total += 2 * int(np.prod(out)) * int(np.prod([lhs[d] for d in lc])) * mult
        elif name == "ragged_dot_general":
            dn = eqn.params["ragged_dot_dimension_numbers"]
            (lc, _), _ = dn.dot_dimension_numbers
            lhs = eqn.invars[0].aval.shape
            out = eqn.outvars[0].aval.shape
            contracted = int(np.prod([lhs[d] for d in lc]))
            groups = (
                out[0] if not dn.rhs_group_dimensions else 1
            )  # weight-gradient form: [groups, ...] output
            total += 2 * int(np.prod(out)) * contracted // groups * mult
        inner = mult * (eqn.params["length"] if name == "scan" else 1)
        for value in eqn.params.values():
            for sub in value if isinstance(value, tuple | list) else (value,):
                if isinstance(sub, jex_core.ClosedJaxpr):
                    total += _dot_flops(sub.jaxpr, inner)
                elif isinstance(sub, jex_core.Jaxpr):
                    total += _dot_flops(sub, inner)
    return total


def _train_jaxpr_flops(model, tokens) -> int:
    params, static = eqx.partition(model, eqx.is_array)

    def f(p):
        return jnp.sum(eqx.combine(p, static)(tokens))

    return _dot_flops(jax.make_jaxpr(jax.grad(f))(params).jaxpr)


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"tie_embeddings": True, "qk_norm": True},
        {"num_kv_heads": 1, "head_dim": 12},
    ],
)
def test_num_parameters_counts_the_real_arrays(tiny_dense, tiny_moe, change):
    for cfg in (dataclasses.replace(tiny_dense, **change), dataclasses.replace(tiny_moe, **change)):
        shapes = model_shapes(cfg)
        assert num_parameters(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(shapes))


def test_num_parameters_with_shared_experts(tiny_moe):
    cfg = dataclasses.replace(tiny_moe, num_shared_experts=2, shared_intermediate_dim=8)
    assert num_parameters(cfg) == sum(x.size for x in jax.tree_util.tree_leaves(model_shapes(cfg)))


@pytest.mark.parametrize("moe", [False, True])
def test_flops_match_the_jaxpr_matmul_count(tiny_dense, tiny_moe, tokens, moe):
    cfg = dataclasses.replace(tiny_moe if moe else tiny_dense, num_shared_experts=1) if moe else tiny_dense
    model = init(cfg, key=jax.random.PRNGKey(0))
    b, t = 2, 16
    toks = tokens(b, t, cfg.vocab_size)
    forward = _dot_flops(jax.make_jaxpr(lambda m: m(toks))(model).jaxpr)
    assert forward == forward_flops_per_token(cfg, t) * b * t
    assert _train_jaxpr_flops(model, toks) == flops_per_token(cfg, t) * b * t


def test_flops_need_a_positive_length(tiny_dense):
    with pytest.raises(ValueError, match="seq_len must be > 0"):
        flops_per_token(tiny_dense, 0)
