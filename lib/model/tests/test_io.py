import json
import os

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from schooner.model import (
    config_to_dict,
    init,
    load_model,
    load_pytree,
    model_shapes,
    model_shardings,
    param_axis_mapping,
    read_config,
    read_pytree_metadata,
    save_model,
    save_pytree,
)


def _tree():
    return {
        "w": jnp.arange(12, dtype=jnp.float32).reshape(3, 4),
        "half": jnp.array([1.5, -2.0], jnp.bfloat16),
        "ids": np.arange(5, dtype=np.int64),
        "step": 7,
        "lr": 3e-4,
        "done": False,
        "none": None,
        "nested": [jnp.int32(4), (jnp.ones((2, 2, 2), jnp.float16),)],
    }


def _assert_same(a, b):
    la, ta = jax.tree_util.tree_flatten(a)
    lb, tb = jax.tree_util.tree_flatten(b)
    assert ta == tb
    for x, y in zip(la, lb):
        assert type(x) is type(y) or (isinstance(x, jax.Array) and isinstance(y, jax.Array))
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_round_trip_of_mixed_pytree(tmp_path):
    tree = _tree()
    save_pytree(tmp_path / "t", tree)
    _assert_same(load_pytree(tmp_path / "t", tree), tree)
    like = jax.tree_util.tree_map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype) if isinstance(x, jax.Array) else x, tree
    )
    _assert_same(load_pytree(tmp_path / "t", like), tree)
    flat = load_pytree(tmp_path / "t")
    assert set(flat) == {
        "['w']",
        "['half']",
        "['ids']",
        "['step']",
        "['lr']",
        "['done']",
        "['nested'][0]",
        "['nested'][1][0]",
    }
    meta = read_pytree_metadata(tmp_path / "t")
    dtypes = {e["key"]: (e["dtype"], e["kind"]) for e in meta["leaves"]}
    assert dtypes["['half']"] == ("bfloat16", "jax") and dtypes["['ids']"] == ("int64", "numpy")
    assert (
        dtypes["['step']"][1] == "int" and dtypes["['done']"][1] == "bool" and dtypes["['lr']"][1] == "float"
    )


def test_memory_kvstore_url():
    tree = {"a": jnp.arange(3.0)}
    save_pytree("memory://schooner-io-test/x", tree)
    _assert_same(load_pytree("memory://schooner-io-test/x", tree), tree)


def test_unfinished_save_is_refused(tmp_path):
    save_pytree(tmp_path / "t", _tree())
    os.remove(tmp_path / "t" / "metadata.json")  # as if the process died before the commit file
    with pytest.raises(FileNotFoundError, match="save did not finish"):
        load_pytree(tmp_path / "t", _tree())
    with pytest.raises(FileNotFoundError, match="no committed pytree"):
        load_pytree(tmp_path / "nothing-here", _tree())


def test_overwrite_rules(tmp_path):
    save_pytree(tmp_path / "t", {"a": jnp.zeros(2)})
    with pytest.raises(FileExistsError, match="overwrite=True"):
        save_pytree(tmp_path / "t", {"a": jnp.ones(2)})
    save_pytree(tmp_path / "t", {"a": jnp.ones(2)}, overwrite=True)
    np.testing.assert_array_equal(load_pytree(tmp_path / "t", {"a": jnp.zeros(2)})["a"], [1.0, 1.0])


def test_mismatches_name_the_leaf(tmp_path):
    save_pytree(tmp_path / "t", {"a": jnp.zeros((2, 3))})
    with pytest.raises(KeyError, match=r"is not in the pytree saved at"):
        load_pytree(tmp_path / "t", {"b": jnp.zeros((2, 3))})
    with pytest.raises(ValueError, match=r"leaf \['a'\]: saved shape \(2, 3\) does not match .* \(3, 2\)"):
        load_pytree(tmp_path / "t", {"a": jnp.zeros((3, 2))})
    with pytest.raises(TypeError, match=r"leaf \['name'\] is a str"):
        save_pytree(tmp_path / "u", {"name": "x"})
    assert not os.path.exists(tmp_path / "u" / "metadata.json")


def _mesh():
    return Mesh(np.array(jax.devices()[:8]).reshape(4, 2), ("data", "model"))


def test_sharded_save_and_restore_onto_another_sharding(tmp_path):
    mesh = _mesh()
    x = jax.device_put(jnp.arange(64.0).reshape(8, 8), NamedSharding(mesh, PartitionSpec("data", "model")))
    save_pytree(tmp_path / "s", {"x": x})
    target = NamedSharding(mesh, PartitionSpec("model", None))
    y = load_pytree(tmp_path / "s", {"x": jax.ShapeDtypeStruct((8, 8), jnp.float32)}, sharding=target)["x"]
    assert y.sharding == target
    np.testing.assert_array_equal(y, np.arange(64.0).reshape(8, 8))
    # A pytree of shardings (one per leaf) works too.
    z = load_pytree(tmp_path / "s", {"x": x}, sharding={"x": target})["x"]
    assert z.sharding == target


def test_save_and_load_model(tmp_path, tiny_dense):
    model = init(tiny_dense, key=jax.random.PRNGKey(0))
    save_model(tmp_path / "m", model)
    assert json.loads((tmp_path / "m" / "config.json").read_text())["type"] == "llama"
    assert read_config(tmp_path / "m") == tiny_dense
    loaded, cfg = load_model(tmp_path / "m")
    assert cfg == tiny_dense
    _assert_same(loaded, model)
    mesh = _mesh()
    sharded, _ = load_model(
        tmp_path / "m", sharding=model_shardings(model_shapes(cfg), mesh, param_axis_mapping())
    )
    assert sharded.embed.array.sharding.spec == PartitionSpec(None, "data")
    _assert_same(sharded, model)


def test_load_model_from_a_train_state_pytree(tmp_path, tiny_moe):
    model = init(tiny_moe, key=jax.random.PRNGKey(0))
    state = {
        "model": model,
        "opt": {"mu": jax.tree_util.tree_map(jnp.zeros_like, eqx.filter(model, eqx.is_array))},
        "step": 3,
    }
    save_pytree(tmp_path / "ckpt" / "train_state", state)
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps(config_to_dict(tiny_moe)))
    loaded, cfg = load_model(tmp_path / "ckpt", pytree_dir="train_state", prefix="['model']")
    assert cfg == tiny_moe
    _assert_same(loaded, model)
    assert load_pytree(tmp_path / "ckpt" / "train_state", {"step": 0}) == {"step": 3}
