"""Step handles, input paths, config resolution, the decorator form and lowering."""

from __future__ import annotations

from collections import namedtuple
from dataclasses import dataclass
from typing import Any

import pytest

from schooner.cluster import ConfigError, InputPath, ResourceConfig, Step, StepDef, StepHandle, lower, step
from schooner.cluster.runner._step import resolve_config


@dataclass(frozen=True)
class TokenizeConfig:
    input: Any
    tokenizer: str
    seq_hint: int = 0


@dataclass(frozen=True)
class TrainConfig:
    datasets: Any
    model: Any
    steps: int = 10


Pair = namedtuple("Pair", "left right")


def run_tokenize(config: TokenizeConfig, out: str) -> None:
    return None


def run_train(config: TrainConfig, out: str) -> None:
    return None


def tokenized(name: str, *, source: Any, tokenizer: str = "bpe") -> StepHandle:
    """A builder as another package writes one."""
    return step(name, run_tokenize, TokenizeConfig(input=source, tokenizer=tokenizer), version="tokenize-v1")


def test_handles_are_lazy_hashable_values_and_divide_into_input_paths() -> None:
    calls = []
    h = step("raw", lambda c, o: calls.append(o), {"n": 1})
    assert calls == []  # nothing runs at build time
    assert isinstance(h / "train", InputPath)
    assert (h / "a" / "b/").path == "a/b" and (h / "a" / "b").step is h
    assert {h: 1}[step("raw", lambda c, o: calls.append(o), {"n": 1})] == 1  # same key -> same dict key
    assert step("raw", lambda c, o: None, {"n": 1}) != h  # other code: another step
    with pytest.raises(ValueError, match=r"'\.\.'"):
        h / "../escape"


@pytest.mark.parametrize("name", ["", "/abs", "a b", "a/../b", "a//b", "trailing/", None, "ünïcode"])
def test_bad_step_names_are_refused_with_the_rule(name: Any) -> None:
    with pytest.raises(ValueError, match="step name"):
        step(name, run_train, {})


def test_bad_arguments_name_the_step() -> None:
    with pytest.raises(TypeError, match="'s': version must be a string"):
        step("s", run_train, {}, version=2)
    with pytest.raises(TypeError, match="'s': resources must be a ResourceConfig"):
        step("s", run_train, {}, resources={"cpu": 1})
    with pytest.raises(TypeError, match="'s': fn must be a function"):
        step("s", "run_train", {})


def test_seed_example_shape_handle_keyed_dict_across_builders() -> None:
    raw = step("raw", run_tokenize, {"files": ["a.txt"]})
    docs = tokenized("tokenized/docs", source=raw)
    code = tokenized("tokenized/code", source=raw / "code")
    model = step(
        "checkpoints/nano",
        run_train,
        TrainConfig(datasets={docs: 1.0, code: 0.5}, model={"d": 8}),
        resources=ResourceConfig.with_cpu(),
    )
    steps = lower(model)
    assert [s.name for s in steps] == ["raw", "tokenized/docs", "tokenized/code", "checkpoints/nano"]
    assert steps[-1].deps == (docs.key, code.key)
    assert dict(steps[1].input_fields) == {"config.input": raw.key}
    # The same graph given as a list of lowered steps or handles lowers to the same steps.
    assert [s.key for s in lower([lower(model), docs])] == [s.key for s in steps]


def test_resolve_replaces_handles_and_input_paths_everywhere() -> None:
    a, b = step("a", run_train, {"i": 1}), step("b", run_train, {"i": 2})
    cfg = TrainConfig(
        datasets={a: 1.0, b / "train": 2.0, "fixed": [a, (b, "x")], "pair": Pair(a / "p", 3)},
        model=TokenizeConfig(input=b, tokenizer="t"),
    )
    resolved = resolve_config(cfg, lambda h: f"/out/{h.name}")
    assert resolved == TrainConfig(
        datasets={
            "/out/a": 1.0,
            "/out/b/train": 2.0,
            "fixed": ["/out/a", ("/out/b", "x")],
            "pair": Pair("/out/a/p", 3),
        },
        model=TokenizeConfig(input="/out/b", tokenizer="t"),
    )
    assert type(resolved.datasets["pair"]) is Pair
    plain = TokenizeConfig(input="x", tokenizer="t")
    assert resolve_config(plain, lambda h: "") is plain  # nothing to resolve: the same object


def test_decorator_forms() -> None:
    @step(version="v7", resources=ResourceConfig.with_cpu(2))
    def count_words(config: dict, output_path: str) -> dict:
        """Count words."""
        return {"n": 1}

    @step
    def plain(config: dict, output_path: str) -> None:
        return None

    assert isinstance(count_words, StepDef) and isinstance(plain, StepDef)
    h = count_words("counts/a", {"x": 1})
    assert h.version == "v7" and h.resources.cpu == 2.0 and h.description == "Count words."
    assert h.key == step("counts/a", count_words.fn, {"x": 1}, version="v7").key
    assert count_words.fn({}, "/tmp") == {"n": 1}
    assert plain("p", {}).version is None
    with pytest.raises(TypeError, match="decorator"):
        step("name-only")
    with pytest.raises(TypeError) as info:  # the message lacked its f prefix: it showed "{name!r}" as is
        step("name-only", plain.fn)
    assert "got name='name-only', fn=<function " in str(info.value) and "{" not in str(info.value)


def test_lower_deduplicates_equal_steps_and_orders_inputs_first() -> None:
    raw1 = step("raw", run_tokenize, {"f": 1})
    raw2 = step("raw", run_tokenize, {"f": 1})  # built twice: one step
    a = tokenized("tok/a", source=raw1)
    b = tokenized("tok/b", source=raw2)
    steps = lower([b, a, b])
    assert [s.name for s in steps] == ["raw", "tok/b", "tok/a"]
    assert all(isinstance(s, Step) for s in steps)


def test_lower_handles_long_chains_without_recursion_limits() -> None:
    h = step("s0", run_train, {"i": 0})
    for i in range(1, 2500):
        h = step(f"s{i}", run_train, {"prev": h, "i": i})
    steps = lower(h)
    assert len(steps) == 2500 and steps[0].name == "s0" and steps[-1].name == "s2499"


def test_cycle_is_reported_with_steps_and_fields() -> None:
    cfg_a: dict = {"n": 1}
    a = step("a", run_train, cfg_a)
    b = step("b", run_train, {"upstream": a})
    cfg_a["back"] = [b]  # mutated after step(): a -> b -> a
    with pytest.raises(ConfigError) as err:
        lower(b)
    text = str(err.value)
    assert (
        "cycle" in text
        and "'b' (field config['upstream'])" in text
        and "'a' (field config['back'][0])" in text
    )


def test_mutated_config_is_refused() -> None:
    cfg = {"n": 1}
    h = step("m", run_train, cfg)
    cfg["n"] = 2
    with pytest.raises(ConfigError, match="'m': its config was changed after step"):
        lower(h)


def test_same_key_with_different_functions_is_an_error() -> None:
    a = step("same", run_train, {"x": 1})
    b = step("same", run_tokenize, {"x": 1})
    with pytest.raises(ValueError, match="different functions"):
        lower([a, step("user", run_train, {"i": b})])


def test_two_steps_cannot_share_an_override_path() -> None:
    a = step("a", run_train, {}, override_output_path="/data/shared")
    b = step("b", run_train, {}, override_output_path="/data/shared/")
    with pytest.raises(ConfigError, match="both set override_output_path"):
        lower([a, b])
    assert a.output_path("/prefix") == "/data/shared"


def test_lower_rejects_non_steps() -> None:
    with pytest.raises(TypeError, match="step handles"):
        lower(["not a step"])


def test_one_step_built_twice_with_different_runtime_arguments_is_refused() -> None:
    a = step("same", run_train, {"x": 1}, resources=ResourceConfig.with_cpu(1))
    b = step("same", run_train, {"x": 1}, resources=ResourceConfig.with_cpu(4))
    with pytest.raises(ConfigError, match="built twice with different resources"):
        lower([a, step("user", run_train, {"i": b})])
    c = step("same", run_train, {"x": 1}, resources=ResourceConfig.with_cpu(1))
    assert len(lower([a, c])) == 1  # equal runtime arguments: simply one step


@pytest.mark.parametrize(
    ("name", "said"),
    [("exp/café", "'é' (position 7)"), ("exp/a b", "' ' (position 5)"), ("exp/a:b", "':' (position 5)")],
)
def test_a_bad_step_name_names_the_character_that_is_not_allowed(name: str, said: str) -> None:
    # 'exp/café' was refused with "use letters, digits and ...": é is a letter; the rule is ASCII letters.
    with pytest.raises(ValueError, match="ASCII letters") as err:
        step(name, run_train, {})
    assert said in str(err.value)
