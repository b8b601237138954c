"""`initialize_from`: a run starts from a run folder, a checkpoint or an HF folder with the source's weights
and a fresh optimizer; mismatching architectures are refused naming the field; the vocabulary can grow."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import pytest

from schooner.tokenize import jinja_chat_template
from schooner.train import AdamConfig, CheckpointConfig, TrackerConfig, TrainerConfig, train
from schooner.train._init import load_initial_model
from schooner.train.steps import initial_model_config


def _config(nano, data_dir: str, out: str, **kw) -> TrainerConfig:
    args = dict(
        model=nano(),
        datasets={f"{data_dir}/train": 1.0},
        seq_len=32,
        validation={},
        output_path=out,
        batch_size=8,
        num_train_steps=2,
        optimizer=AdamConfig(learning_rate=3e-3, warmup=1),
        checkpoint=CheckpointConfig(every=None),
        trackers=TrackerConfig(loss_plot=False),
        seed=1,
    )
    args.update(kw)
    return TrainerConfig(**args)


@pytest.fixture(scope="module")
def source_run(nano, data_dir, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("source"))
    train(_config(nano, data_dir, out))
    return out


def _leaves(model) -> list[np.ndarray]:
    return [np.asarray(x) for x in jax.tree.leaves(model)]


def test_a_run_starts_from_the_source_weights_with_a_fresh_optimizer(
    nano, data_dir, source_run, tmp_path
) -> None:
    from schooner.model import load_model, loss_fn, target_mask_to_loss_mask
    from schooner.tokenize import MixtureDataset

    src, _ = load_model(f"{source_run}/step-000002")
    model, folder = load_initial_model(source_run, nano())
    assert folder == f"{source_run}/step-000002"
    for a, b in zip(_leaves(model), _leaves(src), strict=True):
        np.testing.assert_array_equal(a, b)

    # A 1-step run from it: its first loss is the source's loss on that run's first batch.
    out = str(tmp_path / "ft")
    summary = train(_config(nano, data_dir, out, num_train_steps=1, seed=5, initialize_from=source_run))
    assert summary["initialized_from"] == f"{source_run}/step-000002"
    # The parameter count (run.json, the summary, the log) is the arrays' total size.
    total = sum(x.size for x in _leaves(src))
    expected_counts = {"total": total, "non_embedding": total - src.embed.array.size}
    assert summary["parameters"] == expected_counts
    with open(f"{out}/run.json") as f:
        assert json.load(f)["parameters"] == expected_counts
    batch = MixtureDataset({f"{data_dir}/train": 1.0}, seq_len=32, seed=5).batch(0, 8)
    expected, _ = loss_fn(
        src,
        batch["tokens"],
        segment_ids=batch["segment_ids"],
        loss_mask=target_mask_to_loss_mask(batch["loss_mask"]),
    )
    assert summary["final_loss"] == pytest.approx(float(expected), rel=1e-5)
    from schooner.train._checkpoint import read_marker

    assert read_marker(f"{out}/step-000001")["step"] == 1  # the step count restarted at 0


def test_a_named_step_and_a_missing_one(nano, source_run) -> None:
    _, folder = load_initial_model(source_run, nano(), step=2)
    assert folder.endswith("step-000002")
    with pytest.raises(FileNotFoundError, match=r"no complete checkpoint of step 7.*\[2\]"):
        load_initial_model(source_run, nano(), step=7)
    with pytest.raises(FileNotFoundError, match=r"nothing-here' does not exist; give a training run folder"):
        load_initial_model(f"{source_run}/nothing-here", nano())  # it said "is not a training run"


def test_an_hf_folder_gives_the_same_weights(nano, source_run, tmp_path) -> None:
    from schooner.model import export_hf, load_model

    src, cfg = load_model(f"{source_run}/step-000002")
    export_hf(src, cfg, tmp_path / "hf", eos_token_id=0, bos_token_id=0, pad_token_id=0)
    model, _ = load_initial_model(str(tmp_path / "hf"), nano())
    for a, b in zip(_leaves(model), _leaves(src), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=0)
    assert initial_model_config(str(tmp_path / "hf"), None, who="t").num_layers == cfg.num_layers


def test_an_hf_config_holding_infinity_is_read_as_transformers_reads_it(nano, source_run, tmp_path) -> None:
    """`transformers` writes and reads `config.json` with Python's json, which allows NaN and Infinity (a config
    attribute set to `float("inf")`): `model=None` takes such a folder's config as `import_hf` takes its
    weights. The strict reader of schooner's own files refused it (`NotStandardJSON`), so the folder that
    `initialize_from=` loads could not give its config."""
    from schooner.model import export_hf, load_model

    src, cfg = load_model(f"{source_run}/step-000002")
    export_hf(src, cfg, tmp_path / "hf", eos_token_id=0, bos_token_id=0, pad_token_id=0)
    path = tmp_path / "hf" / "config.json"
    hf = json.loads(path.read_text())
    path.write_text(json.dumps({**hf, "attn_logit_softcapping": float("inf")}, indent=2))  # unused by us
    assert "Infinity" in path.read_text()
    load_initial_model(str(tmp_path / "hf"), nano())  # the weights load, as before
    assert initial_model_config(str(tmp_path / "hf"), None, who="t").num_layers == cfg.num_layers


def test_a_different_architecture_is_refused_naming_the_field(nano, source_run) -> None:
    with pytest.raises(
        ValueError, match=r"'num_layers' differs: the source has num_layers=2, this run num_layers=3"
    ):
        load_initial_model(source_run, nano(num_layers=3))
    with pytest.raises(ValueError, match="vocab_size=300 is smaller"):
        load_initial_model(source_run, nano(vocab_size=300))
    # What changes no parameter may differ.
    load_initial_model(source_run, nano(max_seq_len=64, compute_dtype="bfloat16"))


def test_the_vocabulary_grows_keeping_the_old_rows(nano, source_run) -> None:
    from schooner.model import load_model

    src, cfg = load_model(f"{source_run}/step-000002")
    model, _ = load_initial_model(source_run, nano(vocab_size=cfg.vocab_size + 8))
    assert model.config.vocab_size == cfg.vocab_size + 8
    assert src.lm_head is None and model.lm_head is None  # llama_nano ties its embeddings
    pairs = [(src.embed.array, model.embed.array)]
    for old, new in pairs:
        old, new = np.asarray(old), np.asarray(new)
        assert new.shape == (cfg.vocab_size + 8, old.shape[1])
        np.testing.assert_array_equal(new[: cfg.vocab_size], old)
        np.testing.assert_allclose(
            new[cfg.vocab_size :], np.broadcast_to(old.mean(0), (8, old.shape[1])), rtol=1e-6
        )
    # Everything without a vocab axis is untouched.
    for a, b in zip(_leaves(model.layers), _leaves(src.layers), strict=True):
        np.testing.assert_array_equal(a, b)


def test_train_lm_takes_the_model_config_from_the_source(nano, data_dir, source_run) -> None:
    from schooner.train.steps import train_lm

    h = train_lm(
        "ft",
        initialize_from=source_run,
        datasets={f"{data_dir}/train": 1.0},
        batch_size=8,
        seq_len=32,
        num_train_steps=1,
    )
    assert dataclasses.asdict(h.config.model)["num_layers"] == 2
    assert str(h.config.initialize_from) == f"{source_run}/step-000002"  # pinned to its latest checkpoint
    with pytest.raises(ValueError, match="give model="):
        train_lm("ft", datasets={f"{data_dir}/train": 1.0}, batch_size=8, seq_len=32, num_train_steps=1)


def test_schooner_export_hf_on_the_command_line(nano, data_dir, source_run, tmp_path) -> None:
    import subprocess
    import sys

    from schooner.model import import_hf, load_model
    from schooner.tokenize import load_tokenizer

    out = tmp_path / "hf"
    cmd = [sys.executable, "-m", "schooner.cluster.cli", "export-hf", source_run, str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tok = load_tokenizer(f"{data_dir}/tokenizer.json")  # found through the run's run.json
    with open(out / "config.json") as f:
        hf_config = json.load(f)
    assert (hf_config["eos_token_id"], hf_config.get("bos_token_id")) == (tok.eos_id, tok.bos_id)
    assert (out / "tokenizer.json").exists() and (out / "generation_config.json").exists()
    src, _ = load_model(f"{source_run}/step-000002")
    model, _ = import_hf(out)
    for a, b in zip(_leaves(model), _leaves(src), strict=True):
        np.testing.assert_array_equal(a, b)
    # the tokenizer's chat template, as Jinja for transformers' apply_chat_template
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == jinja_chat_template(
        "schooner"
    )


def _export_with(run: str, tokenizer: str, out, **kw) -> tuple[dict, dict]:
    from schooner.train._export import ExportHfConfig, _run_export_hf

    record = _run_export_hf(ExportHfConfig(run=run, tokenizer=tokenizer, **kw), str(out))
    return record, json.loads((out / "tokenizer_config.json").read_text())


def test_export_writes_a_chat_template_the_tokenizer_folder_lacks(data_dir, source_run, tmp_path) -> None:
    import shutil

    from schooner.tokenize import load_tokenizer, render_chat

    # a tokenizer folder saved without a Jinja template (as before it existed, or by hand)
    old = tmp_path / "tok"
    old.mkdir()
    shutil.copy(f"{data_dir}/tokenizer.json", old)
    config = json.loads((Path(data_dir) / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (old / "tokenizer_config.json").write_text(json.dumps(config))
    record, written = _export_with(source_run, str(old), tmp_path / "a")
    assert record["chat_template"] == "schooner"
    assert written["chat_template"] == jinja_chat_template("schooner")
    assert written["eos_token"] == config["eos_token"]  # the rest of the file is kept

    # a tokenizer folder's own template is kept; one without the template's tokens is refused
    (old / "tokenizer_config.json").write_text(json.dumps(config | {"chat_template": "{{ messages }}"}))
    record, written = _export_with(source_run, str(old), tmp_path / "b")
    assert (record["chat_template"], written["chat_template"]) == ("tokenizer's own", "{{ messages }}")
    with pytest.raises(ValueError, match=r"chat template 'chatml' needs tokens \['<\|im_start\|>'"):
        _export_with(source_run, str(old), tmp_path / "c", chat_template="chatml")

    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(tmp_path / "a")
    tok = load_tokenizer(tmp_path / "a")
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "def f(x):\n    return x"},
        {"role": "assistant", "content": "It returns x."},
        {"role": "user", "content": "Thanks"},
    ]
    ids = hf.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    ids = ids["input_ids"] if isinstance(ids, dict | transformers.BatchEncoding) else ids
    assert list(ids) == render_chat(tok, messages, add_generation_prompt=True).ids.tolist()


def test_export_takes_the_chat_template_the_run_s_chat_caches_were_rendered_with(data_dir, tmp_path) -> None:
    import shutil

    from schooner.tokenize import SCHOONER_CHAT, load_tokenizer
    from schooner.train._export import ExportHfConfig, write_chat_template

    # a cache manifest recording a template of its own (as build_cache records the one it rendered with)
    custom = dataclasses.replace(SCHOONER_CHAT, name="newline", footer="<|end_of_turn|>\n", bos=False)
    (tmp_path / "chat" / "train").mkdir(parents=True)
    (tmp_path / "chat" / "train" / "manifest.json").write_text(
        json.dumps({"chat_template": dataclasses.asdict(custom)})
    )
    out = tmp_path / "out"
    out.mkdir()
    shutil.copy(f"{data_dir}/tokenizer.json", out)  # a bare tokenizer.json: the config is written whole
    tok = load_tokenizer(out / "tokenizer.json")
    config = ExportHfConfig(run="unused", tokenizer_sources=(str(tmp_path / "chat"),))
    assert write_chat_template(str(out), tok, config) == "newline"
    written = json.loads((out / "tokenizer_config.json").read_text())
    assert written["chat_template"] == jinja_chat_template(custom)
    assert written["eos_token"] == tok.eos_token
