"""AdamH against its update rule written out in numpy, its norm invariant, the label split, and resuming."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from schooner.train._adamh import Sphere, adamh, model_labels

B1, B2, EPS = 0.9, 0.95, 1e-8


def _params(seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "w": jnp.asarray(rng.normal(size=(5, 3)), jnp.float32),
        "stack": jnp.asarray(rng.normal(size=(2, 3, 4)), jnp.float32),
        "bias": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
        "scalar": jnp.asarray(1.5, jnp.float32),
        "fixed": jnp.asarray(rng.normal(size=(2,)), jnp.float32),
    }


LABELS = {"w": Sphere(), "stack": Sphere(axes=(1, 2)), "bias": "adam", "scalar": "adam", "fixed": "frozen"}


def _grads(params: dict, step: int) -> dict:
    rng = np.random.default_rng(100 + step)  # keys sorted: optax.apply_updates returns them sorted
    return {k: jnp.asarray(rng.normal(size=np.shape(params[k])), jnp.float32) for k in sorted(params)}


def _numpy_adamh(params: dict, steps: int, lr, adam_lr: float) -> dict:
    """The rule as written in the AdamH module docstring, in float64 numpy, leaf by leaf."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(x) for k, x in p.items()}

    def fro(x: np.ndarray, axes) -> np.ndarray:
        return np.sqrt(np.sum(x**2, axis=axes, keepdims=True))

    axes = {"w": None, "stack": (1, 2)}
    radius = {k: fro(p[k], a) for k, a in axes.items()}
    for t in range(1, steps + 1):
        g = {k: np.asarray(x, np.float64) for k, x in _grads(params, t - 1).items()}
        for k in p:
            if k == "fixed":
                continue
            m[k] = B1 * m[k] + (1 - B1) * g[k]
            v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
            u = (m[k] / (1 - B1**t)) / (np.sqrt(v[k] / (1 - B2**t)) + EPS)
            if k in axes:
                a = axes[k]
                moved = p[k] - lr(t - 1) * fro(p[k], a) * u / fro(u, a)
                p[k] = radius[k] * moved / fro(moved, a)
            else:
                p[k] = p[k] - adam_lr * u
    return p


def _run(tx: optax.GradientTransformation, params: dict, steps: int, state=None, start: int = 0):
    state = tx.init(params) if state is None else state
    step = jax.jit(tx.update)
    for t in range(start, start + steps):
        updates, state = step(_grads(params, t), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


def test_matches_the_rule_in_numpy_for_several_steps() -> None:
    schedule = optax.linear_schedule(0.05, 0.01, 6)  # the step count's convention is checked too
    params = _params()
    got, _ = _run(adamh(schedule, adam_learning_rate=0.003, b1=B1, b2=B2, eps=EPS, labels=LABELS), params, 6)
    want = _numpy_adamh(params, 6, lambda t: float(schedule(t)), 0.003)
    for k in params:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=2e-5, atol=2e-6, err_msg=k)
    np.testing.assert_array_equal(np.asarray(got["fixed"]), np.asarray(params["fixed"]))


def test_each_matrix_keeps_its_initial_norm() -> None:
    params = _params(1)
    init = np.linalg.norm(np.asarray(params["stack"]), axis=(1, 2))
    got, state = _run(adamh(0.2, adam_learning_rate=0.01, labels=LABELS), params, 40)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(got["stack"]), axis=(1, 2)), init, rtol=1e-5)
    np.testing.assert_allclose(np.linalg.norm(np.asarray(got["w"])), np.linalg.norm(params["w"]), rtol=1e-5)
    assert not np.allclose(np.asarray(got["stack"]), np.asarray(params["stack"]), atol=0.1)  # it did move
    # One radius per layer: a single norm over the stack would let one layer grow at another's expense.
    assert [r.shape for r in state.radius] == [(2, 1, 1), (1, 1)]  # leaf order: "stack", "w"


def test_the_step_is_lr_times_the_norm_before_projection() -> None:
    params = {"w": jnp.asarray(np.random.default_rng(2).normal(size=(6, 4)), jnp.float32)}
    lr = 0.03
    updates, _ = adamh(lr, adam_learning_rate=1.0).update(
        {"w": jnp.ones((6, 4))}, adamh(lr, adam_learning_rate=1.0).init(params), params
    )
    w = np.asarray(params["w"], np.float64)
    r = np.linalg.norm(w)
    # First step: u = g / (|g| + eps) = 1 elementwise; the pre-projection point is w - lr r u/|u|.
    moved = w - lr * r * np.ones_like(w) / np.sqrt(w.size)
    np.testing.assert_allclose(np.asarray(updates["w"]), r * moved / np.linalg.norm(moved) - w, atol=1e-6)


def test_default_labels_split_matrices_from_the_rest() -> None:
    params = _params(3)
    got, _ = _run(adamh(0.05, adam_learning_rate=0.002), params, 5)
    ref, _ = _run(optax.adam(0.002, b1=0.9, b2=0.95, eps=1e-8), params, 5)
    for k in ("bias", "scalar", "fixed"):  # ndim < 2: plain Adam with its own learning rate
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(ref[k]), rtol=1e-6, atol=1e-7)
    for k in ("w", "stack"):  # ndim >= 2: one sphere per leaf
        assert not np.allclose(np.asarray(got[k]), np.asarray(ref[k]), atol=1e-3)
        np.testing.assert_allclose(np.linalg.norm(np.asarray(got[k])), np.linalg.norm(params[k]), rtol=1e-5)


def test_labels_may_be_a_function_of_the_params() -> None:
    params = _params(4)
    a, _ = _run(adamh(0.05, adam_learning_rate=0.002, labels=lambda p: LABELS), params, 3)
    b, _ = _run(adamh(0.05, adam_learning_rate=0.002, labels=LABELS), params, 3)
    for k in params:
        np.testing.assert_array_equal(np.asarray(a[k]), np.asarray(b[k]))


def test_resumes_exactly_from_a_saved_state(tmp_path) -> None:
    from schooner.model import load_pytree, save_pytree

    tx = adamh(0.05, adam_learning_rate=0.002, labels=LABELS)
    params = _params(5)
    straight, _ = _run(tx, params, 6)
    half, state = _run(tx, params, 3)
    save_pytree(tmp_path / "opt", {"params": half, "state": state})
    like = jax.eval_shape(lambda: {"params": half, "state": state})
    back = load_pytree(tmp_path / "opt", like)
    resumed, _ = _run(tx, back["params"], 3, state=back["state"], start=3)
    for k in params:
        np.testing.assert_array_equal(np.asarray(resumed[k]), np.asarray(straight[k]), err_msg=k)


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        ({**LABELS, "bias": "sgd"}, r"parameter \['bias'\] must be 'adam', 'frozen', 'adamh' or a Sphere"),
        (
            {**LABELS, "bias": Sphere()},
            r"parameter \['bias'\] has shape \(3,\) \(ndim 1 < 2\): label it 'adam'",
        ),
        ({**LABELS, "stack": Sphere(axes=(1, 3))}, r"Sphere.axes=\(1, 3\) of parameter \['stack'\]"),
        ({"w": "adam"}, "shaped like the parameters"),
    ],
)
def test_bad_labels_are_named(labels, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        adamh(0.05, adam_learning_rate=0.002, labels=labels).init(_params())


def test_a_zero_matrix_is_refused_with_its_path() -> None:
    params = {**_params(), "stack": jnp.zeros((2, 3, 4)).at[0].set(1.0)}  # layer 1 is all zeros
    with pytest.raises(ValueError, match=r"parameter \['stack'\] .* norm 0 \(zero-initialised\)"):
        adamh(0.05, adam_learning_rate=0.002, labels=LABELS).init(params)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"learning_rate": 0.0}, "learning_rate must be a finite number > 0"),
        ({"adam_learning_rate": float("nan")}, "adam_learning_rate must be a finite number > 0"),
        ({"b2": 1.0}, r"b2 must be in \[0, 1\)"),
        ({"eps": 0.0}, "eps must be > 0"),
    ],
)
def test_bad_settings_are_named(kw: dict, message: str) -> None:
    args = {"learning_rate": 0.05, "adam_learning_rate": 0.002, **kw}
    with pytest.raises(ValueError, match=message):
        adamh(args.pop("learning_rate"), **args)


def test_model_labels_put_each_layer_of_a_projection_on_its_own_sphere(nano) -> None:
    from schooner.model import init

    model = init(nano(), key=jax.random.PRNGKey(0))
    labels = model_labels(model)
    assert labels.layers.stacked.attn.q_proj == Sphere(axes=(1, 2, 3))  # [layers, embed, heads, head_dim]
    assert labels.layers.stacked.mlp.down == Sphere(axes=(1, 2))
    assert (labels.embed, labels.final_norm, labels.layers.stacked.attn_norm) == ("adam", "adam", "adam")
    untied = jax.eval_shape(lambda: init(nano(tie_embeddings=False), key=jax.random.PRNGKey(0)))  # shapes do
    assert model_labels(untied, sphere_kinds=("matrix", "head")).lm_head == Sphere(axes=(0, 1))
    tx = adamh(0.3, adam_learning_rate=0.01, labels=labels)
    leaves, treedef = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.PRNGKey(1), len(leaves))
    grads = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
    updates, _ = jax.jit(tx.update)(grads, tx.init(model), model)
    moved = optax.apply_updates(model, updates)
    before = np.asarray(model.layers.stacked.attn.q_proj.array)
    after = np.asarray(moved.layers.stacked.attn.q_proj.array)
    per_layer = lambda q: np.linalg.norm(q.reshape(q.shape[0], -1), axis=1)  # noqa: E731
    np.testing.assert_allclose(per_layer(after), per_layer(before), rtol=1e-5)
    assert np.linalg.norm(after - before) > 0.1 * np.linalg.norm(before)  # it moved (about lr x ||W||)
    with pytest.raises(ValueError, match="sphere_kinds must be among"):
        model_labels(model, sphere_kinds=("matrices",))


@pytest.mark.slow
def test_a_model_trains_with_its_projections_on_spheres(nano) -> None:
    """A real schooner model: matrices per layer keep their norms, embeddings and norms move freely, the
    loss falls."""
    from haliax import NamedArray

    from schooner.model import init, loss_fn

    model = init(nano(), key=jax.random.PRNGKey(0))
    labels = model_labels(model)
    tx = adamh(0.02, adam_learning_rate=3e-3, labels=labels)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 32), 0, 64)  # a small vocabulary it can learn

    @jax.jit
    def step(m, s):
        (loss, _), g = jax.value_and_grad(lambda m: loss_fn(m, tokens), has_aux=True)(m)
        u, s = tx.update(g, s, m)
        return optax.apply_updates(m, u), s, loss

    def norms(m):
        q = np.asarray(m.layers.stacked.attn.q_proj.array)  # [layers, embed, heads, head_dim]
        return np.linalg.norm(q.reshape(q.shape[0], -1), axis=1)

    state, start, losses = tx.init(model), norms(model), []
    m = model
    for _ in range(15):
        m, state, loss = step(m, state)
        losses.append(float(loss))
    np.testing.assert_allclose(norms(m), start, rtol=1e-5)
    assert isinstance(m.embed, NamedArray)
    assert losses[-1] < losses[0] - 0.5, losses


def test_state_shards_like_the_trainer_shards_it(nano) -> None:
    """As the trainer does: the state's shardings from its abstract shape (moments follow the parameters' named
    axes, the radii replicate), built under jit on a 2 x 4 mesh, one step equal to the unsharded step."""
    from jax.sharding import Mesh

    from schooner.model import init, model_shardings, param_axis_mapping

    if jax.device_count() < 8:
        pytest.skip("needs 8 (fake) devices: the root conftest sets --xla_force_host_platform_device_count=8")
    mesh = Mesh(np.array(jax.devices()[:8]).reshape(2, 4), ("data", "model"))
    mapping = param_axis_mapping(data_axis="data", model_axis="model")
    model = init(nano(), key=jax.random.PRNGKey(0))
    tx = adamh(0.05, adam_learning_rate=1e-3, labels=model_labels(model))
    abstract = jax.eval_shape(lambda m: (m, tx.init(m)), model)
    shardings = model_shardings(abstract, mesh, mapping)
    assert shardings[1].mu.layers.stacked.mlp.up.spec == shardings[0].layers.stacked.mlp.up.spec
    model_s, state_s = jax.jit(lambda m: (m, tx.init(m)), out_shardings=shardings)(model)
    leaves, treedef = jax.tree.flatten(model)
    keys = jax.random.split(jax.random.PRNGKey(2), len(leaves))
    grads = treedef.unflatten([jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])
    step = jax.jit(tx.update, out_shardings=(shardings[0], shardings[1]))
    sharded, _ = step(jax.device_put(grads, shardings[0]), state_s, model_s)
    plain, _ = jax.jit(tx.update)(grads, tx.init(model), model)
    for a, b in zip(jax.tree.leaves(sharded), jax.tree.leaves(plain), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-7)
