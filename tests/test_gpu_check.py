"""benchmarks/gpu_check.py imports and runs its CPU dry run (tiny shapes; training listed, not run), so the GPU
check is known to start before anyone carries it to a GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "benchmarks", "gpu_check.py")


@pytest.mark.slow  # about 2 minutes on the shared 2-core machine (every path compiled, Pallas interpreted)
def test_gpu_check_dry_run_measures_every_path_and_writes_its_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--dry-run", "--out", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["dry_run"] and report["environment"]["matmul_ceiling_flops"] > 0
    for name in ("xla", "cudnn_bias", "cudnn_packed", "cudnn_one_document", "blocked"):
        assert report["attention"][name]["correct"], (name, report["attention"][name])
    for name in ("ragged_dot", "triton", "capacity_1.25"):
        assert report["grouped_matmul"][name]["seconds"] > 0, (name, report["grouped_matmul"][name])
    assert report["grouped_matmul"]["triton"]["correct"]
    assert report["training"]["ran"] is False and "train_throughput.py" in " ".join(
        report["training"]["command"]
    )
    assert "triton vs ragged_dot" in proc.stdout
