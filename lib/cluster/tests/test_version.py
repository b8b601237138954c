"""Version keys: canonical JSON of (name, config with inputs as keys, version); properties with hypothesis."""

from __future__ import annotations

import copy
import dataclasses
import enum
import functools
import hashlib
import json
import logging
import math
import os
import random
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from schooner.cluster import ConfigError, ResourceConfig, Secret, runtime_field, secret_field, step
from schooner.cluster.runner._version import canonicalize, code_fingerprint

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
json_like = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.text(max_size=8), inner, max_size=4),
    ),
    max_leaves=20,
)


@dataclass(frozen=True)
class Inner:
    a: Any
    b: int = 0


@dataclass(frozen=True)
class Outer:
    payload: Any
    inner: Inner
    input: Any = None
    workers: int = runtime_field(1)


@dataclass(frozen=True)
class AdamLike:
    learning_rate: float


@dataclass(frozen=True)
class MuonLike:
    learning_rate: float


def fn(config: Any, out: str) -> None:
    return None


def other_fn(config: Any, out: str) -> None:
    return None


def _shuffled(value: Any, rng: random.Random) -> Any:
    """The same value with every dict rebuilt in a random insertion order."""
    if isinstance(value, dict):
        items = list(value.items())
        rng.shuffle(items)
        return {k: _shuffled(v, rng) for k, v in items}
    if isinstance(value, list):
        return [_shuffled(v, rng) for v in value]
    return value


def _leaf_paths(value: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(value, dict) and value:
        return [p for k, v in value.items() for p in _leaf_paths(v, (*path, k))]
    if isinstance(value, list) and value:
        return [p for i, v in enumerate(value) for p in _leaf_paths(v, (*path, i))]
    return [path]


def _changed(value: Any, path: tuple) -> Any:
    """`value` with the leaf at `path` replaced by something of a different canonical form."""
    if not path:
        if isinstance(value, str):
            return value + "x"
        if isinstance(value, bool) or value is None:
            return 7
        if isinstance(value, int):
            return value + 1
        if isinstance(value, float):
            return 0.5 if (math.isnan(value) or value != 0.5) else 0.25
        return [value, 1] if isinstance(value, list) else {"k": 1}
    head, *rest = path
    if isinstance(value, dict):
        return {k: (_changed(v, tuple(rest)) if k == head else v) for k, v in value.items()}
    return [(_changed(v, tuple(rest)) if i == head else v) for i, v in enumerate(value)]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=json_like, seed=st.integers(0, 2**16))
def test_key_is_stable_under_dict_ordering_and_equal_configs(payload: Any, seed: int) -> None:
    a = step("s", fn, Outer(payload=payload, inner=Inner(a=payload)))
    shuffled = _shuffled(payload, random.Random(seed))
    b = step("s", fn, Outer(payload=shuffled, inner=Inner(a=_shuffled(payload, random.Random(seed + 1)))))
    assert a.key == b.key
    assert a == b and hash(a) == hash(b)


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=json_like, data=st.data())
def test_any_change_to_a_versioned_field_changes_the_key(payload: Any, data: st.DataObject) -> None:
    paths = _leaf_paths(payload)
    path = data.draw(st.sampled_from(paths))
    changed = _changed(payload, path)
    base = step("s", fn, Outer(payload=payload, inner=Inner(a=1)))
    assert step("s", fn, Outer(payload=changed, inner=Inner(a=1))).key != base.key
    assert step("s", fn, Outer(payload=payload, inner=Inner(a=1, b=1))).key != base.key
    assert step("s", fn, Outer(payload=payload, inner=Inner(a=1)), version="v2").key != base.key
    assert step("t", fn, Outer(payload=payload, inner=Inner(a=1))).key != base.key


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(payload=json_like, upstream=json_like)
def test_an_input_key_change_changes_the_key_and_runtime_args_do_not(payload: Any, upstream: Any) -> None:
    up = step("up", fn, {"x": upstream})
    up2 = step("up", fn, {"x": [upstream]})
    base = step("s", fn, Outer(payload=payload, inner=Inner(a=0), input=up / "train"))
    assert step("s", fn, Outer(payload=payload, inner=Inner(a=0), input=up2 / "train")).key != base.key
    assert step("s", fn, Outer(payload=payload, inner=Inner(a=0), input=up / "valid")).key != base.key
    same = step(
        "s",
        other_fn,
        Outer(payload=payload, inner=Inner(a=0), input=up / "train", workers=64),
        resources=ResourceConfig.with_cpu(8, ram="4GiB"),
        override_output_path="/elsewhere/x",
        description="runtime only",
    )
    assert same.key == base.key


def test_key_is_sha256_of_the_documented_canonical_json() -> None:
    up = step("up", fn, {"n": 1})
    h = step("tok/x", fn, Outer(payload={"b": [1, 2.5, None], "a": "é"}, inner=Inner(a=up)), version="v3")
    code = code_fingerprint(fn)
    assert code is not None and len(code) == 64 and up.code == h.code == code
    up_text = '{"code":"' + code + '","config":{"n":1},"name":"up","version":null}'
    assert up.key == hashlib.sha256(up_text.encode()).hexdigest()
    text = (
        '{"code":"'
        + code
        + '","config":{"__class__":"Outer","inner":{"__class__":"Inner","a":{"__step__":"'
        + up.key
        + '"},"b":0},'
        '"input":null,"payload":{"a":"é","b":[1,2.5,null]}},"name":"tok/x","version":"v3"}'
    )
    assert h.key == hashlib.sha256(text.encode("utf-8")).hexdigest()
    assert h.dir_name == f"tok/x-{h.key[:8]}"
    # A library function (a step builder's) is named by its version string, not read.
    lib = step("up", json.dumps, {"n": 1})
    assert lib.code is None
    assert lib.key == hashlib.sha256(b'{"code":null,"config":{"n":1},"name":"up","version":null}').hexdigest()


_EXPERIMENT = """
import sys
from dataclasses import dataclass
from schooner.cluster import step

def my_filter(x):
    return x

def fn(c, o):
    pass

@dataclass(frozen=True)
class Cfg:
    threshold: float
    pipeline: object

h = step("s", fn, Cfg(threshold=2.0, pipeline=my_filter))
if __name__ == "__main__":
    print(h.key)
"""


def _key_of(script: str, cwd: str, *args: str, **env: str) -> str:
    full = {**os.environ, **env}
    out = subprocess.run([sys.executable, *args, script], cwd=cwd, env=full, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def test_where_and_how_an_experiment_is_started_does_not_enter_the_key(tmp_path) -> None:
    """The same experiment file in two folders, started from different working directories and prefixes,
    as a script and imported from another file: one key."""
    keys = set()
    for folder in ("a/deep/exp", "b"):
        d = tmp_path / folder
        d.mkdir(parents=True)
        (d / "base_exp.py").write_text(_EXPERIMENT)
        keys.add(_key_of(str(d / "base_exp.py"), str(tmp_path), SCHOONER_PREFIX=str(d / "out")))
        keys.add(_key_of("base_exp.py", str(d)))
        (d / "other.py").write_text("from base_exp import h\nprint(h.key)\n")
        keys.add(_key_of("other.py", str(d)))
    # In a package: run as a script, and imported under its package name from another experiment.
    pkg = tmp_path / "c" / "experiments"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "base_exp.py").write_text(_EXPERIMENT)
    (pkg / "exp2.py").write_text("from experiments.base_exp import h\nprint(h.key)\n")
    in_pkg = {
        _key_of(str(pkg / "base_exp.py"), str(tmp_path)),
        _key_of("experiments/exp2.py", str(tmp_path / "c"), PYTHONPATH=str(tmp_path / "c")),
    }
    assert len(keys) == 1, keys
    assert len(in_pkg) == 1, in_pkg


def test_equal_values_give_equal_keys() -> None:
    assert step("o", fn, AdamLike(1)).key == step("o", fn, AdamLike(1.0)).key
    assert step("o", fn, {"x": [2, -3.0]}).key == step("o", fn, {"x": [2.0, -3]}).key
    assert step("o", fn, {"x": 1.5}).key != step("o", fn, {"x": 1}).key
    assert step("o", fn, {"x": 2.0**70}).key != step("o", fn, {"x": 2**70 + 1}).key


@dataclass(frozen=True)
class Routing:
    """Settings whose names end in `_token` like a credential's would: all of them are settings."""

    num_experts_per_token: int = 1
    eot_token: str = "<|endoftext|>"
    min_chars_per_token: float = 2.0
    token: str = "t"


@pytest.mark.parametrize(
    "change",
    [{"num_experts_per_token": 2}, {"eot_token": "</s>"}, {"min_chars_per_token": 3.5}, {"token": "u"}],
)
def test_fields_named_like_tokens_are_part_of_the_key(change: dict) -> None:
    """Top-1 and top-2 MoE routing are two models: a name never makes a field a secret."""
    base = step("moe", fn, Routing())
    changed = step("moe", fn, Routing(**change))
    assert changed.key != base.key
    field = next(iter(change))
    assert field in changed.canonical_config and changed.canonical_config[field] == change[field]
    assert (
        step("moe", fn, {field: change[field]}).key != step("moe", fn, {field: getattr(Routing(), field)}).key
    )


@dataclass(frozen=True)
class Download:
    repo: str
    hf_token: str | None = secret_field(None)
    api: Any = None
    extra: Any = None
    marked: str = dataclasses.field(default="", metadata={"secret": True})


def test_marked_secrets_are_runtime_only() -> None:
    a = step(
        "dl",
        fn,
        Download("org/model", "hf_aaaa", api=Secret("k1-aaaaaa"), marked="pw-1", extra=[Secret("xx-1")]),
    )
    b = step(
        "dl",
        fn,
        Download("org/model", "hf_bbbb", api=Secret("k2-bbbbbb"), marked="pw-2", extra=[Secret("xx-2")]),
    )
    assert a.key == b.key  # rotating a token reruns nothing
    assert (
        step("dl", fn, Download("org/model")).key
        == step("dl", fn, Download("org/model", api=Secret("kkkk"))).key
    )
    assert b.config.hf_token == "hf_bbbb" and b.config.api.get() == "k2-bbbbbb"  # the step still gets them
    assert step("dl", fn, Download("org/other", "hf_aaaa")).key != a.key
    assert (
        step("dl", fn, {"repo": "r", "token": Secret("s1-s")}).key
        == step("dl", fn, {"repo": "r", "token": None}).key
    )
    text = json.dumps(a.canonical_config)
    assert all(v not in text for v in ("hf_aaaa", "k1-aaaaaa", "pw-1", "xx-1")) and "hf_token" not in text
    assert repr(a.config.api) == "Secret('***')" and "k1" not in str(a.config.api)


def test_key_is_the_same_in_another_process_with_another_hash_seed() -> None:
    code = textwrap.dedent("""
        from schooner.cluster import step
        def fn(c, o): pass
        up = step("up", fn, {"tags": frozenset({"a", "b", "c", "d"}), 3: (1, 2)})
        print(step("s", fn, {"d": {up: 1.0, up / "x": 2.0}, "s": {"z", "y", "x"}}).key)
    """)
    keys = set()
    for seed in ("1", "2", "3"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
        )
        keys.add(out.stdout.strip())
    assert len(keys) == 1 and len(keys.pop()) == 64


def test_handle_keyed_dicts_are_sorted_pairs_independent_of_order() -> None:
    a, b = step("a", fn, {"i": 1}), step("b", fn, {"i": 2})
    one = canonicalize({a: 1.0, b: 2.0})
    two = canonicalize({b: 2.0, a: 1.0})
    assert one == two
    pairs = one["__dict__"]
    assert sorted(p[0]["__step__"] for p in pairs) == [p[0]["__step__"] for p in pairs]
    assert {p[0]["__step__"]: p[1] for p in pairs} == {a.key: 1.0, b.key: 2.0}
    assert step("t", fn, {"d": {a: 1.0, b: 2.0}}).key != step("t", fn, {"d": {a: 2.0, b: 1.0}}).key


def test_types_that_look_alike_have_different_keys() -> None:
    assert step("o", fn, AdamLike(1e-3)).key != step("o", fn, MuonLike(1e-3)).key
    assert step("o", fn, {"x": 1}).key != step("o", fn, {"x": True}).key
    assert step("o", fn, {"x": "1"}).key != step("o", fn, {"x": 1}).key
    assert step("o", fn, {1: "a"}).key != step("o", fn, {"1": "a"}).key
    assert step("o", fn, {"x": float("nan")}).key == step("o", fn, {"x": float("nan")}).key


class Color(enum.Enum):
    RED = 1


def test_enums_callables_and_canonical_hooks() -> None:
    class Tok:
        def __init__(self, fingerprint: str) -> None:
            self.fingerprint = fingerprint

        def __schooner_canonical__(self) -> dict:
            return {"tokenizer": self.fingerprint}

    assert canonicalize(Color.RED) == {"__enum__": "Color.RED"}
    assert canonicalize(json.dumps) == {"__callable__": "json:dumps"}
    assert canonicalize(Tok("abc")) == {"tokenizer": "abc"}
    assert step("o", fn, {"t": Tok("abc")}).key != step("o", fn, {"t": Tok("abd")}).key


@pytest.mark.parametrize(
    ("value", "field", "words"),
    [
        (object(), "config.payload", "no canonical JSON form"),
        (lambda x: x, "config.payload", "lambda or local function"),
        ({"deep": [1, {2, 3}, {"x": object()}]}, "config.payload['deep'][2]['x']", "no canonical JSON form"),
    ],
)
def test_unserialisable_configs_name_the_step_and_the_field(value: Any, field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        step("my/step", fn, Outer(payload=value, inner=Inner(a=1)))
    assert "'my/step'" in str(err.value) and field in str(err.value) and words in str(err.value)


def test_runtime_fields_cannot_hold_inputs() -> None:
    up = step("up", fn, {})

    @dataclass(frozen=True)
    class Cfg:
        data: Any = dataclasses.field(default=None, metadata={"schooner_runtime": True})

    with pytest.raises(ConfigError, match="runtime-only field"):
        step("s", fn, Cfg(data=up))


@dataclass(frozen=True)
class Threshold:
    limit: int

    def keep(self, record: dict) -> bool:
        return len(record["text"]) >= self.limit


def test_a_bound_method_is_keyed_with_its_object() -> None:
    """`Threshold(10).keep` and `Threshold(1000).keep` filter differently: they are two configs."""
    assert (
        step("f", fn, {"keep": Threshold(10).keep}).key != step("f", fn, {"keep": Threshold(1000).keep}).key
    )
    assert step("f", fn, {"keep": Threshold(10).keep}).key == step("f", fn, {"keep": Threshold(10).keep}).key
    with pytest.raises(ConfigError, match=r"config\['keep'\]\.__self__"):
        step("f", fn, {"keep": Unkeyable().method})


class Unkeyable:
    def method(self) -> None:
        return None


def test_partials_are_keyed_with_their_arguments() -> None:
    a = step("f", fn, {"f": functools.partial(other_fn, out="a")})
    assert a.key != step("f", fn, {"f": functools.partial(other_fn, out="b")}).key
    assert a.key == step("f", fn, {"f": functools.partial(other_fn, out="a")}).key


@pytest.mark.parametrize(
    ("one", "other"),
    [
        ({"x": {"__float__": "nan"}}, {"x": float("nan")}),
        ({"x": {"__float__": "inf"}}, {"x": float("inf")}),
        ({"x": {"__step__": "0" * 64}}, {"x": {"__dict__": [["__step__", "0" * 64]]}}),
        ({"x": {"__class__": "Inner", "a": 1, "b": 0}}, {"x": Inner(a=1)}),
        ({"x": {"__set__": [1, 2]}}, {"x": {1, 2}}),
        ({"x": {"__bytes__": "6869"}}, {"x": b"hi"}),
        ({"x": {"__tuple__": [1, 2]}}, {"x": (1, 2)}),
        ({"x": -0.0}, {"x": 0.0}),
        ({"x": -0.0}, {"x": 0}),
        ({"x": (1, 2)}, {"x": [1, 2]}),
        ({"x": ()}, {"x": []}),
        ({"x": [(1,), [2]]}, {"x": [[1], (2,)]}),
    ],
)
def test_values_that_merely_look_alike_have_different_keys(one: Any, other: Any) -> None:
    """Dicts shaped like the canonical form's own tags, -0.0 and 0.0, tuples and lists: each pair is two
    different configs, so two different keys."""
    assert step("o", fn, one).key != step("o", fn, other).key
    assert step("o", fn, one).key == step("o", fn, copy.deepcopy(one)).key  # and each is stable


def test_a_lone_surrogate_is_a_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match=r"'my/step'.*config\.payload\['name'\].*not valid Unicode"):
        step("my/step", fn, Outer(payload={"name": "ab\ud800cd"}, inner=Inner(a=1)))
    with pytest.raises(ConfigError, match=r"config\.payload<key .*not valid Unicode"):
        step("my/step", fn, Outer(payload={"k\udfff": 1}, inner=Inner(a=1)))
    assert step("ok", fn, {"name": "naïve ☃ 𝔘"}).key  # valid non-ASCII text is fine


def test_deep_nesting_is_a_config_error_naming_the_field() -> None:
    deep: Any = 1
    for _ in range(5000):
        deep = [deep]
    with pytest.raises(ConfigError, match=r"'my/step'.*config\.payload\[0\]\[0\].*nested more than"):
        step("my/step", fn, Outer(payload=deep, inner=Inner(a=1)))
    nested: Any = {}
    for _ in range(5000):
        nested = {"a": nested}
    with pytest.raises(ConfigError, match="nested more than"):
        step("my/step", fn, {"n": nested})
    ok: Any = 1
    for _ in range(45):
        ok = {"a": [ok]}
    assert step("fine", fn, {"n": ok}).key  # 90 levels is still a config


@dataclass(frozen=True)
class Fetch:
    repo: str
    hf_token: str = ""
    eot_token: str = "<|eot_id|>"
    num_experts_per_token: int = 2


def test_an_unmarked_field_named_like_a_credential_is_keyed_but_warned_about(caplog) -> None:
    """Names never decide what is secret (they dropped num_experts_per_token from keys); a field named like
    a credential but not marked is keyed and recorded as it is, and the user is told once how to mark it."""
    fn = lambda config, out: None  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="schooner.cluster"):
        a = step("dl", fn, Fetch("r", hf_token="hf_ABCDEFGHIJKLMNOP"))
        b = step("dl", fn, Fetch("r", hf_token="hf_QRSTUVWXYZ123456"))
        step("dl", fn, Fetch("r", hf_token="hf_QRSTUVWXYZ123456"))
    assert a.key != b.key
    warned = [r.getMessage() for r in caplog.records if "named like a credential" in r.getMessage()]
    assert len(warned) == 1 and "hf_token" in warned[0] and "secret_field()" in warned[0], warned
    assert "eot_token" not in warned[0] and "num_experts_per_token" not in warned[0]


def test_an_added_field_at_its_default_keeps_the_key_the_config_had_without_it() -> None:
    from dataclasses import field, make_dataclass

    from schooner.cluster import added_field

    before = make_dataclass("Cfg", [("a", int)], frozen=True)
    after = make_dataclass(
        "Cfg",
        [
            ("a", int),
            ("flag", bool, added_field(False)),
            ("rounds", tuple, added_field(default_factory=tuple)),
        ],
        frozen=True,
    )
    plain = make_dataclass("Cfg", [("a", int), ("flag", bool, field(default=False))], frozen=True)

    def key(config: Any) -> str:
        return step("s", fn, config).key

    assert key(after(a=1)) == key(before(a=1)) != key(before(a=2))
    assert key(after(a=1, flag=True)) != key(before(a=1))  # set: keyed like any field
    assert key(after(a=1, rounds=(3,))) not in (key(before(a=1)), key(after(a=1, flag=True)))
    assert key(after(a=1, rounds=())) == key(before(a=1))  # the factory's default
    assert key(plain(a=1)) != key(before(a=1))  # what a plain new field does: the test can fail
    assert canonicalize(after(a=1, flag=True)) == {"__class__": "Cfg", "a": 1, "flag": True}
    with pytest.raises(TypeError, match="added_field needs a default"):
        added_field()
