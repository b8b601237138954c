import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from schooner.tokenize import BPEConfig, Tokenizer, load_tokenizer, train_bpe
from schooner.tokenize._tokenizer import fingerprint_of


def test_trained_tokenizer_special_tokens_and_roundtrip(tokenizer: Tokenizer, texts: list[str]) -> None:
    assert tokenizer.vocab_size == 800
    assert (tokenizer.bos_id, tokenizer.eos_id, tokenizer.pad_id) == (0, 1, 2)
    assert tokenizer.special_tokens[:3] == ["<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"]
    for role in ("<|system|>", "<|user|>", "<|assistant|>", "<|end_of_turn|>"):
        assert tokenizer.token_to_id(role) is not None
    assert tokenizer.decode(tokenizer.encode(texts[3])) == texts[3]
    # merges learned: real text compresses well below one token per byte
    assert len(tokenizer.encode(texts[3])) < 0.5 * len(texts[3].encode())
    assert tokenizer.encode_batch(texts[:3]) == [tokenizer.encode(t) for t in texts[:3]]
    assert tokenizer.encode("<|user|>", parse_special=True) == [tokenizer.token_to_id("<|user|>")]
    # by default a document that mentions a special token gets plain text, not a control token
    plain = tokenizer.encode("x<|end_of_text|>y")
    assert tokenizer.eos_id not in plain and tokenizer.decode(plain) == "x<|end_of_text|>y"


@settings(max_examples=80, deadline=None)
@given(text=st.text(max_size=200))
def test_byte_lengths_sum_to_utf8_bytes_and_roundtrip(tokenizer: Tokenizer, text: str) -> None:
    lengths = tokenizer.token_byte_lengths()
    ids = tokenizer.encode(text)
    assert tokenizer.decode(ids) == text
    assert int(lengths[ids].sum()) == len(text.encode("utf-8"))


def test_byte_lengths_zero_for_specials(tokenizer: Tokenizer) -> None:
    lengths = tokenizer.token_byte_lengths()
    assert lengths.dtype == np.int32 and lengths.shape == (tokenizer.vocab_size,)
    for tok in tokenizer.special_tokens:
        assert lengths[tokenizer.token_to_id(tok)] == 0
    assert (lengths[len(tokenizer.special_tokens) :] >= 1).all()


def test_save_load_file_and_folder_keep_fingerprint(tokenizer: Tokenizer, tmp_path: Path) -> None:
    folder = tokenizer.save(tmp_path / "t")
    from_folder = load_tokenizer(folder)
    from_file = load_tokenizer(Path(folder) / "tokenizer.json")
    assert from_folder.fingerprint == from_file.fingerprint == tokenizer.fingerprint
    assert from_folder.eos_id == tokenizer.eos_id and from_folder.chat_template == "schooner"
    # the fingerprint ignores JSON formatting but not content
    js = json.loads((Path(folder) / "tokenizer.json").read_text())
    assert fingerprint_of(json.dumps(js, indent=4)) == tokenizer.fingerprint
    js["model"]["vocab"]["zzz_extra"] = 799
    assert fingerprint_of(json.dumps(js)) != tokenizer.fingerprint


def test_bos_eos_from_hf_config_or_arguments(tokenizer: Tokenizer, tmp_path: Path) -> None:
    folder = Path(tokenizer.save(tmp_path / "t"))
    (folder / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": "<|end_of_turn|>"}}))
    assert load_tokenizer(folder).eos_id == tokenizer.token_to_id("<|end_of_turn|>")
    assert load_tokenizer(folder, eos_token="<|pad|>").eos_id == tokenizer.pad_id
    with pytest.raises(ValueError, match="not in its vocabulary"):
        load_tokenizer(folder, bos_token="<nope>")


def test_a_config_naming_a_missing_token_is_reported_as_the_config_s(
    tokenizer: Tokenizer, tmp_path: Path
) -> None:
    folder = Path(tokenizer.save(tmp_path / "t"))
    config = folder / "tokenizer_config.json"
    cfg = json.loads(config.read_text())
    config.write_text(
        json.dumps({**cfg, "eos_token": "<|eot_id|>"})
    )  # a Llama-3-Instruct config on another tokenizer
    with pytest.raises(ValueError) as err:
        load_tokenizer(folder)
    message = str(err.value)
    assert str(config) in message and "eos_token" in message and "'<|eot_id|>'" in message, message
    assert load_tokenizer(folder, eos_token="<|end_of_turn|>").eos_id == tokenizer.token_to_id(
        "<|end_of_turn|>"
    )
    # a value that is not a token string at all is an error too, not silently replaced by a guess
    config.write_text(json.dumps({**cfg, "eos_token": 5}))
    with pytest.raises(ValueError, match=r"tokenizer_config.json.*eos_token.*5"):
        load_tokenizer(folder)


def _fake_hub_cache(cache: Path, repo: str, tokenizer: Tokenizer) -> None:
    """The on-disk layout huggingface_hub itself writes: refs/main -> snapshots/<commit>/files."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    root = cache / f"models--{repo.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(commit)
    tokenizer.save(root / "snapshots" / commit)


def test_hub_id_resolves_through_huggingface_hub_cache(
    tokenizer: Tokenizer, tmp_path: Path, monkeypatch
) -> None:
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # huggingface_hub reads the variable once, when its constants are first imported: in a process where an
    # earlier test did that, the lookups went to the (unreachable) hub, 5 retries each, 23 s.
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    _fake_hub_cache(tmp_path / "hub", "schooner-test/tiny-bpe", tokenizer)
    tok = load_tokenizer("schooner-test/tiny-bpe", cache_dir=str(tmp_path / "hub"))
    assert tok.fingerprint == tokenizer.fingerprint and tok.eos_id == tokenizer.eos_id
    with pytest.raises(FileNotFoundError, match="not in the local hub cache"):
        load_tokenizer("schooner-test/absent", cache_dir=str(tmp_path / "hub"))


def test_bad_paths(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    with pytest.raises(FileNotFoundError, match="no such file"):
        load_tokenizer(str(tmp_path / "missing" / "tok.json"))
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "a tokenizer"}')
    with pytest.raises(ValueError, match="not a Hugging Face tokenizers JSON"):
        load_tokenizer(bad)


def test_bpe_config_validation() -> None:
    with pytest.raises(ValueError, match="vocab_size"):
        BPEConfig(vocab_size=100)
    with pytest.raises(ValueError, match="eos_token"):
        BPEConfig(eos_token="<eos>")
    with pytest.raises(ValueError, match="duplicates"):
        BPEConfig(special_tokens=("<a>", "<a>"), bos_token="<a>", eos_token="<a>", pad_token="<a>")
    with pytest.raises(ValueError, match="no texts"):
        train_bpe([], vocab_size=300)
    with pytest.raises(TypeError, match="text #1 is int"):
        train_bpe(["a", 5], vocab_size=300)


_TRAIN = """
import sys, sysconfig
from pathlib import Path
from schooner.tokenize import train_bpe
files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:40]
print(train_bpe((f.read_text(encoding="utf-8", errors="replace") for f in files), vocab_size=800).fingerprint)
"""


def test_training_is_deterministic_across_processes(tokenizer: Tokenizer) -> None:
    # A fresh interpreter has a different hash seed: the merges must not depend on it.
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", _TRAIN], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip() == tokenizer.fingerprint


def test_train_from_a_data_dataset(tokenizer: Tokenizer, texts: list[str]) -> None:
    from schooner.data import Dataset, make_record

    ds = Dataset.from_records([make_record(t, source="stdlib") for t in texts])
    assert train_bpe(ds, vocab_size=800).fingerprint == tokenizer.fingerprint


def test_byte_lengths_of_a_sentencepiece_style_tokenizer() -> None:
    from tokenizers import SentencePieceBPETokenizer

    sp = SentencePieceBPETokenizer()
    sp.train_from_iterator(
        ["hello world this is a test", "héllo wörld"] * 50,
        vocab_size=200,
        special_tokens=["<unk>", "<s>", "</s>"],
    )
    import tokenizers

    tok = Tokenizer(tokenizers.Tokenizer.from_str(sp._tokenizer.to_str()))
    assert (tok.bos_id, tok.eos_id) == (1, 2)  # found by their conventional names
    text = "hello wörld this"
    ids = tok.encode(text)
    # "▁" stands for a space; Metaspace prepends one to the first word, so the count includes it
    assert int(tok.token_byte_lengths()[ids].sum()) == len((" " + text).encode("utf-8"))
