"""The workspace's import rules, checked from the source text (stdlib only; nothing of the project is imported).

Three rules from DESIGN.md, each over every import statement: module-level, function-local (lazy), under
`if TYPE_CHECKING:` and `importlib.import_module("...")` with a literal name alike.

- **No import circle inside a package.** Each package's modules (`lib/*/src/schooner/<pkg>/**.py`) form a
  graph: `from .x import f`, `from . import x` (x a submodule), `from schooner.pkg import x` (x a submodule)
  and `from schooner.pkg import name` (an edge to the package's `__init__`) are edges. A strongly connected
  component of two or more modules is a circle. Parent packages that Python runs on the way to a submodule
  are not edges (every submodule would then sit in a circle with its package's `__init__`).
- **Siblings meet at each other's public face.** Code outside package X (another package's source or tests,
  the root tests, benchmarks, experiments, tools, the python blocks of the docs) never imports X's private
  modules (`schooner.X._y`, `schooner.X.runner._y`) or private names (`from schooner.X import _name`).
  X's own tests may.
- **Imports flow down the dependency column** (`DEPENDS_ON` below, DESIGN.md's table), and no library
  imports `experiments`.

    uv run python -m tools.architecture                 # list every violation; exit 1 if any
    uv run python -m tools.architecture --draw docs/images/architecture.png

`tests/test_architecture.py` runs the check in the default suite, with the known violations listed there.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# DESIGN.md's dependency column: the sibling packages each package may import. Arrows only point down.
DEPENDS_ON: dict[str, frozenset[str]] = {
    "cluster": frozenset(),
    "data": frozenset({"cluster"}),
    "tokenize": frozenset({"data", "cluster"}),
    "model": frozenset(),
    "train": frozenset({"model", "tokenize", "cluster"}),
    # eval also reads the embedded corpus and writes task texts as record folders through schooner.data, a
    # floor below it that tokenize already brings in (decided in issue 35; DESIGN.md's row lists the direct
    # dependencies it had before).
    "eval": frozenset({"model", "tokenize", "data", "cluster"}),
}
# The five floors, bottom first, as DESIGN.md's table lists the packages: a package imports only packages on
# lower floors (DEPENDS_ON is the exact rule; model, on the fourth, imports none).
FLOORS: tuple[tuple[str, ...], ...] = (("cluster",), ("data",), ("tokenize",), ("model",), ("train", "eval"))

# Folders outside lib/ whose Python must use the packages' public faces only.
OUTSIDE = ("tests", "benchmarks", "experiments", "tools", ".ci")
# Markdown whose python blocks are read as code (tests/test_docs.py runs those of docs/).
DOC_GLOBS = ("docs/**/*.md", "README.md", "lib/*/README.md", "CONTRIBUTING.md")


@dataclass(frozen=True)
class Import:
    """One imported thing: `module` (resolved, absolute) and, for `from module import name`, the name."""

    file: str  # relative to the root, with '/'
    line: int
    text: str  # the statement's first source line, stripped
    module: str
    name: str | None = None

    def where(self) -> str:
        return f"{self.file}:{self.line}: {self.text}"


@dataclass(frozen=True)
class Cycle:
    """A strongly connected component of one package's module graph, and the imports that close it."""

    package: str
    modules: frozenset[str]
    edges: tuple[Import, ...]

    def describe(self) -> str:
        lines = [f"import circle in schooner.{self.package}: {', '.join(sorted(self.modules))}"]
        lines += [f"    {e.where()}" for e in self.edges]
        return "\n".join(lines)


@dataclass(frozen=True)
class Violation:
    """An import that breaks a rule; `key` is (file, what it imports) without the line, for allowlists."""

    rule: str  # "private" | "layering" | "experiments"
    imp: Import
    target: str  # the dotted path the rule is about: `schooner.train._memory`, `schooner.data`, `experiments`

    @property
    def key(self) -> tuple[str, str]:
        return (self.imp.file, self.target)

    def describe(self) -> str:
        why = {
            "private": f"imports {self.target}, private to another package; use its public face or export the name",
            "layering": f"imports {self.target}, which is not below it in DESIGN.md's dependency column",
            "experiments": "a library imports `experiments`; experiments import libraries, never the reverse",
        }[self.rule]
        return f"{self.imp.where()}\n    {why}"


@dataclass
class Report:
    cycles: list[Cycle] = field(default_factory=list)
    violations: list[Violation] = field(default_factory=list)
    # package -> module -> modules of the same package it imports (for drawing)
    graphs: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    # (package, sibling package) -> number of import statements
    package_edges: dict[tuple[str, str], int] = field(default_factory=dict)

    def of(self, rule: str) -> list[Violation]:
        return [v for v in self.violations if v.rule == rule]


# ---------------------------------------------------------------- reading imports


def _module_name(path: Path, base: Path) -> tuple[str, bool]:
    """The dotted name of a file under `base` (a sys.path entry), and whether it is a package `__init__`."""
    parts = list(path.relative_to(base).with_suffix("").parts)
    is_pkg = parts[-1] == "__init__"
    if is_pkg:
        parts.pop()
    return ".".join(parts), is_pkg


def library_modules(root: Path) -> dict[str, Path]:
    """Every module of every package: dotted name -> file."""
    out = {}
    for src in sorted(root.glob("lib/*/src")):
        for py in sorted(src.glob("schooner/*/**/*.py")):
            out[_module_name(py, src)[0]] = py
    return out


def _is_private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def imports_in(
    source: str, *, file: str, module: str, is_pkg: bool, known: Mapping[str, object]
) -> Iterator[Import]:
    """Every import in `source`, wherever it sits, resolved against the modules in `known`."""
    tree = ast.parse(source, filename=file)
    lines = source.splitlines()
    package = module if is_pkg else module.rpartition(".")[0]

    def text(node: ast.stmt | ast.expr) -> str:
        return lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield Import(file, node.lineno, text(node), alias.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                up = node.level - 1
                if up > len(parts):
                    continue  # beyond the top: Python refuses it too
                base = ".".join(parts[: len(parts) - up] if up else parts)
                target = f"{base}.{node.module}" if node.module and base else (node.module or base)
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                if alias.name != "*" and sub in known:
                    yield Import(file, node.lineno, text(node), sub)
                else:
                    yield Import(file, node.lineno, text(node), target, alias.name)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "import_module"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "importlib"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and not node.args[0].value.startswith(".")
        ):
            yield Import(file, node.lineno, text(node), node.args[0].value)


def _owning_module(name: str, known: Mapping[str, object]) -> str | None:
    """The longest prefix of `name` that is a known module (`schooner.x.y.f` -> `schooner.x.y`)."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def _private_target(imp: Import) -> str | None:
    """`schooner.X._y` (first private part kept) when `imp` reaches into a package's privates, else None."""
    parts = imp.module.split(".") + ([imp.name] if imp.name and imp.name != "*" else [])
    if len(parts) < 3 or parts[0] != "schooner":
        return None
    for i, part in enumerate(parts[2:], start=2):
        if _is_private(part):
            return ".".join(parts[: i + 1])
    return None


def _python_blocks(md: str) -> Iterator[tuple[int, str]]:
    """(first line number, code) of each ```python block of a markdown text."""
    for m in re.finditer(r"^```python[^\n]*\n(.*?)^```", md, flags=re.M | re.S):
        yield md.count("\n", 0, m.start()) + 2, m.group(1)


# ---------------------------------------------------------------- the check


def _sccs(graph: Mapping[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit to hit)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    comp.add(top)
                    if top == node:
                        break
                out.append(comp)
    return out


def check(root: Path = ROOT, depends_on: Mapping[str, frozenset[str]] = DEPENDS_ON) -> Report:
    """Read every import under `root` and return the circles and rule violations found."""
    known = library_modules(root)
    report = Report()
    edges: dict[str, list[Import]] = {}  # importing module -> same-package imports

    def rel(p: Path) -> str:
        return p.relative_to(root).as_posix()

    # The packages' own source: circles, privates of siblings, layering, experiments.
    for src in sorted(root.glob("lib/*/src")):
        for py in sorted(src.glob("schooner/*/**/*.py")):
            mod, is_pkg = _module_name(py, src)
            pkg = mod.split(".")[1]
            graph = report.graphs.setdefault(pkg, {})
            graph.setdefault(mod, set())
            for imp in imports_in(py.read_text(), file=rel(py), module=mod, is_pkg=is_pkg, known=known):
                top = imp.module.split(".")
                if top[0] == "experiments":
                    report.violations.append(Violation("experiments", imp, "experiments"))
                    continue
                if top[0] != "schooner" or len(top) < 2:
                    continue
                other = top[1]
                if other == pkg:
                    target = _owning_module(imp.module, known)
                    if target is not None and target != mod:
                        graph[mod].add(target)
                        edges.setdefault(mod, []).append(imp)
                    continue
                pair = (pkg, other)
                report.package_edges[pair] = report.package_edges.get(pair, 0) + 1
                if pkg in depends_on and other not in depends_on[pkg]:
                    report.violations.append(Violation("layering", imp, f"schooner.{other}"))
                private = _private_target(imp)
                if private:
                    report.violations.append(Violation("private", imp, private))

    for pkg, graph in sorted(report.graphs.items()):
        for comp in _sccs(graph):
            if len(comp) < 2:
                continue
            seen = {
                (e.file, e.line, _owning_module(e.module, known)): e
                for m in comp
                for e in edges.get(m, [])
                if _owning_module(e.module, known) in comp
            }
            inside = tuple(seen[k] for k in sorted(seen, key=lambda k: (k[0], k[1], k[2] or "")))
            report.cycles.append(Cycle(pkg, frozenset(comp), inside))

    # Everything else that imports the packages: their tests, and the root's folders.
    def outside_files() -> Iterator[tuple[Path, str | None]]:
        for tests in sorted(root.glob("lib/*/tests")):
            for py in sorted(tests.rglob("*.py")):
                yield py, tests.parent.name
        for py in sorted(root.glob("*.py")):  # the root's conftest.py
            yield py, None
        for folder in OUTSIDE:
            for py in sorted((root / folder).rglob("*.py")):
                yield py, None

    for py, owner in outside_files():
        if ".venv" in py.parts:
            continue
        mod, is_pkg = _module_name(py, root)
        try:
            found = list(imports_in(py.read_text(), file=rel(py), module=mod, is_pkg=is_pkg, known=known))
        except SyntaxError:
            continue  # fixtures that are not Python on purpose; ruff checks the real code
        for imp in found:
            private = _private_target(imp)
            if private and private.split(".")[1] != owner:
                report.violations.append(Violation("private", imp, private))

    for pattern in DOC_GLOBS:
        for md in sorted(root.glob(pattern)):
            for first, code in _python_blocks(md.read_text()):
                try:
                    found = list(imports_in(code, file=rel(md), module="doc", is_pkg=False, known=known))
                except SyntaxError:
                    continue
                for imp in found:
                    private = _private_target(imp)
                    if private:
                        imp = Import(imp.file, imp.line + first - 1, imp.text, imp.module, imp.name)
                        report.violations.append(Violation("private", imp, private))
    unique = {(v.rule, v.imp.file, v.imp.line, v.target): v for v in report.violations}
    report.violations = list(unique.values())
    return report


# ---------------------------------------------------------------- the drawing


# Where each package sits in the drawing: (left, floor); floors count from 1 at the bottom. Boxes are
# BOX_W wide; the ground (cluster) spans the whole width so every arrow into it lands straight.
_PLACES = {"cluster": (0.3, 1), "data": (0.6, 2), "tokenize": (0.6, 3), "model": (8.4, 4), "train": (0.6, 5),
           "eval": (8.4, 5)}  # fmt: skip
_BOX_W, _BOX_H, _FLOOR_H, _WIDTH = 5.0, 1.75, 2.35, 14.2
# Arrows into cluster from a floor above it run down a lane of their own, right of the box they leave.
_LANES = {"tokenize": 6.3, "train": 7.3, "eval": 13.6}


def public_parts(report: Report, package: str) -> list[str]:
    """The public modules and subpackages of `package` (`steps`, `runner/`), test helpers left out."""
    modules = report.graphs.get(package, {})
    names = set()
    for mod in modules:
        parts = mod.split(".")[2:]
        if not parts or _is_private(parts[0]) or parts[0] in ("testing", "pytest_fixtures", "__main__"):
            continue
        is_folder = any(m.startswith(f"schooner.{package}.{parts[0]}.") for m in modules)
        names.add(parts[0] + ("/" if is_folder else ""))
    return sorted(names)


def draw(report: Report, out: Path) -> None:
    """The floors, each package with its public modules, and the imports between packages as arrows."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyBboxPatch

    colors = {"cluster": "#dbe9f6", "data": "#e3f1dc", "tokenize": "#efe3f6", "model": "#f6e3d0",
              "train": "#f9f0c8", "eval": "#f6d9df"}  # fmt: skip
    floors = max(f for _, f in _PLACES.values())
    fig, ax = plt.subplots(figsize=(11, 9.6), dpi=140)
    ax.set_xlim(-1.3, _WIDTH + 0.3)
    ax.set_ylim(-0.3, floors * _FLOOR_H + 0.1)
    ax.axis("off")

    def box(pkg: str) -> tuple[float, float, float, float]:
        left, floor = _PLACES[pkg]
        width = _WIDTH - 0.6 if pkg == "cluster" else _BOX_W
        return left, (floor - 1) * _FLOOR_H, width, _BOX_H

    for floor in range(1, floors + 1):
        ax.text(-1.2, (floor - 1) * _FLOOR_H + _BOX_H / 2, f"floor {floor}", va="center", fontsize=9,
                color="#666666")  # fmt: skip
    for pkg in _PLACES:
        x, y, w, h = box(pkg)
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.04", facecolor=colors[pkg],
                                    edgecolor="#333333", linewidth=1.1))  # fmt: skip
        ax.text(x + w / 2, y + h - 0.27, f"schooner.{pkg}", ha="center", va="center", fontsize=11.5,
                weight="bold")  # fmt: skip
        parts = public_parts(report, pkg)
        body = "  ".join(["(face)", *parts])
        ax.text(x + w / 2, y + h / 2 - 0.12, _wrap(body, 70 if pkg == "cluster" else 36), ha="center",
                va="center", fontsize=8, family="monospace")  # fmt: skip
        n_cycles = sum(1 for c in report.cycles if c.package == pkg)
        note = f"{len(report.graphs.get(pkg, {}))} modules" + (
            f", {n_cycles} import circle" if n_cycles else ""
        )
        ax.text(x + w / 2, y + 0.17, note, ha="center", va="center", fontsize=7,
                color="#b00020" if n_cycles else "#666666")  # fmt: skip

    def arrow(points: list[tuple[float, float]], color: str, width: float, dashed: bool) -> None:
        xs, ys = zip(*points, strict=True)
        style = (0, (4, 3)) if dashed else "solid"
        ax.plot(xs[:-1], ys[:-1], color=color, linewidth=width, linestyle=style, solid_capstyle="butt")
        ax.annotate(
            "",
            xy=points[-1],
            xytext=points[-2],
            arrowprops={
                "arrowstyle": "-|>",
                "color": color,
                "linewidth": width,
                "linestyle": style,
                "shrinkA": 0,
                "shrinkB": 0,
                "mutation_scale": 13,
            },
        )

    for (src, dst), count in sorted(report.package_edges.items()):
        if src not in _PLACES or dst not in _PLACES:
            continue
        allowed = dst in DEPENDS_ON.get(src, frozenset())
        color, width = ("#333333" if allowed else "#b00020"), 0.7 + min(count, 40) / 20
        sx, sy, sw, sh = box(src)
        dx, dy, dw, dh = box(dst)
        top = dy + dh + 0.05
        if dst == "cluster" and src in _LANES:  # down its own lane to the ground
            lane, mid = _LANES[src], sy + sh * (0.35 if src == "eval" else 0.5)
            side = sx + sw if lane > sx + sw else sx
            arrow([(side, mid), (lane, mid), (lane, top)], color, width, not allowed)
        elif abs((sx + sw / 2) - (dx + dw / 2)) < 0.1 or dst == "cluster":  # straight down
            arrow([(sx + sw / 2, sy - 0.05), (sx + sw / 2, top)], color, width, not allowed)
        else:  # across: from the side facing it
            if dx > sx:
                start, end = (sx + sw + 0.05, sy + sh * 0.75), (dx + min(0.6, dw / 2), top)
            else:
                start, end = (sx - 0.05, sy + sh * 0.25), (dx + dw - 0.6, top)
            arrow([start, end], color, width, not allowed)
    ax.set_title(
        "Schooner's packages on five floors. An arrow is a package importing another (thicker: more "
        "import lines).\nBlack: allowed by DESIGN.md's dependency column. Red, dashed: an import against it.",
        fontsize=10,
    )  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, bbox_inches="tight")
    plt.close(fig)


def _wrap(text: str, width: int) -> str:
    lines: list[str] = []
    cur = ""
    for word in text.split("  "):
        if cur and len(cur) + 2 + len(word) > width:
            lines.append(cur)
            cur = word
        else:
            cur = f"{cur}  {word}" if cur else word
    return "\n".join([*lines, cur])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draw", type=Path, help="write the package drawing (PNG) to this path")
    args = parser.parse_args(argv)
    report = check()
    for cycle in report.cycles:
        print(cycle.describe())
    for v in report.violations:
        print(f"{v.rule}: {v.describe()}")
    if args.draw:
        draw(report, args.draw)
        print(f"wrote {args.draw}")
    return 1 if report.cycles or report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
