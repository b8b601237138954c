"""Gather every wheel benchmarks/gpu_check.py needs on a bare NVIDIA H200 into one folder (issue 37).

The H200 machine has no network, runs Python 3.12 on x86_64 Linux, and already holds jax 0.11.2 with its
CUDA 13 plugin (jax, jaxlib, jax-cuda13-plugin, jax-cuda13-pjrt and the jax dependencies numpy, scipy,
ml-dtypes, opt-einsum). Run this beforehand on any machine with registry access (the project's uv and a pip)::

    uv run python benchmarks/gather_gpu_wheels.py            # -> .whl-gpu/ in the repository root

It (1) builds the wheels of the schooner packages the check imports (cluster, data, tokenize, model, train)
from this working tree; (2) resolves their third-party requirements, read from each package's
pyproject.toml, for CPython 3.12 on manylinux x86_64, binary wheels only, with the H200's ``jax==0.11.2`` as a
constraint (``uv pip compile``); (3) leaves out what the H200 image holds and what the check never imports
(``IMAGE_HAS``, ``NOT_IMPORTED``); (4) downloads each remaining pin with ``pip download --no-deps
--only-binary=:all:`` for that platform; (5) writes ``requirements.txt`` (the pins) and ``SIZES.txt`` in the
folder and prints the total against the device tool's 64 MiB carry limit. ``--dry-run`` stops after (3) and
prints the pins (seconds; what tests/test_gather_gpu_wheels.py runs). ``--with-jax`` adds jax, jaxlib and the
CUDA 13 plugin and PJRT wheels at 0.11.2 for an image that lacks them (hundreds of MB: over the limit).

On the H200, from a copy of the working tree with the folder carried (its ignored path named in ``carry``)::

    python3 benchmarks/gpu_check.py --wheels .whl-gpu

gpu_check.py then runs ``python3 -m pip install --isolated --no-index --no-deps --no-compile --target
/tmp/schooner-site .whl-gpu/*.whl`` (no network, no resolver: the folder is the whole set), appends that
folder to PYTHONPATH (the image's jax stays first) and puts this checkout's ``lib/*/src`` before it (the code
that runs is the tree carried, not the wheels built earlier), then checks every module the check needs
imports before any section runs.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tomllib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# What gpu_check imports: train and model, and what they stand on (tokenize -> data -> cluster).
SCHOONER = ("cluster", "data", "tokenize", "model", "train")
H200_JAX = "0.11.2"
# On the H200 image already (H200.md / issue 37: jax 0.11.2 with the CUDA 13 plugin on Python 3.12), with the
# packages jax itself requires. Installing a second copy would shadow nothing (PYTHONPATH is appended) but
# costs carry space; nvidia-* are the CUDA libraries the plugin's extra brings.
IMAGE_HAS = (
    "jax",
    "jaxlib",
    "jax-cuda13-plugin",
    "jax-cuda13-pjrt",
    "numpy",
    "scipy",
    "ml-dtypes",
    "opt-einsum",
)
# Required by a package's metadata but never imported on the check's paths (measured 2026-12-06: sys.modules
# after gpu_check's sections 1-3 and a train_throughput.py child in one process): pyarrow (schooner.data's
# parquet readers, 40+ MB), matplotlib and its helpers (loss plots; the check sets loss_plot=False).
NOT_IMPORTED = (
    "pyarrow",
    "matplotlib",
    "contourpy",
    "cycler",
    "fonttools",
    "kiwisolver",
    "pillow",
    "pyparsing",
)
PLATFORMS = (
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
)
CARRY_LIMIT = 64 * 2**20  # the device tool's working tree + carried paths, per call


def _name(requirement: str) -> str:
    """The normalised distribution name of a requirement line (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0)).lower()


def requirements() -> list[str]:
    """The third-party requirements of the schooner packages the check imports, from their pyproject.toml."""
    out: list[str] = []
    for pkg in SCHOONER:
        path = os.path.join(ROOT, "lib", pkg, "pyproject.toml")
        with open(path, "rb") as f:
            deps = tomllib.load(f)["project"]["dependencies"]
        out += [d for d in deps if not _name(d).startswith("schooner-") and d not in out]
    return out


def resolve(reqs: list[str], with_jax: bool = False) -> list[str]:
    """``name==version`` pins for CPython 3.12 manylinux x86_64, binary only, jax at the H200's version; the
    image's packages (unless ``with_jax``) and those never imported are left out. Needs the registry (uv)."""
    workdir = os.path.join(ROOT, ".whl-gpu-resolve")
    os.makedirs(workdir, exist_ok=True)
    req, con = os.path.join(workdir, "req.in"), os.path.join(workdir, "constraints.txt")
    with open(req, "w") as f:
        f.write("\n".join(reqs + ([f"jax[cuda13-local]=={H200_JAX}"] if with_jax else [])) + "\n")
    with open(con, "w") as f:
        f.write(f"jax=={H200_JAX}\njaxlib=={H200_JAX}\n")
    cmd = ["uv", "pip", "compile", req, "-c", con, "--python-version", "3.12", "--python-platform"]
    cmd += ["x86_64-manylinux_2_28", "--only-binary", ":all:", "--no-header", "--no-annotate", "-q"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    shutil.rmtree(workdir, ignore_errors=True)
    if proc.returncode != 0:
        raise RuntimeError(
            f"could not resolve the GPU check's wheels ({' '.join(cmd)}):\n{proc.stderr[-3000:]}"
        )
    pins = [line.strip() for line in proc.stdout.splitlines() if "==" in line and not line.startswith("#")]
    skip = set(NOT_IMPORTED) | (set() if with_jax else set(IMAGE_HAS))
    return [p for p in pins if _name(p) not in skip and not _name(p).startswith("nvidia-")]


def _pip() -> list[str]:
    try:
        import pip  # noqa: F401

        return [sys.executable, "-m", "pip"]
    except ImportError:  # the project's venv holds no pip; uv brings one
        return ["uvx", "pip"]


def download(pins: list[str], folder: str) -> None:
    plats = [a for p in PLATFORMS for a in ("--platform", p)]
    cmd = _pip() + ["download", "--isolated", "--no-deps", "--only-binary=:all:", "--python-version", "3.12"]
    cmd += ["--implementation", "cp", *plats, "-d", folder, "-q", *pins]
    subprocess.run(cmd, check=True)


def build_schooner(folder: str) -> None:
    for pkg in SCHOONER:
        cmd = ["uv", "build", "--wheel", "--package", f"schooner-{pkg}", "--out-dir", folder, "-q"]
        subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.path.join(ROOT, ".whl-gpu"))
    p.add_argument("--dry-run", action="store_true", help="resolve and print the pins; download nothing")
    p.add_argument("--with-jax", action="store_true", help=f"also jax {H200_JAX} and its CUDA 13 plugin")
    args = p.parse_args()
    pins = resolve(requirements(), with_jax=args.with_jax)
    if args.dry_run:
        print("\n".join(pins))
        return
    if os.path.exists(args.out):
        shutil.rmtree(args.out)  # one version of each: two in the folder would stop the install there
    os.makedirs(args.out)
    build_schooner(args.out)
    download(pins, args.out)
    with open(os.path.join(args.out, "requirements.txt"), "w") as f:
        f.write("\n".join(pins) + "\n")
    sizes = sorted(
        ((os.path.getsize(os.path.join(args.out, n)), n) for n in os.listdir(args.out)), reverse=True
    )
    total = sum(s for s, _ in sizes)
    with open(os.path.join(args.out, "SIZES.txt"), "w") as f:
        f.write("".join(f"{s / 2**20:8.2f} MiB  {n}\n" for s, n in sizes))
    fits = "fits" if total <= CARRY_LIMIT else "does NOT fit"
    print(
        f"{len(sizes) - 2} wheels, {total / 2**20:.1f} MiB in {args.out}: {fits} the device's 64 MiB carry limit"
    )
    print(f"the largest: {', '.join(f'{n} {s / 2**20:.1f} MiB' for s, n in sizes[:3])}")


if __name__ == "__main__":
    main()
