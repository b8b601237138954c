import json
from pathlib import Path

import numpy as np
import pytest

from schooner.cluster import StepFailedError, StepRunner, lower
from schooner.data import make_record, write_records
from schooner.tokenize import MixtureDataset, TokenCache, load_tokenizer
from schooner.tokenize.steps import tokenized, train_tokenizer

from .conftest import stdlib_texts


@pytest.fixture(scope="module")
def records(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = str(tmp_path_factory.mktemp("steps") / "recs")
    write_records([make_record(t, source="stdlib") for t in stdlib_texts(30, start=10)], path, num_shards=3)
    return path


def test_train_then_tokenize_as_steps(records: str, tmp_path: Path) -> None:
    tok = train_tokenizer("tokenizers/tiny", paths=records, vocab_size=600, max_chars=400_000)
    docs = tokenized("tokenized/tiny", paths=[records], tokenizer=tok, validation_fraction=0.1)
    result = StepRunner(prefix=str(tmp_path), quiet=True).run([docs])
    tok_out, docs_out = result[tok].output_path, result[docs].output_path
    assert result[tok].result["chars"] == 400_000
    tokenizer = load_tokenizer(tok_out)
    assert tokenizer.vocab_size == 600 and tokenizer.eos_id is not None
    assert Path(tok_out, "tokenizer.json").is_file()
    train = TokenCache.open(f"{docs_out}/train", tokenizer=tokenizer)
    val = TokenCache.open(f"{docs_out}/validation", tokenizer=tokenizer)
    assert train.num_documents + val.num_documents == 30 and val.num_documents >= 1
    assert result[docs].result["train_tokens"] == train.num_tokens
    # a tokenized folder is a mixture component as is (its train split)
    batch = MixtureDataset({docs_out: 1.0}, seq_len=64, seed=0).batch(0, 4)
    assert batch["tokens"].shape == (4, 64) and int(batch["tokens"].max()) < 600
    # the same definition is cached: nothing reruns
    again = StepRunner(prefix=str(tmp_path), quiet=True).run(
        [tokenized("tokenized/tiny", paths=[records], tokenizer=tok, validation_fraction=0.1)]
    )
    assert again[docs].output_path == docs_out and again[docs].state == "cached"


def test_train_tokenizer_step_with_its_own_special_tokens(records: str, tmp_path: Path) -> None:
    """GPT-2 style: one `<|endoftext|>` as BOS, EOS and padding, no chat tokens."""
    tok = train_tokenizer(
        "tokenizers/eot", paths=records, vocab_size=500, special_tokens=["<|endoftext|>"],
        bos_token="<|endoftext|>", eos_token="<|endoftext|>", pad_token="<|endoftext|>",
    )  # fmt: skip
    out = StepRunner(prefix=str(tmp_path), quiet=True).run([tok])[tok].output_path
    loaded = load_tokenizer(out)
    assert loaded.bos_id == loaded.eos_id == loaded.pad_id == loaded.token_to_id("<|endoftext|>") == 0
    assert loaded.chat_template is None  # no role tokens: no chat template recorded
    # the defaults keep the key they had (these fields were in BPEConfig already)
    assert (
        train_tokenizer("t", paths=records, vocab_size=600).key
        == train_tokenizer("t", paths=records, vocab_size=600, bos_token="<|begin_of_text|>").key
    )


def test_identity_follows_config_and_tokenizer_content(records: str, tokenizer, tmp_path: Path) -> None:
    a = train_tokenizer("tok", paths=records, vocab_size=600)
    assert a.key == train_tokenizer("tok", paths=records, vocab_size=600).key
    assert a.key != train_tokenizer("tok", paths=records, vocab_size=700).key
    folder = Path(tokenizer.save(tmp_path / "t"))
    t1 = tokenized("tk", paths=records, tokenizer=str(folder))
    assert t1.key == tokenized("tk", paths=records, tokenizer=str(folder)).key
    assert t1.key != tokenized("tk", paths=records, tokenizer=a).key
    # the same path with other content is another step
    js = json.loads((folder / "tokenizer.json").read_text())
    js["added_tokens"][0]["content"] = "<|bos_renamed|>"
    (folder / "tokenizer.json").write_text(json.dumps(js))
    (folder / "tokenizer_config.json").unlink()
    t2 = tokenized("tk", paths=records, tokenizer=str(folder))
    assert t2.key != t1.key
    with pytest.raises(StepFailedError, match="changed since the step was defined"):
        StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([t1])


def test_source_builds_on_the_embedded_records_step() -> None:
    h = tokenized(
        "tokenized/python-docs", source="python-docs", tokenizer=train_tokenizer("t", source="python-docs")
    )
    names = [s.name for s in lower(h)]
    assert names[0] == "data/python-docs" and names[-1] == "tokenized/python-docs" and "t" in names


def test_bad_step_arguments(records: str) -> None:
    with pytest.raises(ValueError, match="exactly one of source= .* or paths="):
        tokenized("x", source="python-docs", paths=records, tokenizer="/nowhere")
    with pytest.raises(ValueError, match="exactly one of source="):
        train_tokenizer("x")
    with pytest.raises(TypeError, match="tokenizer must be a train_tokenizer step handle"):
        tokenized("x", paths=records, tokenizer=np.zeros(3))
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer("x", paths=records, vocab_size=10)
    with pytest.raises(ValueError, match="validation_fraction"):
        tokenized("x", paths=records, tokenizer=train_tokenizer("t", paths=records), validation_fraction=2.0)


def test_tokenized_takes_on_error(records: str, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    good = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(stdlib_texts(3))]
    (bad / "part-00000-of-00001.jsonl").write_text("\n".join([good[0], "{not json", good[1], good[2]]) + "\n")
    tok = train_tokenizer("tokenizers/tiny", paths=records, vocab_size=600, max_chars=200_000)
    docs = tokenized(
        "tokenized/lenient", paths=[str(bad)], tokenizer=tok, on_error="skip", validation_fraction=0.0
    )
    result = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([docs])[docs]
    assert result.result["skipped_bad"] == 1 and result.result["train_documents"] == 3
    with pytest.raises(ValueError, match="on_error must be 'raise' or 'skip', got on_error='ignore'"):
        tokenized("x", paths=[str(bad)], tokenizer=tok, on_error="ignore")


def test_user_files_are_keyed_by_content_not_by_where_they_sit(records: str, tmp_path: Path) -> None:
    import shutil

    tok = train_tokenizer("tok", paths=records, vocab_size=600)
    moved = tmp_path / "moved" / "recs"
    shutil.copytree(records, moved)
    assert train_tokenizer("tok", paths=str(moved), vocab_size=600).key == tok.key  # moving reruns nothing
    a = tokenized("tk", paths=[records], tokenizer=tok)
    assert tokenized("tk", paths=[str(moved)], tokenizer=tok).key == a.key
    shard = sorted(moved.glob("part-*"))[0]
    shard.write_bytes(shard.read_bytes() + b"")  # same bytes: same key
    assert tokenized("tk", paths=[str(moved)], tokenizer=tok).key == a.key
    write_records(
        [make_record(t, source="stdlib") for t in stdlib_texts(30, start=11)], str(moved), num_shards=3
    )
    assert tokenized("tk", paths=[str(moved)], tokenizer=tok).key != a.key  # edited content reruns
    # The step reads the folder where it sits today.
    result = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run(
        [tokenized("tk", paths=[str(moved)], tokenizer=tok)]
    )
    assert result.ok


def test_identity_follows_the_special_tokens_of_tokenizer_config(
    records: str, tokenizer, tmp_path: Path
) -> None:
    """Editing only tokenizer_config.json's eos_token is another tokenized step: its documents end with the
    new EOS, and the step defined before the edit refuses to run (it would cache the new EOS under the old
    key)."""
    folder = Path(tokenizer.save(tmp_path / "t"))
    before = tokenized("tk", paths=records, tokenizer=str(folder))
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    assert cfg["eos_token"] == "<|end_of_text|>"
    cfg["eos_token"] = "<|end_of_turn|>"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    after = tokenized("tk", paths=records, tokenizer=str(folder))
    assert after.key != before.key
    new_eos = tokenizer.token_to_id("<|end_of_turn|>")
    out = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([after])[after].output_path
    cache = TokenCache.open(out)
    assert cache.eos_id == new_eos and cache.document(0)[-1] == new_eos
    with pytest.raises(StepFailedError, match="special tokens changed since the step was defined"):
        StepRunner(prefix=str(tmp_path / "q"), quiet=True).run([before])
