"""The package's layout: no import circle inside schooner.eval (module-level, function-local and type-only
imports alike), and the names that left `schooner.eval.steps` still import from there, with a warning."""

from __future__ import annotations

import ast
import importlib
import pathlib

import pytest

import schooner.eval

SOURCE = pathlib.Path(schooner.eval.__file__).parent
PACKAGE = "schooner.eval"


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for path in SOURCE.rglob("*.py"):
        parts = list(path.relative_to(SOURCE).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join([PACKAGE, *parts])] = path
    return out


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its source (every `import` statement, wherever it
    sits: module level, inside a function, under `if TYPE_CHECKING:`)."""
    modules = _modules()
    edges: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        base = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = base.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    origin = ".".join(parts + ([node.module] if node.module else []))
                else:
                    origin = node.module or ""
                targets = [origin] + [f"{origin}.{a.name}" for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[module].add(target)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_circle_finder_finds_a_circle_through_a_function_local_import():
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(edges) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_every_kind_of_import():
    edges = import_graph()
    assert "schooner.eval._evaluate_step" in edges["schooner.eval.steps"]  # module level
    assert "schooner.eval._taskspec" in edges["schooner.eval._task_texts"]  # inside a function
    assert "schooner.eval.harness" in edges["schooner.eval.lm_eval_cli"]


def test_no_import_circle_in_schooner_eval():
    assert circles(import_graph()) == []


def test_steps_holds_the_step_builders():
    import schooner.eval.steps as steps

    assert sorted(steps.__all__) == sorted(
        [
            "EvaluateCheckpointsConfig",
            "EvaluateConfig",
            "TaskLike",
            "TaskTextsConfig",
            "evaluate",
            "evaluate_checkpoints",
            "task_texts",
        ]
    )
    lines = (SOURCE / "steps.py").read_text(encoding="utf-8").count("\n")
    assert lines < 250, f"steps.py has {lines} lines; builders only"


MOVED = {
    "TaskInput": "schooner.eval._step_config",
    "SuiteInput": "schooner.eval._step_config",
    "task_inputs": "schooner.eval._step_config",
    "CheckpointInput": "schooner.eval._step_config",
    "checkpoint_input": "schooner.eval._step_config",
    "resolve_cache_path": "schooner.eval._evaluate_step",
    "scores_table": "schooner.eval._evaluate_step",
}


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_steps_still_imports_from_there_with_a_warning(name):
    import schooner.eval.steps as steps

    with pytest.warns(DeprecationWarning, match=rf"schooner\.eval\.steps\.{name} .*next release"):
        old = getattr(steps, name)
    assert old is getattr(importlib.import_module(MOVED[name]), name)


def test_from_import_of_a_moved_name_warns_too():
    with pytest.warns(DeprecationWarning, match="scores_table"):
        from schooner.eval.steps import scores_table  # noqa: F401


def test_an_unknown_name_is_still_an_attribute_error():
    import schooner.eval.steps as steps

    with pytest.raises(AttributeError, match="no_such_name"):
        steps.no_such_name  # noqa: B018
