"""Run a package's tests against built wheels, in a fresh venv outside the workspace.

The venv gets the package's wheel with all its extras, the wheels of the siblings it needs (given as files,
so no index can substitute them), its `dev` dependency group, and third-party versions constrained to the
workspace lock. The tests are copied out of the workspace with the root conftest.py and the root pytest
settings, and run from there, so `import schooner.x` can only find the installed wheels; a conftest hook
checks that before any test runs.

The cluster test scaffolding, `schooner/cluster/testing.py` and `pytest_fixtures.py`, is left out of the
schooner-cluster wheel on purpose (`wheel-exclude`), yet every package's conftest imports
`schooner.cluster.pytest_fixtures`. For these test runs only, the two source files (of the same source as
the installed cluster wheel) are copied into the venv's `schooner/cluster/` after the wheel is installed;
they never enter a wheel.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

from .workspace import ROOT, Package, ToolError, python_version, run

SCAFFOLDING = ("testing.py", "pytest_fixtures.py")
"""Cluster test helpers kept out of the wheel, put into test venvs only."""

_ORIGIN_CHECK = """

# --- added by tools/wheeltest.py: the packages under test must be the installed wheels ---
def pytest_configure(config):
    import importlib
    import os
    import sys

    import pytest

    for module in os.environ["SCHOONER_WHEEL_MODULES"].split(","):
        try:
            m = importlib.import_module(module)
        except ImportError as e:
            raise pytest.UsageError(f"{module} does not import against these wheels: {e}") from None
        if not m.__file__.startswith(sys.prefix + os.sep):
            raise pytest.UsageError(f"{module} comes from {m.__file__}, not from the test venv {sys.prefix}")
    import schooner

    for folder in schooner.__path__:
        if not folder.startswith(sys.prefix + os.sep):
            raise pytest.UsageError(f"schooner namespace folder {folder} is outside the test venv")
"""


@dataclass(frozen=True)
class Wheel:
    """A built wheel to install, with the source folder of its package (for the cluster scaffolding)."""

    name: str
    path: Path
    source: Path
    """The package folder the wheel was built from (lib/x in the workspace or in an exported commit)."""


def lock_constraints(package: Package, work: Path, root: Path = ROOT) -> Path:
    """Third-party pins of the workspace lock for `package` (all extras, dev group) as a constraints file."""
    out = work / "constraints.txt"
    proc = subprocess.run(
        [
            "uv", "export", "--frozen", "--package", package.name, "--all-extras", "--no-hashes",
            "--no-emit-workspace", "--no-header", "--no-annotate", "--output-file", str(out), "-q",
        ],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    if proc.returncode != 0:
        raise ToolError(f"uv export of the lock for {package.name} failed: {proc.stderr.strip()}")
    return out


def make_venv(where: Path) -> Path:
    """A fresh venv at `where` with this Python's version; returns its python."""
    run(["uv", "venv", "-q", "--python", python_version(), where], where.parent)
    return where / "bin" / "python"


def site_packages(python: Path) -> Path:
    out = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return Path(out.stdout.strip())


def install(python: Path, package: Package, wheels: list[Wheel], constraints: Path | None) -> None:
    """Install the package's wheel (with every extra), the sibling wheels and the package's dev group."""
    reqs = []
    for w in wheels:
        extras = f"[{','.join(package.extras)}]" if w.name == package.name and package.extras else ""
        reqs.append(f"{w.name}{extras} @ {w.path.resolve().as_uri()}")
    cmd: list[str | Path] = ["uv", "pip", "install", "-q", "--python", python, *reqs, *package.dev_group]
    if constraints is not None:
        cmd += ["--constraints", constraints]
    run(cmd, python.parent.parent, env=_clean_env())
    cluster = next((w for w in wheels if w.name == "schooner-cluster"), None)
    if cluster is not None:
        dest = site_packages(python) / "schooner" / "cluster"
        for f in SCAFFOLDING:
            src = cluster.source / "src" / "schooner" / "cluster" / f
            if src.is_file():
                shutil.copy2(src, dest / f)


def installed_sources(python: Path) -> dict[str, str]:
    """Installed distribution name -> the URL it was installed from (direct installs) or ''."""
    code = (
        "import json\nfrom importlib.metadata import distributions\n"
        "out = {}\nfor d in distributions():\n"
        "    u = d.read_text('direct_url.json')\n"
        "    out[d.metadata['Name'].lower()] = json.loads(u)['url'] if u else ''\n"
        "print(json.dumps(out))\n"
    )
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def _clean_env() -> dict[str, str]:
    """Our environment without what would point a child at the workspace's venv or sources."""
    drop = (
        "VIRTUAL_ENV",
        "PYTHONPATH",
        "PYTHONHOME",
        "UV_PROJECT_ENVIRONMENT",
        "CONDA_PREFIX",
        "PYTHONSTARTUP",
    )
    return {k: v for k, v in os.environ.items() if k not in drop}


def stage_tests(package: Package, work: Path, root: Path = ROOT) -> Path:
    """Copy the package's tests, the root conftest.py and the root pytest settings into `work/run`."""
    dest = work / "run"
    shutil.copytree(package.dir / "tests", dest / "tests", ignore=shutil.ignore_patterns("__pycache__"))
    conftest = (root / "conftest.py").read_text() if (root / "conftest.py").is_file() else ""
    (dest / "conftest.py").write_text(conftest + _ORIGIN_CHECK)
    settings = dict(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"])
    settings["testpaths"] = ["tests"]
    (dest / "pyproject.toml").write_text(_toml_table("tool.pytest.ini_options", settings))
    return dest


def _toml_table(name: str, values: dict) -> str:
    def value(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int | float):
            return repr(v)
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        raise TypeError(f"cannot write {v!r} as TOML")

    return f"[{name}]\n" + "".join(f"{k} = {value(v)}\n" for k, v in values.items())


_TEST_FILE = re.compile(r"\.py$")
_NOT_A_SELECTION = ("--deselect", "--ignore", "--ignore-glob")
"""Options whose value is a test path that does not say what to run."""


def select_tests(package: Package, pytest_args: list[str], root: Path = ROOT) -> list[str]:
    """`pytest_args` for the staged copy of `package`'s tests (`tests/` in the run folder): every test file,
    folder or node id in them, given from the package folder, from its tests/ folder or from the repository
    root, is rewritten to its place in the copy; `tests` leads when none names what to run. A test file or
    node id that is no file under the package's tests/ raises ToolError; anything else (options, their
    values) passes as it is."""
    tests = (package.dir / "tests").resolve()
    out: list[str] = []
    narrowed = False
    for i, arg in enumerate(pytest_args):
        if arg.startswith("-"):
            out.append(arg)
            continue
        path, sep, node = arg.partition("::")
        bases = (package.dir, tests, root) if not Path(path).is_absolute() else (Path("/"),)
        found = next((b / path for b in bases if path and (b / path).exists()), None)
        if found is None:
            if sep or _TEST_FILE.search(path):
                raise ToolError(
                    f"--pytest-args names {arg!r}, which is not a file or folder under "
                    f"{_shown(package.dir / 'tests', root)}; name a test file from there (tests/test_x.py, "
                    "test_x.py or the path from the repository root)"
                )
            out.append(arg)  # an option's value (`-k expr`, `-n 2`, `-p no:x`)
            continue
        found = found.resolve()
        if not found.is_relative_to(tests):
            raise ToolError(
                f"--pytest-args names {arg!r}, which is outside {_shown(package.dir / 'tests', root)}: only "
                f"{package.name}'s own tests run against its wheel"
            )
        rel = found.relative_to(tests).as_posix()
        out.append(("tests" if rel == "." else f"tests/{rel}") + sep + node)
        narrowed = narrowed or i == 0 or pytest_args[i - 1] not in _NOT_A_SELECTION
    return out if narrowed else ["tests", *out]


def _shown(path: Path, root: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


@dataclass(frozen=True)
class WheelTestRun:
    returncode: int
    seconds: float
    summary: str
    """pytest's last line."""


def run_tests(
    python: Path, package: Package, wheels: list[Wheel], work: Path, pytest_args: list[str], root: Path = ROOT
) -> WheelTestRun:
    """Run the package's tests (copied to `work/run`) with the venv's pytest; output streams to ours."""
    where = stage_tests(package, work, root)
    env = _clean_env()
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"  # pytest's progress streams through our pipe as it happens
    env["SCHOONER_WHEEL_MODULES"] = ",".join(w.name.replace("-", ".", 1) for w in wheels)
    cmd = [str(python.parent / "pytest"), "-p", "no:cacheprovider", *select_tests(package, pytest_args, root)]
    print("+", " ".join(cmd), f"(in {where})", flush=True)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=where, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        sys.stdout.write(line)
        if line.strip():
            last = line.strip()
    rc = proc.wait()
    return WheelTestRun(rc, time.monotonic() - start, last.strip("= "))


def run_against_wheels(
    package: Package, wheels: list[Wheel], work: Path, pytest_args: list[str], root: Path = ROOT
) -> WheelTestRun:
    """A fresh venv under `work`, the wheels installed, the package's tests run against them."""
    python = make_venv(work / "venv")
    install(python, package, wheels, lock_constraints(package, work, root))
    sources = installed_sources(python)
    extra = sorted(n for n in sources if n.startswith("schooner") and n not in {w.name for w in wheels})
    if extra:
        raise ToolError(f"the test venv holds Schooner packages that were not given as wheels: {extra}")
    for w in wheels:
        got = sources.get(w.name, None)
        if got != w.path.resolve().as_uri():
            raise ToolError(f"{w.name} in the test venv came from {got!r}, not from {w.path}")
    return run_tests(python, package, wheels, work, pytest_args, root)
