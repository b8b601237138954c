"""benchmarks/gather_gpu_wheels.py resolves the GPU check's wheels for the H200 (CPython 3.12, manylinux
x86_64, jax 0.11.2 already there) without downloading them; benchmarks/gpu_check.py --wheels installs a
folder of wheels offline and sees them in a fresh interpreter."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCH)

import gather_gpu_wheels as gather  # noqa: E402


def _pypi_reachable() -> bool:
    try:
        urllib.request.urlopen("https://pypi.org/simple/haliax/", timeout=5).close()
        return True
    except OSError:
        return False


def test_requirements_come_from_the_packages_pyproject_files():
    reqs = [gather._name(r) for r in gather.requirements()]
    for name in ("haliax", "equinox", "jaxtyping", "optax", "tensorstore", "tokenizers", "psutil", "jax"):
        assert name in reqs, (name, reqs)
    assert not any(r.startswith("schooner") for r in reqs)  # those are built from the tree as wheels


@pytest.mark.slow  # about 30 s: two resolutions against the registry
@pytest.mark.skipif(not _pypi_reachable(), reason="needs the package registry (pypi.org) to resolve")
def test_resolves_every_wheel_the_h200_lacks_and_none_it_has():
    pins = gather.resolve(gather.requirements())
    names = {gather._name(p): p.split("==")[1] for p in pins}
    for needed in (
        "haliax",
        "equinox",
        "jaxtyping",
        "optax",
        "tensorstore",
        "tokenizers",
        "psutil",
        "orjson",
    ):
        assert needed in names, (needed, sorted(names))
    assert names["haliax"] == "1.4.dev453"  # the project's exact pin
    for image in ("jax", "jaxlib", "numpy", "scipy", "ml-dtypes", "opt-einsum"):
        assert image not in names, image  # on the H200 image already
    assert not any(n.startswith("nvidia-") for n in names)
    assert "pyarrow" not in names and "matplotlib" not in names  # required, never imported by the check
    with_jax = {
        gather._name(p): p.split("==")[1] for p in gather.resolve(gather.requirements(), with_jax=True)
    }
    for name in ("jax", "jaxlib", "jax-cuda13-plugin", "jax-cuda13-pjrt"):
        assert with_jax[name] == gather.H200_JAX, (name, with_jax.get(name))


def _wheel(folder, name="schooner_gpu_probe", version="0.1"):
    """A minimal pure-Python wheel (a module and its dist-info, with a RECORD)."""
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    files[f"{dist}/RECORD"] = ("\n".join(record) + "\n").encode()
    path = os.path.join(folder, f"{name}-{version}-py3-none-any.whl")
    with zipfile.ZipFile(path, "w") as z:
        for p, data in files.items():
            z.writestr(p, data)
    return path


def _python_with_pip() -> str | None:
    for exe in (sys.executable, getattr(sys, "_base_executable", None), shutil.which("python3")):
        if exe and subprocess.run([exe, "-m", "pip", "--version"], capture_output=True).returncode == 0:
            return exe
    return None


@pytest.mark.skipif(_python_with_pip() is None, reason="no python with pip here (the H200's python3 has one)")
def test_gpu_check_installs_a_wheel_folder_offline_after_the_existing_path(tmp_path):
    folder = tmp_path / "wheels"
    folder.mkdir()
    _wheel(str(folder))
    exe = _python_with_pip()
    probe = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); import gpu_check; "
        "env = gpu_check.install_wheels(sys.argv[2]); print(json.dumps(env['PYTHONPATH']))"
    )
    env = {**os.environ, "PYTHONPATH": "/image/site-packages", "TMPDIR": str(tmp_path)}
    env.pop("PIP_INDEX_URL", None)
    done = subprocess.run([exe, "-c", probe, BENCH, str(folder)], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    path = done.stdout.strip().splitlines()[-1].strip('"').split(os.pathsep)
    assert path[0] == "/image/site-packages"  # the image's jax stays first
    assert path[-1] == str(tmp_path / "schooner-gpu-site")
    assert any(p.endswith(os.path.join("lib", "train", "src")) for p in path)  # the tree's code, not wheels
    got = subprocess.run(
        [exe, "-c", "import schooner_gpu_probe as m; print(m.VALUE)"],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        capture_output=True,
        text=True,
    )
    assert got.stdout.strip() == "42", got.stderr


def test_gpu_check_refuses_an_empty_wheel_folder(tmp_path):
    done = subprocess.run(
        [sys.executable, os.path.join(BENCH, "gpu_check.py"), "--wheels", str(tmp_path), "--dry-run"],
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0
    assert "no .whl file" in done.stderr and "gather_gpu_wheels.py" in done.stderr
