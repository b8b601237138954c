"""The compatibility matrix: each package's tests against the oldest sibling versions its ranges admit.

    uv run python -m tools.compat [PACKAGE ...]        (CI: python .ci/guards.py compat)

For each library that depends on siblings, every version each sibling has had is found in git
(tools/workspace.py `version_history`: its tag `NAME-vA.B.C` when released, else the first commit whose
pyproject.toml set that version, plus the working tree's version when no commit has it yet). The oldest
version that the package's ranges admit (base dependencies and extras together) is built from that
commit; siblings it needs only through others get the newest version all of their ranges admit (the working
tree when that is the current version). The package itself is built from the working tree, and its tests
run against these wheels in a fresh venv (tools/wheeltest.py). A range whose lower bound claims more than
that version delivers fails here.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet

from .wheeltest import Wheel, run_against_wheels
from .workspace import ROOT, Release, ToolError, build, package_at, packages, version_history


@dataclass(frozen=True)
class Plan:
    package: str
    direct: dict[str, Release]
    """Each sibling the package declares -> its oldest admitted version."""
    indirect: dict[str, Release]
    """Siblings needed only through others -> the newest version their ranges admit."""

    def describe(self) -> str:
        parts = [f"{r.name} {r.version} ({r.how})" for r in self.direct.values()]
        parts += [f"{r.name} {r.version} ({r.how}, indirect)" for r in self.indirect.values()]
        return ", ".join(parts)


def plan(name: str, root: Path = ROOT) -> Plan | None:
    """The sibling versions `name`'s tests run against; None when it depends on no sibling."""
    pkgs = packages(root)
    names = set(pkgs)
    direct_specs = pkgs[name].sibling_specifiers(names)
    if not direct_specs:
        return None
    histories = {n: version_history(n, root) for n in names}
    direct = {}
    for sib, spec in sorted(direct_specs.items()):
        admitted = [r for v, r in histories[sib].items() if v in spec]
        if not admitted:
            known = ", ".join(map(str, histories[sib])) or "none"
            raise ToolError(f"{name}: no version of {sib} admits {sib}{spec} (versions in git: {known})")
        direct[sib] = admitted[0]
    indirect: dict[str, Release] = {}
    specs: dict[str, SpecifierSet] = {}
    while True:
        for rel in [*direct.values(), *indirect.values()]:
            for sib, spec in package_at(rel, root).sibling_specifiers(names).items():
                if sib != name and sib not in direct:
                    specs[sib] = specs.get(sib, SpecifierSet()) & spec
        todo = sorted(set(specs) - set(indirect))
        if not todo:
            break
        for sib in todo:
            admitted = [r for v, r in histories[sib].items() if v in specs[sib]]
            if not admitted:
                raise ToolError(f"{name}: no version of {sib} admits {sib}{specs[sib]} (needed indirectly)")
            newest = admitted[-1]
            if newest.version == pkgs[sib].version:
                newest = Release(sib, newest.version, None, "working tree")
            indirect[sib] = newest
    return Plan(name, direct, indirect)


@dataclass(frozen=True)
class Outcome:
    plan: Plan
    ok: bool
    summary: str
    seconds: float


def check(name: str, pytest_args: list[str], root: Path = ROOT) -> Outcome | None:
    """Build the planned wheels and run `name`'s tests against them."""
    p = plan(name, root)
    if p is None:
        return None
    pkgs = packages(root)
    if all(r.ref is None for r in [*p.direct.values(), *p.indirect.values()]):
        # Nothing older is admitted: every sibling is today's tree, which the exact guard already tests.
        print(
            f"compat: {name}: its ranges admit no sibling version older than the working tree; nothing to vary"
        )
        return None
    print(f"compat: {name} (working tree) against {p.describe()}", flush=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix=f"schooner-compat-{name}-") as tmp:
        work = Path(tmp)
        me = Release(name, pkgs[name].version, None, "working tree")
        wheels = [Wheel(name, build(me, work / "wheels", root=root)[0], pkgs[name].dir)]
        for rel in [*p.direct.values(), *p.indirect.values()]:
            src = work / "src" / rel.name
            whl = build(rel, work / "wheels", root=root, source=src)[0]
            folder = pkgs[rel.name].dir
            source = folder if rel.ref is None else src / folder.relative_to(root)
            wheels.append(Wheel(rel.name, whl, source))
        try:
            result = run_against_wheels(pkgs[name], wheels, work, pytest_args, root)
        except ToolError as e:
            return Outcome(p, False, str(e), time.monotonic() - start)
    return Outcome(p, result.returncode == 0, result.summary, time.monotonic() - start)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.compat", description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", help="the packages to check (default: every library)")
    parser.add_argument("--pytest-args", default="-n auto -q --tb=short", help="for each test run")
    args = parser.parse_args(argv)
    names = args.packages or sorted(packages(ROOT))
    outcomes: list[Outcome] = []
    try:
        for name in names:
            out = check(name, args.pytest_args.split())
            if out is None:
                if plan(name) is None:
                    print(f"compat: {name} depends on no sibling; nothing to vary")
            else:
                outcomes.append(out)
    except ToolError as e:
        print(f"compat: {e}", file=sys.stderr)
        return 1
    print("compat matrix:")
    for o in outcomes:
        mark = "ok  " if o.ok else "FAIL"
        print(f"  {mark} {o.plan.package} against {o.plan.describe()}: {o.summary} ({o.seconds:.0f} s)")
    failed = [o.plan.package for o in outcomes if not o.ok]
    if failed:
        print(
            f"compat: {', '.join(failed)} fail against the oldest sibling versions their ranges admit: raise the "
            "lower bound of the range (releasing the sibling first if no released version has what is needed)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
