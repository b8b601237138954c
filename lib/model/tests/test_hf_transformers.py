"""HF import and export against real `transformers` (5.x on CPU torch).

The fixtures under `fixtures/hf/` were written by `fixtures/make_hf_fixtures.py` with transformers'
own classes and `save_pretrained`, with the logits torch computed for fixed token ids; `versions.json` says
which versions. The default run imports them with Schooner (no torch) and compares logits. The slow tests
regenerate the fixtures and score Schooner's exports with transformers itself; they need an interpreter
with torch and transformers: this one, or the one `SCHOONER_HF_PYTHON` names.

Tolerance: both sides compute in float32 with different summation orders; over these two-layer models
the largest logit difference measured is 7e-6 (logits up to 5.7 in magnitude). `ATOL = 5e-5` leaves
room for other CPUs' kernels while a wrong RoPE base, scaling rule, router or norm is off by 0.1 to 5.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import equinox as eqx
import jax
import numpy as np
import pytest

from schooner.model import LlamaConfig, MoEConfig, RopeConfig, config_from_hf, export_hf, import_hf, init

FIXTURES = Path(__file__).parent / "fixtures" / "hf"
SCRIPT = Path(__file__).parent / "fixtures" / "make_hf_fixtures.py"
CASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "reference.npz").exists())
ATOL = 5e-5


@eqx.filter_jit
def _logits(model, tokens):
    return model(tokens)


def _compare(folder: Path, reference: dict) -> float:
    model, _ = import_hf(folder)
    got = np.asarray(_logits(model, np.asarray(reference["tokens"], np.int32)))
    want = reference["logits"]
    assert got.shape == want.shape
    return float(np.abs(got - want).max())


def test_the_fixtures_are_there():
    assert CASES == ["llama-theta5e5", "llama3-rope-scaling-tied", "mixtral", "qwen3", "qwen3-moe"]


@pytest.mark.parametrize("name", CASES)
def test_import_matches_transformers_logits(name):
    ref = dict(np.load(FIXTURES / name / "reference.npz"))
    assert float(np.abs(ref["logits"]).max()) > 1.0  # not a degenerate comparison
    assert _compare(FIXTURES / name, ref) < ATOL


def test_configs_written_by_transformers_5_are_read():
    read = {name: config_from_hf(json.loads((FIXTURES / name / "config.json").read_text())) for name in CASES}
    assert read["llama-theta5e5"].rope == RopeConfig(theta=500000.0)
    assert read["llama3-rope-scaling-tied"].rope == RopeConfig(
        theta=500000.0,
        kind="llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8,
    )
    assert read["llama3-rope-scaling-tied"].tie_embeddings
    assert read["qwen3"].rope.theta == 1e6 and read["qwen3"].qk_norm and read["qwen3"].head_dim == 12
    mixtral, qwen_moe = read["mixtral"], read["qwen3-moe"]
    assert isinstance(mixtral, MoEConfig) and mixtral.num_experts == 4 and mixtral.rope.theta == 1e6
    assert isinstance(qwen_moe, MoEConfig) and qwen_moe.num_experts == 4 and not qwen_moe.normalize_topk


def test_the_older_config_layout_is_read_too():
    """transformers 4 wrote `rope_theta` / `rope_scaling` and Qwen3-MoE's `num_experts`."""
    new = json.loads((FIXTURES / "llama3-rope-scaling-tied" / "config.json").read_text())
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    params = dict(new["rope_parameters"])
    old["rope_theta"] = params.pop("rope_theta")
    old["rope_scaling"] = params
    assert config_from_hf(old) == config_from_hf(new)
    moe = json.loads((FIXTURES / "qwen3-moe" / "config.json").read_text())
    moe_old = {k: v for k, v in moe.items() if k not in ("rope_parameters", "num_local_experts")}
    moe_old.update(rope_theta=1e6, rope_scaling=None, num_experts=moe["num_local_experts"])
    assert config_from_hf(moe_old) == config_from_hf(moe)


@pytest.mark.parametrize(
    ("name", "kind"), [("llama-yarn", "yarn"), ("llama-linear", "linear")], ids=["yarn", "linear"]
)
def test_unimplemented_rope_types_are_refused(name, kind):
    hf = json.loads((FIXTURES / "refused" / name / "config.json").read_text())
    with pytest.raises(
        ValueError, match=f"rope_parameters.rope_type={kind!r}.*supported: 'default', 'llama3'"
    ):
        config_from_hf(hf)


def _torch_python() -> str | None:
    """An interpreter with torch and transformers: this one, or $SCHOONER_HF_PYTHON."""
    if importlib.util.find_spec("torch") and importlib.util.find_spec("transformers"):
        return sys.executable
    return os.environ.get("SCHOONER_HF_PYTHON") or None


needs_torch = pytest.mark.skipif(
    _torch_python() is None,
    reason="needs torch + transformers here or an interpreter with them in SCHOONER_HF_PYTHON",
)


@pytest.mark.slow
@needs_torch
def test_regenerated_fixtures_match(tmp_path):
    """Today's transformers writes the same layouts: regenerate every fixture and import it again."""
    out = tmp_path / "hf"
    subprocess.run([_torch_python(), str(SCRIPT), "--out", str(out)], check=True, capture_output=True)
    for name in CASES:
        assert _compare(out / name, dict(np.load(out / name / "reference.npz"))) < ATOL, name
    for name in ("llama-yarn", "llama-linear"):
        with pytest.raises(ValueError, match="rope_type"):
            config_from_hf(json.loads((out / "refused" / name / "config.json").read_text()))


EXPORTS = {
    "llama-llama3-rope-untied": LlamaConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=40, num_layers=2, num_heads=4, num_kv_heads=2,
        rope=RopeConfig(theta=500000.0, kind="llama3", factor=8.0, original_max_position_embeddings=8),
        compute_dtype="float32", initializer_range=0.2,
    ),
    "qwen3-tied": LlamaConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=40, num_layers=2, num_heads=4, num_kv_heads=1,
        head_dim=12, qk_norm=True, tie_embeddings=True, rope=RopeConfig(theta=1e6), compute_dtype="float32",
        initializer_range=0.2,
    ),
    "mixtral": MoEConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=24, num_layers=2, num_heads=4, num_kv_heads=2,
        num_experts=4, num_experts_per_token=2, load_balancing="aux_loss", compute_dtype="float32",
        initializer_range=0.2,
    ),
    "qwen3-moe": MoEConfig(
        vocab_size=61, hidden_dim=32, intermediate_dim=24, num_layers=2, num_heads=4, num_kv_heads=2,
        qk_norm=True, normalize_topk=False, num_experts=4, num_experts_per_token=2,
        load_balancing="aux_loss", compute_dtype="float32", initializer_range=0.2,
    ),
}  # fmt: skip


@pytest.mark.slow
@needs_torch
@pytest.mark.parametrize("name", sorted(EXPORTS))
def test_exports_load_in_transformers_and_match(tmp_path, name):
    cfg = EXPORTS[name]
    model = init(cfg, key=jax.random.PRNGKey(0))
    folder = tmp_path / "hf"
    export_hf(model, cfg, folder, max_shard_bytes=20_000)  # several shards and an index, as HF writes
    assert (folder / "model.safetensors.index.json").exists()
    tokens = np.random.default_rng(1).integers(0, cfg.vocab_size, size=(2, 24))
    np.save(tmp_path / "tokens.npy", tokens)
    subprocess.run(
        [_torch_python(), str(SCRIPT), "--logits", str(folder), "--tokens", str(tmp_path / "tokens.npy"),
         "--out", str(tmp_path / "logits.npy")],
        check=True, capture_output=True,
    )  # fmt: skip
    want = np.load(tmp_path / "logits.npy")
    got = np.asarray(_logits(model, np.asarray(tokens, np.int32)))
    assert float(np.abs(got - want).max()) < ATOL
    shutil.rmtree(folder)


def test_a_config_override_that_changes_the_architecture_is_refused():
    """`import_hf(config=...)` may change how the model runs, never what it computes: a RoPE base, norm epsilon
    or top-k that differs from config.json (tensor shapes unchanged) would give other logits than
    transformers' without a word."""
    folder = FIXTURES / "llama-theta5e5"
    derived = config_from_hf(json.loads((folder / "config.json").read_text()))
    wrong = dataclasses.replace(derived, rope=RopeConfig(theta=10000.0), norm_eps=1e-5)
    with pytest.raises(ValueError, match=r"'rope'.*theta=500000\.0.*theta=10000\.0") as err:
        import_hf(folder, config=wrong)
    assert "'norm_eps'" in str(err.value) and "llama-theta5e5" in str(err.value)
    moe_folder = FIXTURES / "mixtral"
    moe = config_from_hf(json.loads((moe_folder / "config.json").read_text()))
    with pytest.raises(ValueError, match=r"'num_experts_per_token'.*2.*1"):
        import_hf(moe_folder, config=dataclasses.replace(moe, num_experts_per_token=1))
    with pytest.raises(ValueError, match="MoEConfig.*LlamaConfig"):
        import_hf(folder, config=MoEConfig(**{f: getattr(derived, f) for f in ("vocab_size", "hidden_dim")}))
    # What changes how the model runs, not what it computes, may differ.
    runtime = dataclasses.replace(
        derived, compute_dtype="float32", attention_implementation="xla", head_dim=None, max_seq_len=4096
    )
    ref = dict(np.load(folder / "reference.npz"))
    model, config = import_hf(folder, config=runtime)
    assert config == runtime
    got = np.asarray(_logits(model, np.asarray(ref["tokens"], np.int32)))
    assert float(np.abs(got - ref["logits"]).max()) < ATOL
    balanced = dataclasses.replace(moe, load_balancing="quantile", capacity_factor=2.0, aux_loss_weight=0.1)
    assert import_hf(moe_folder, config=balanced)[1] == balanced


@pytest.mark.parametrize("key", ["num_attention_heads", "vocab_size", "hidden_size", "intermediate_size"])
def test_a_config_json_without_a_required_key_is_named(key):
    hf = json.loads((FIXTURES / "llama-theta5e5" / "config.json").read_text())
    del hf[key]
    with pytest.raises(ValueError, match=rf"config\.json of model_type 'llama' lacks {key!r}"):
        config_from_hf(hf)
    moe = json.loads((FIXTURES / "qwen3-moe" / "config.json").read_text())
    del moe["moe_intermediate_size"]
    with pytest.raises(ValueError, match="lacks 'moe_intermediate_size'"):
        config_from_hf(moe)


# What transformers 5.25's config classes (and 4.x's, the same values) give for a key config.json leaves out,
# read from `transformers.AutoConfig.for_model(model_type, **SIZES)`: the defaults differ between model types.
SIZES = dict(
    vocab_size=64, hidden_size=256, intermediate_size=40, num_hidden_layers=2, num_attention_heads=32
)
TRANSFORMERS_DEFAULTS = {
    "llama": dict(norm_eps=1e-6, theta=1e4, num_kv_heads=32, head_dim=8, max_seq_len=2048),
    "qwen3": dict(norm_eps=1e-6, theta=1e4, num_kv_heads=32, head_dim=128, max_seq_len=32768),
    "mixtral": dict(norm_eps=1e-5, theta=1e6, num_kv_heads=8, head_dim=8, max_seq_len=131072, experts=(8, 2)),
    "qwen3_moe": dict(
        norm_eps=1e-6, theta=1e4, num_kv_heads=4, head_dim=8, max_seq_len=32768, experts=(128, 8)
    ),
    "mistral": dict(norm_eps=1e-6, theta=1e4, num_kv_heads=8, head_dim=8, max_seq_len=131072),
}


@pytest.mark.parametrize("model_type", sorted(TRANSFORMERS_DEFAULTS))
def test_keys_config_json_leaves_out_take_transformers_defaults_for_the_model_type(model_type):
    """A hand-written or trimmed config.json: Schooner's one set of defaults (eps 1e-5, base 10000, kv heads =
    heads) gave a Llama/Qwen3 norm eps 10x too large and a Mixtral a RoPE base 100x too small, silently."""
    hf = {"model_type": model_type, **SIZES}
    if model_type == "qwen3_moe":
        hf["moe_intermediate_size"] = 24
    if model_type == "mistral":  # its default sliding window (4096) is refused: Schooner has none
        with pytest.raises(ValueError, match="sliding_window=4096"):
            config_from_hf(hf)
        hf["sliding_window"] = None
    cfg, want = config_from_hf(hf), TRANSFORMERS_DEFAULTS[model_type]
    got = dict(
        norm_eps=cfg.norm_eps,
        theta=cfg.rope.theta,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.resolved_head_dim,
        max_seq_len=cfg.max_seq_len,
    )
    if cfg.moe is not None:
        got["experts"] = (cfg.moe.num_experts, cfg.moe.num_experts_per_token)
    assert got == want
    assert not cfg.tie_embeddings
    # An explicit null means "as many kv heads as heads", as transformers reads it.
    assert config_from_hf({**hf, "num_key_value_heads": None}).num_kv_heads == 32


def test_a_folder_of_the_other_layout_is_named_with_the_loader_that_reads_it(tmp_path):
    """load_model on an HF folder listed two dozen 'unknown fields'; import_hf on a Schooner checkpoint said
    'unsupported HF model_type None'. Each now says which loader the folder is for."""
    from schooner.model import load_model, save_model

    with pytest.raises(ValueError, match=r"Hugging Face config\.json.*import_hf"):
        load_model(FIXTURES / "qwen3")
    cfg = EXPORTS["qwen3-tied"]
    save_model(tmp_path / "ckpt", init(cfg, key=jax.random.PRNGKey(0)), cfg)
    with pytest.raises(ValueError, match=r"a Schooner model config.*load_model"):
        import_hf(tmp_path / "ckpt")
