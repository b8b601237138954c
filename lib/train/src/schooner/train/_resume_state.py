"""A run's train state read back from its latest checkpoint when it resumes.

Each device reads only its own slices: the state's shapes carry their target shardings (`sharded_shapes`).
The checkpoint must hold this run's model config, and its train state's step must be the one its
`checkpoint.json` marker names.
"""

from __future__ import annotations

from typing import Any

import jax

from ._checkpoint import read_marker
from ._mesh import replicated


def restore_state(path: str, model_config: Any, abstract_state: Any, mesh: Any, param_map: Any) -> Any:
    """The `TrainState` of checkpoint `path`, each device reading only its slices of `abstract_state` (the
    state's shapes) as the mesh and `param_map` shard it; refused when the checkpoint holds another model
    config or its train state's step is not the one its marker names."""
    from schooner.model import load_pytree, read_config

    from ._step import TrainState

    saved = read_config(path)
    if saved != model_config:
        raise ValueError(
            f"checkpoint {path} holds a different model config than this run:\n  checkpoint {saved}\n"
            f"  this run   {model_config}\nuse a new output_path or the original model config"
        )
    # Shape structs carrying their target sharding: each device reads only its own slices.
    a = sharded_shapes(abstract_state, mesh, param_map)
    model = load_pytree(f"{path}/model", a.model)
    rest = load_pytree(f"{path}/train_state", {"step": a.step, "opt_state": a.opt_state, "key": a.key})
    step = int(jax.device_get(rest["step"]))
    marker = read_marker(path)
    if step != marker["step"]:
        raise ValueError(
            f"checkpoint {path}: train_state step {step} != checkpoint.json step {marker['step']}"
        )
    return TrainState(step=rest["step"], model=model, opt_state=rest["opt_state"], key=rest["key"])


def sharded_shapes(abstract: Any, mesh: Any, param_map: Any) -> Any:
    """`abstract` (shape structs) with each leaf's target sharding attached."""
    import haliax as hax

    from schooner.model import pspec_for_named

    def one(x: Any) -> Any:
        if isinstance(x, hax.NamedArray) and isinstance(x.array, jax.ShapeDtypeStruct):
            spec = pspec_for_named(x.axes, mesh, param_map)
            s = jax.sharding.NamedSharding(mesh, spec)
            return hax.NamedArray(jax.ShapeDtypeStruct(x.array.shape, x.array.dtype, sharding=s), x.axes)
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=replicated(mesh))
        return x

    return jax.tree.map(one, abstract, is_leaf=lambda x: isinstance(x, hax.NamedArray))
