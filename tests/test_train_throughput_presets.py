"""The per-GPU presets of benchmarks/train_throughput.py (what benchmarks/gpu_check.py trains on an H200):
every config has settings, the check runs exactly them, and each preset's step, as estimated on this CPU by
schooner.train.estimate_step_memory, fits the H200 budget (the slow test compiles each preset whole)."""

from __future__ import annotations

import os
import sys

import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCH)

import gpu_check  # noqa: E402
import train_throughput as tt  # noqa: E402


def test_the_gpu_check_trains_the_h200_presets_and_each_has_settings():
    assert set(gpu_check.TRAIN_CONFIGS) == set(tt.H200_CONFIGS) == set(tt.GPU_SETTINGS)
    assert int(0.75 * tt.H200_BYTES) == tt.GPU_BUDGET  # XLA's default share of the GPU's memory
    for kind, (batch, micro, remat, scan) in tt.GPU_SETTINGS.items():
        assert batch % micro == 0 and remat in ("none", "dots", "save_carries") and scan is False, kind
        cfg = tt.preset_config(kind)
        assert cfg.seq_len == 2048 and cfg.model.compute_dtype == "bfloat16", kind
        assert cfg.model.gradient_checkpointing == remat and max(cfg.batch_sizes) == batch, kind


def test_the_presets_are_what_the_recorded_sizing_chooses_and_fit():
    """GPU_ESTIMATES holds what `--size-gpu` printed for each preset (fixed, per 2048-token row, GiB); the
    settings are `choose_gpu_settings` of them, and the rows of one microbatch fit the budget."""
    assert set(tt.GPU_ESTIMATES) == set(tt.GPU_SETTINGS)
    for kind, (fixed, per_row) in tt.GPU_ESTIMATES.items():
        batch, micro, _, _ = tt.GPU_SETTINGS[kind]
        assert tt.choose_gpu_settings(fixed * 2**30, per_row * 2**30) == (batch, micro), kind
        assert (fixed + per_row * batch / micro) * 2**30 <= tt.GPU_BUDGET, kind


def test_choose_gpu_settings_prefers_a_whole_batch_then_the_fewest_microbatches():
    gib = 2**30
    assert tt.choose_gpu_settings(2 * gib, 1 * gib, budget=100 * gib) == (64, 1)  # capped
    assert tt.choose_gpu_settings(2 * gib, 4 * gib, budget=100 * gib) == (24, 1)  # 24 rows fit, 32 do not
    assert tt.choose_gpu_settings(2 * gib, 10 * gib, budget=100 * gib) == (16, 2)  # 9 rows fit
    assert tt.choose_gpu_settings(2 * gib, 30 * gib, budget=100 * gib) == (16, 8)  # 3 rows fit
    with pytest.raises(ValueError, match="does not fit"):
        tt.choose_gpu_settings(2 * gib, 200 * gib, budget=100 * gib)


@pytest.mark.slow  # each preset's whole step compiled on the CPU: many minutes (the 1B's above all)
@pytest.mark.parametrize("kind", sorted(tt.H200_CONFIGS))
def test_each_presets_step_fits_the_h200_budget(kind):
    from schooner.train import estimate_step_memory

    memory = estimate_step_memory(tt.preset_config(kind, as_gpu=True))
    assert memory.total <= tt.GPU_BUDGET, (kind, memory.describe())
