"""The test suite's shared JAX compilation cache: a half-written entry is compiled again, not a failed test.

conftest.py gives the whole run one persistent compilation cache, shared by the xdist workers. jax writes an
entry in place (`write_bytes`, not a rename), so a worker can read another's entry while it is being written:
jax then warns ("Error reading persistent compilation cache entry ...") and compiles the program itself. With
the suite's `filterwarnings = error` that warning failed an unrelated test in CI (2026-12-07:
test_xent.py::test_bf16_gradients_keep_their_precision_when_the_model_is_confident, an empty entry).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import os, pathlib
import jax, jax.numpy as jnp

def test_truncated_entries_are_compiled_again():
    f = jax.jit(lambda x: x * 2 + 1)
    f(jnp.ones(3)).block_until_ready()
    entries = [p for p in pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).rglob("*") if p.is_file()]
    assert entries, "nothing was cached: the probe tests nothing"
    for p in entries:  # what a reader sees while another worker's write is under way
        p.write_bytes(b"")
    jax.clear_caches()
    assert float(f(jnp.ones(3))[0]) == 3.0
"""


def test_a_half_written_cache_entry_does_not_fail_a_test_under_the_suite_s_warning_filters(tmp_path) -> None:
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {
        **os.environ,
        "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
        "PYTEST_ADDOPTS": "",
    }
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-c", str(ROOT / "pyproject.toml"),
         str(tmp_path / "test_probe.py")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "1 passed" in out.stdout
