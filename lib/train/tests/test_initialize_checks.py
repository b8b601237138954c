"""`initialize_from` checks that need no training: every differing architecture field is named at once, and
a path source is keyed by the checkpoint it resolves to (its folder and a fingerprint of its metadata)."""

from __future__ import annotations

import dataclasses
import pathlib

import pytest

from schooner.train._init import check_compatible

FOLDER = str(pathlib.Path(__file__).parent / "data")
"""A folder that exists, as the steps' data: these steps are built (their inputs must exist), never run."""


def test_every_differing_field_is_named_with_both_values(nano) -> None:
    with pytest.raises(ValueError) as info:
        check_compatible(nano(num_layers=3, intermediate_dim=256), nano(), where="'src'")
    message = str(info.value)
    assert "2 model config fields differ" in message
    assert "'num_layers' differs: the source has num_layers=2, this run num_layers=3" in message
    assert (
        "'intermediate_dim' differs: the source has intermediate_dim=128, this run intermediate_dim=256"
        in message
    )
    # runtime fields may differ and are not listed
    check_compatible(nano(max_seq_len=64, compute_dtype="bfloat16"), nano(), where="'src'")


def test_moe_runtime_settings_may_differ_from_the_source() -> None:
    """The MoE fields that change no parameter (balancing's re-solve and its token budget, the grouped-matmul
    kernel, capacity) may differ; the experts may not."""
    from schooner.model import MoEConfig

    src = MoEConfig(
        vocab_size=64, hidden_dim=32, intermediate_dim=32, num_layers=2, num_heads=2, num_kv_heads=2
    )
    for kw in (
        {"router_bias_resolve_tokens": 16384},
        {"grouped_matmul": "megablox"},
        {"router_bias_resolve": False},
        {"capacity_factor": 1.25},
    ):
        check_compatible(dataclasses.replace(src, **kw), src, where="'src'")
    with pytest.raises(ValueError, match="'num_experts' differs: the source has num_experts=8"):
        check_compatible(dataclasses.replace(src, num_experts=4), src, where="'src'")


def test_a_run_may_loop_over_the_layers_otherwise_than_its_source(nano, tmp_path) -> None:
    """`scan_layers` changes how the (always stacked) layers are run, not a parameter: a checkpoint trained with
    the scan starts an unrolled run (the TPU settings unroll) and gives the same logits."""
    import jax
    import numpy as np

    from schooner.model import init
    from schooner.train._init import load_initial_model

    src = nano()
    folder = _checkpoint(tmp_path / "run", 3, src)
    unrolled = dataclasses.replace(src, scan_layers=False)
    model, _ = load_initial_model(folder, unrolled)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, src.vocab_size)
    want = np.asarray(init(src, key=jax.random.PRNGKey(0))(tokens))
    np.testing.assert_allclose(np.asarray(model(tokens)), want, rtol=1e-5, atol=1e-5)


def _checkpoint(run, step: int, config, seed: int = 0) -> str:
    """A complete checkpoint `step-NNNNNN/` of the run folder `run` (weights, config.json, checkpoint.json)."""
    import json

    import jax

    from schooner.model import init, save_model

    folder = run / f"step-{step:06d}"
    save_model(str(folder), init(config, key=jax.random.PRNGKey(seed)), config)
    (folder / "checkpoint.json").write_text(json.dumps({"step": step, "written_at": seed}))
    return str(folder)


def _train_lm(source, **kw):
    from schooner.train.steps import train_lm

    return train_lm("tuned", initialize_from=source, datasets={FOLDER: 1.0}, batch_size=2, seq_len=16,
                    num_train_steps=1, **kw)  # fmt: skip


def test_a_run_folder_source_is_keyed_by_the_checkpoint_it_resolves_to(nano, tmp_path) -> None:
    run = tmp_path / "run"
    _checkpoint(run, 2, nano())
    first = _train_lm(str(run))
    assert _train_lm(str(run)).key == first.key  # nothing changed: the same step
    assert str(first.config.initialize_from) == str(run / "step-000002")  # the checkpoint actually used
    latest = _checkpoint(run, 4, nano(), seed=1)  # the run gains a checkpoint: its latest changes
    second = _train_lm(str(run))
    assert second.key != first.key and str(second.config.initialize_from) == latest
    assert _train_lm(str(run), initialize_from_step=2).key == first.key  # the step named explicitly
    assert _train_lm(latest).key == second.key  # the step folder itself
    # the same step rewritten (a new checkpoint.json): a new key
    (run / "step-000004" / "checkpoint.json").write_text('{"step": 4, "written_at": 2}')
    assert _train_lm(str(run)).key != second.key


def test_sft_and_dpo_pin_a_run_folder_source_too(nano, tmp_path) -> None:
    from schooner.train.steps import dpo, sft

    run = tmp_path / "run"
    _checkpoint(run, 2, nano())
    build_sft = lambda: sft("s", initialize_from=str(run), datasets={FOLDER: 1.0}, batch_size=2, seq_len=16,  # noqa: E731
                            num_train_steps=1)  # fmt: skip
    build_dpo = lambda: dpo("d", initialize_from=str(run), reference=str(run), preferences=FOLDER,  # noqa: E731
                            batch_size=2, seq_len=16, num_train_steps=1)  # fmt: skip
    keys = (build_sft().key, build_dpo().key)
    _checkpoint(run, 4, nano(), seed=1)
    assert build_sft().key != keys[0] and build_dpo().key != keys[1]
    assert str(build_dpo().config.initialize_from).endswith("step-000004")


def test_a_dpo_reference_path_is_pinned_to_the_checkpoint_it_resolves_to(nano, tmp_path) -> None:
    """A live reference (run folder) and `reference_logprobs(model=<run folder>)` are keyed by the checkpoint
    the folder resolves to when the step is built, as `initialize_from` is: a new checkpoint, a new step."""
    from schooner.train.steps import dpo, reference_logprobs

    policy = _checkpoint(tmp_path / "policy", 2, nano())  # one fixed checkpoint: only the reference moves
    ref = tmp_path / "ref"
    _checkpoint(ref, 2, nano())
    build_dpo = lambda **kw: dpo("d", initialize_from=policy, reference=str(ref), preferences=FOLDER,  # noqa: E731
                                 batch_size=2, seq_len=16, num_train_steps=1, **kw)  # fmt: skip
    build_ref = lambda **kw: reference_logprobs("r", str(ref), FOLDER, seq_len=16, **kw)  # noqa: E731
    keys = (build_dpo().key, build_ref().key)
    assert (build_dpo().key, build_ref().key) == keys  # nothing changed: the same steps
    latest = _checkpoint(ref, 4, nano(), seed=1)
    assert build_dpo().key != keys[0] and build_ref().key != keys[1]
    assert str(build_dpo().config.objective.reference) == latest and str(build_ref().config.model) == latest
    assert build_dpo(reference_step=2).key == keys[0] and build_ref(step=2).key == keys[1]  # named: pinned
    with pytest.raises(FileNotFoundError, match="no complete checkpoint of step 3"):
        build_dpo(reference_step=3)


def test_a_reference_logprobs_folder_is_keyed_by_its_content(nano, tmp_path) -> None:
    """A `reference_logprobs` output passed as a folder: recomputed in place, it gives a new `dpo` step."""
    from schooner.train.steps import dpo

    policy = _checkpoint(tmp_path / "policy", 2, nano())
    ref = tmp_path / "logps"
    ref.mkdir()
    (ref / "reference.json").write_text('{"model": "a", "seq_len": 16, "splits": {}}')
    build = lambda **kw: dpo("d", initialize_from=policy, reference=str(ref), preferences=FOLDER,  # noqa: E731
                             batch_size=2, seq_len=16, num_train_steps=1, **kw)  # fmt: skip
    first = build().key
    assert build().key == first and str(build().config.objective.reference) == str(ref)
    (ref / "reference.json").write_text('{"model": "b", "seq_len": 16, "splits": {}}')
    assert build().key != first
    with pytest.raises(ValueError, match="reference_step=2 names a checkpoint of a live reference run"):
        build(reference_step=2)
