import contextlib
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from schooner.cluster import JobError, LocalClient
from schooner.data import make_record, write_records
from schooner.tokenize import (
    CacheError,
    MixtureDataset,
    MixtureError,
    TokenCache,
    Tokenizer,
    TokenizerMismatchError,
    build_cache,
    load_tokenizer,
    split_of,
    train_bpe,
    write_cache,
)

from .conftest import stdlib_texts


def _records(n: int, start: int = 0) -> list[dict]:
    recs = [make_record(t, source="stdlib") for t in stdlib_texts(n, start)]
    recs.insert(3, make_record("", source="stdlib", id="the-empty-one"))
    recs.append(make_record("mentions <|end_of_text|> literally", source="stdlib", id="forger"))
    return recs


@pytest.fixture(scope="module")
def records_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict]]:
    path = str(tmp_path_factory.mktemp("records") / "recs")
    recs = _records(48)
    write_records(recs, path, format="jsonl.zst", num_shards=5)
    return path, recs


@pytest.fixture(scope="module")
def local_client():
    client = LocalClient(max_workers=2)
    yield client
    client.shutdown()


def _snapshot(out: str) -> dict:
    """Everything a reader can see of the two caches: manifests and every stored byte of the arrays."""
    snap = {}
    for split in ("train", "validation"):
        c = TokenCache.open(os.path.join(out, split))
        m = dict(c.manifest)
        snap[split] = (
            json.dumps(m, sort_keys=True),
            c.tokens(0, c.num_tokens).tobytes(),
            c.offsets().tobytes(),
        )
    return snap


def test_build_contents_split_and_manifest(
    records_dir, tokenizer: Tokenizer, tokenizer_path: str, local_client, tmp_path
) -> None:
    path, recs = records_dir
    out = str(tmp_path / "cache")
    summary = build_cache(path, out, tokenizer_path, validation_fraction=0.25, client=local_client)
    train, val = TokenCache.open(f"{out}/train", tokenizer=tokenizer), TokenCache.open(f"{out}/validation")
    nonempty = [r for r in recs if r["text"]]
    expect_val = [r for r in nonempty if split_of(r["id"], 0.25, 0) == "validation"]
    expect_train = [r for r in nonempty if split_of(r["id"], 0.25, 0) == "train"]
    assert 3 <= len(expect_val) <= 25  # the rule really splits this corpus
    assert (train.num_documents, val.num_documents) == (len(expect_train), len(expect_val))
    for cache, expected in ((train, expect_train), (val, expect_val)):
        for i, rec in enumerate(expected):
            doc = cache.document(i)
            assert doc[-1] == tokenizer.eos_id and tokenizer.eos_id not in doc[:-1]
            assert doc.tolist() == tokenizer.encode(rec["text"]) + [tokenizer.eos_id]
        assert cache.num_tokens == sum(len(tokenizer.encode(r["text"])) + 1 for r in expected)
    m = train.manifest
    assert (
        m["tokenizer_fingerprint"] == tokenizer.fingerprint
        and m["vocab_size"] == 800
        and m["dtype"] == "uint16"
    )
    assert m["skipped_empty"] == 1 and summary["skipped_empty"] == 1
    assert len(m["shards"]) == 5 and sum(s["documents"] for s in m["shards"]) == train.num_documents
    assert [s["token_start"] for s in m["shards"]] == np.cumsum([0] + [s["tokens"] for s in m["shards"]])[
        :-1
    ].tolist()
    assert m["sources"] == [path] and m["max_token_id"] < 800
    assert not os.path.exists(f"{out}/parts")  # merged and cleaned
    train.verify()  # the ledger's per-shard sha256 matches the merged arrays
    val.verify()
    assert load_tokenizer(out).fingerprint == tokenizer.fingerprint  # the folder carries its tokenizer
    assert TokenCache.open(out).path.endswith("train")  # a step folder opens as its train split
    # a finished build is not redone
    assert build_cache(path, out, tokenizer_path, validation_fraction=0.25, client=local_client) == summary


@pytest.mark.parametrize("encoder", ["hf", "tiktoken"])
def test_threads_of_this_process_and_client_workers_build_identical_caches(
    records_dir, tokenizer_path, local_client, tmp_path, encoder
) -> None:
    path, _ = records_dir
    here, there = str(tmp_path / "threads"), str(tmp_path / "workers")
    kw = {"validation_fraction": 0.25, "client": local_client, "encoder": encoder}
    assert build_cache(path, here, tokenizer_path, **kw)["train_documents"] > 0  # small input: threads
    build_cache(path, there, tokenizer_path, in_process_below=0, **kw)  # always on the client
    assert _snapshot(here) == _snapshot(there)
    # a failing shard is reported alike: a JobError naming the task, with the DataError (file, line) as cause
    bad = tmp_path / "bad"
    write_records(_records(6), str(bad), format="jsonl", num_shards=2)
    last = sorted(bad.glob("part-*.jsonl"))[-1]
    bad_line = last.read_bytes().count(b"\n") + 1
    last.write_bytes(last.read_bytes() + b"{not json\n")
    errors = []
    for below in (1 << 30, 0):
        with pytest.raises(JobError, match=r"tokenize-shard\[1\]") as info:
            build_cache(str(bad), str(tmp_path / f"bad-{below}"), tokenizer_path, client=local_client,
                        in_process_below=below)  # fmt: skip
        assert info.value.cause_type == "schooner.data._errors.DataError"
        assert f"{last}, line {bad_line}: malformed JSON" in str(info.value.__cause__)
        errors.append(str(info.value).split("\n")[0])
    assert errors[0] == errors[1]
    with pytest.raises(ValueError, match="in_process_below must be an integer >= 0"):
        build_cache(path, str(tmp_path / "x"), tokenizer_path, in_process_below=-1)


def test_resume_redoes_only_unfinished_shards_identically(tokenizer_path, local_client, tmp_path) -> None:
    src, straight, resumed = str(tmp_path / "recs"), str(tmp_path / "straight"), str(tmp_path / "resumed")
    write_records(_records(30), src, format="jsonl", num_shards=5)
    last = Path(sorted(Path(src).glob("part-*.jsonl"))[-1])
    original = last.read_bytes()
    # An interrupted build: the last shard holds a bad line, so the build stops after shards 0-3 finished.
    last.write_bytes(original + b"{not json\n")
    with pytest.raises(JobError, match="line"):
        build_cache(src, resumed, tokenizer_path, validation_fraction=0.2, client=local_client)
    assert len(list(Path(resumed, "parts").glob("part-*.json"))) == 4
    assert not Path(resumed, "train", "manifest.json").exists()
    last.write_bytes(original)  # fixed: the rerun redoes only that shard
    summary = build_cache(src, resumed, tokenizer_path, validation_fraction=0.2, client=local_client)
    assert (summary["shards"], summary["shards_redone"]) == (5, 1)
    build_cache(src, straight, tokenizer_path, validation_fraction=0.2, client=local_client)
    assert _snapshot(resumed) == _snapshot(straight)


_KILLED_BUILD = """
import sys
from schooner.cluster import JobError, LocalClient
from schooner.tokenize import build_cache
client = LocalClient(max_workers=1)
build_cache(sys.argv[1], sys.argv[2], sys.argv[3], validation_fraction=0.1, client=client, batch_chars=1024, piece_chars=1024,
            in_process_below=0)  # on worker processes: they are killed too
"""


def test_sigkill_mid_build_then_rerun_gives_identical_cache(tokenizer_path, local_client, tmp_path) -> None:
    recs = _records(64)
    src = str(tmp_path / "recs")
    write_records(recs, src, format="jsonl.zst", num_shards=16)
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, src, killed, tokenizer_path], start_new_session=True
    )
    parts = Path(killed, "parts")
    deadline = time.monotonic() + 240  # generous: the machine may be busy
    while time.monotonic() < deadline and len(list(parts.glob("part-*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.005)
    family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in family:  # the build and the workers it started, all at once, mid-way
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    done_at_kill = len(list(parts.glob("part-*.json")))
    assert 2 <= done_at_kill < 16, f"the build was not caught mid-way ({done_at_kill} of 16 shards done)"
    assert not Path(killed, "train", "manifest.json").exists()
    with pytest.raises(CacheError, match="no manifest.json"):
        TokenCache.open(f"{killed}/train")
    small = {"batch_chars": 1024, "piece_chars": 1024}  # as the killed build: many batches and cut documents
    summary = build_cache(src, killed, tokenizer_path, validation_fraction=0.1, client=local_client, **small)
    assert summary["shards_redone"] <= 16 - 2
    build_cache(src, straight, tokenizer_path, validation_fraction=0.1, client=local_client, **small)
    assert _snapshot(killed) == _snapshot(straight)


def test_bad_inputs(records_dir, tokenizer: Tokenizer, tokenizer_path: str, local_client, tmp_path) -> None:
    path, _ = records_dir
    with pytest.raises(FileNotFoundError, match="token cache input .*nowhere"):
        build_cache(str(tmp_path / "nowhere"), str(tmp_path / "o1"), tokenizer_path, client=local_client)
    with pytest.raises(ValueError, match="validation_fraction must be in"):
        build_cache(path, str(tmp_path / "o2"), tokenizer_path, validation_fraction=1.0)
    no_eos = train_bpe(
        ["abc abc abc"] * 5,
        vocab_size=300,
        special_tokens=("<s>",),
        bos_token="<s>",
        eos_token="<s>",
        pad_token="<s>",
    )
    no_eos.eos_token = None
    with pytest.raises(ValueError, match="has no EOS token"):
        build_cache(path, str(tmp_path / "o3"), no_eos)
    out = str(tmp_path / "o4")
    build_cache(path, out, tokenizer_path, client=local_client)
    other = train_bpe(["other text entirely " * 20], vocab_size=300)
    with pytest.raises(TokenizerMismatchError, match=rf"token cache '{out}/train' was built with tokenizer"):
        TokenCache.open(f"{out}/train", tokenizer=other)
    with pytest.raises(CacheError, match="beyond vocab_size=10"):
        TokenCache.open(out, vocab_size=10)
    with pytest.raises(ValueError, match="memory:// is not shared"):
        build_cache(path, "memory://x", tokenizer)


def test_prepend_bos(records_dir, tokenizer: Tokenizer, tokenizer_path: str, local_client, tmp_path) -> None:
    path, recs = records_dir
    out = str(tmp_path / "bos")
    build_cache(path, out, tokenizer_path, prepend_bos=True, client=local_client)
    cache = TokenCache.open(out)
    assert cache.manifest["prepend_bos"] is True
    for i, rec in enumerate([r for r in recs if r["text"]][:5]):
        assert cache.document(i).tolist() == [
            tokenizer.bos_id,
            *tokenizer.encode(rec["text"]),
            tokenizer.eos_id,
        ]


def test_bad_records_raise_or_are_counted(tokenizer_path: str, local_client, tmp_path) -> None:
    src = tmp_path / "recs"
    src.mkdir()
    good = [json.dumps({"id": f"d{i}", "text": t}) for i, t in enumerate(stdlib_texts(3))]
    lines = [good[0], "{not json", good[1], '{"id": "n", "text": 7}', good[2]]
    (src / "part-00000-of-00001.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(JobError, match=r"part-00000-of-00001.jsonl.*line 2"):
        build_cache(str(src), str(tmp_path / "strict"), tokenizer_path, client=local_client)
    summary = build_cache(
        str(src), str(tmp_path / "lenient"), tokenizer_path, on_error="skip", client=local_client
    )
    cache = TokenCache.open(str(tmp_path / "lenient"))
    assert cache.num_documents == 3 and summary["skipped_bad"] == 2
    bad = cache.manifest["skipped_bad"]
    assert bad["skipped"] == 2 and any("line 2" in e for e in bad["examples"])
    assert any("line 4" in e and "must be a string" in e for e in bad["examples"])


def test_a_build_of_another_plan_or_changed_inputs_is_rebuilt(tokenizer_path, local_client, tmp_path) -> None:
    src, out, fresh = str(tmp_path / "recs"), str(tmp_path / "out"), str(tmp_path / "fresh")
    recs = _records(12)
    write_records(recs, src, format="jsonl", num_shards=3)
    build_cache(src, out, tokenizer_path, validation_fraction=0.2, client=local_client)
    # The same folder, another split seed: rebuilt, never the old split.
    build_cache(src, out, tokenizer_path, validation_fraction=0.2, split_seed=3, client=local_client)
    build_cache(src, fresh, tokenizer_path, validation_fraction=0.2, split_seed=3, client=local_client)
    assert _snapshot(out) == _snapshot(fresh)
    # The inputs rewritten with other text of the same size (as a forced upstream step would): rebuilt.
    changed = [{**r, "text": r["text"].swapcase()} for r in recs]
    write_records(changed, src, format="jsonl", num_shards=3)
    summary = build_cache(
        src, out, tokenizer_path, validation_fraction=0.2, split_seed=3, client=local_client
    )
    assert summary["shards_redone"] == 3
    shutil.rmtree(fresh)
    build_cache(src, fresh, tokenizer_path, validation_fraction=0.2, split_seed=3, client=local_client)
    assert _snapshot(out) == _snapshot(fresh)


def test_pickled_cache_reopens_its_arrays(tokenizer: Tokenizer, tmp_path) -> None:
    # What Ray does with a TokenCache handed to a task: the open tensorstore handles stay behind.
    docs = [np.arange(5, 5 + n) for n in (3, 9, 1, 6)]
    cache = write_cache(str(tmp_path / "c"), docs, tokenizer, append_eos=False)
    before = cache.tokens(0, cache.num_tokens)
    back = pickle.loads(pickle.dumps(cache))
    assert back.path == cache.path and back.manifest == cache.manifest
    assert back._tokens is None and back._offsets is None and back._arrays == {}
    assert np.array_equal(back.tokens(0, back.num_tokens), before)
    assert np.array_equal(before, np.concatenate(docs))
    assert [back.document(i).tolist() for i in range(len(docs))] == [d.tolist() for d in docs]


def test_a_text_split_left_empty_is_a_warning_naming_it_and_the_fix(tokenizer_path, tmp_path, caplog) -> None:
    """A plain-text build said nothing when its validation_fraction routed no document to validation (a
    held-out set asked for and silently not built): it warns like chat and preference builds do."""
    import logging

    from schooner.tokenize._encode import split_of

    path = str(tmp_path / "recs")
    ids = [f"d{i}" for i in range(6)]
    assert all(split_of(i, 0.02, 0) == "train" for i in ids)  # the hash routes none to validation
    write_records([make_record(f"text number {i}", source="t", id=i) for i in ids], path, format="jsonl")
    with caplog.at_level(logging.WARNING, logger="schooner.tokenize"):
        summary = build_cache(path, str(tmp_path / "out"), tokenizer_path, validation_fraction=0.02)
    assert summary["validation_documents"] == 0 and summary["train_documents"] == 6
    (warning,) = [r.getMessage() for r in caplog.records if "split is empty" in r.getMessage()]
    assert (
        "the validation split is empty: 0 of 6 documents" in warning and "validation_fraction=0.02" in warning
    )
    assert summary["warnings"] == [warning]


def test_a_tokenizer_with_other_bos_or_eos_ids_is_refused(records_dir, tokenizer_path, tmp_path) -> None:
    """Same tokenizer.json, another EOS (or BOS) named in tokenizer_config.json: the cache's documents end
    with the old EOS, so reading it as if they ended with the new one is refused, naming both ids."""
    path, _ = records_dir
    out = str(tmp_path / "c")
    build_cache(path, out, tokenizer_path, validation_fraction=0.0)
    same = load_tokenizer(tokenizer_path)
    TokenCache.open(out, tokenizer=same)  # the tokenizer it was built with
    other_eos = load_tokenizer(tokenizer_path, eos_token="<|end_of_turn|>")
    assert other_eos.fingerprint == same.fingerprint
    eos, new = same.eos_id, other_eos.eos_id
    with pytest.raises(TokenizerMismatchError, match=rf"'{out}/train'.*eos_id={eos}.*eos_id={new}"):
        TokenCache.open(out, tokenizer=other_eos)
    other_bos = load_tokenizer(tokenizer_path, bos_token="<|system|>")
    with pytest.raises(TokenizerMismatchError, match=rf"bos_id={same.bos_id}.*bos_id={other_bos.bos_id}"):
        TokenCache.open(out, tokenizer=other_bos)
    # a fingerprint string says nothing of the special tokens: accepted as before
    TokenCache.open(out, tokenizer=same.fingerprint)
    # a manifest written before the special ids were checked, without them: accepted
    mpath = Path(out, "train", "manifest.json")
    m = json.loads(mpath.read_text())
    del m["bos_id"], m["eos_id"]
    mpath.write_text(json.dumps(m))
    TokenCache.open(out, tokenizer=other_eos)


def test_build_into_the_same_folder_with_another_eos_is_rebuilt(
    records_dir, tokenizer_path, tmp_path
) -> None:
    path, _ = records_dir
    out = str(tmp_path / "c")
    build_cache(path, out, tokenizer_path, validation_fraction=0.0)
    other = load_tokenizer(tokenizer_path, eos_token="<|end_of_turn|>")
    build_cache(path, out, other, validation_fraction=0.0)
    cache = TokenCache.open(out, tokenizer=other)
    assert cache.eos_id == other.eos_id
    assert all(cache.document(i)[-1] == other.eos_id for i in range(cache.num_documents))
    # mixed with a cache of the same tokenizer.json and the old EOS: refused, naming both
    old, tok = str(tmp_path / "old"), load_tokenizer(tokenizer_path)
    build_cache(path, old, tokenizer_path, validation_fraction=0.0)
    with pytest.raises(
        MixtureError, match=rf"'{old}/train'.*eos_id={tok.eos_id} but component .* eos_id={other.eos_id}"
    ):
        MixtureDataset({out: 1.0, old: 1.0}, seq_len=32, seed=0)


def test_a_text_cache_records_each_documents_utf8_bytes(
    tokenizer: Tokenizer, tokenizer_path, tmp_path
) -> None:
    """Bits per byte needs the bytes of the text: summing the tokenizer's per-token byte lengths counts 0 for
    an `<unk>` (a SentencePiece-style tokenizer gave 1 byte for a 33-byte Japanese sentence). A text cache
    stores the UTF-8 byte count of every document's text (long documents encoded in pieces included)."""
    texts = ["héllo wörld " * 3, "日本語のテキストです。", "def f():\n    return 1\n" * 400, "x"]
    src = str(tmp_path / "recs")
    write_records([make_record(t, source="s") for t in texts], src, format="jsonl", num_shards=2)
    out = str(tmp_path / "cache")
    build_cache(src, out, tokenizer_path, validation_fraction=0.5, split_seed=1, piece_chars=1024)
    by_split = {"train": [], "validation": []}
    for rec in read_records_in_order(src):
        by_split[split_of(rec["id"], 0.5, 1)].append(len(rec["text"].encode("utf-8")))
    assert by_split["train"] and by_split["validation"]
    for split, want in by_split.items():
        cache = TokenCache.open(f"{out}/{split}")
        assert cache.has_document_bytes
        assert cache.document_bytes().tolist() == want
        assert cache.manifest["text_bytes"] == sum(want)
        assert cache.document_bytes(1, 2).tolist() == want[1:2]
        cache.verify()
    mem = write_cache(str(tmp_path / "mem"), [[1, 2], [3]], tokenizer, document_bytes=[5, 7])
    assert mem.document_bytes().tolist() == [5, 7]
    bare = write_cache(str(tmp_path / "bare"), [[1, 2]], tokenizer)
    assert not bare.has_document_bytes
    with pytest.raises(CacheError, match="no per-document byte counts"):
        bare.document_bytes()
    with pytest.raises(ValueError, match="document_bytes holds 1 entries for 2 documents"):
        write_cache(str(tmp_path / "bad"), [[1], [2]], tokenizer, document_bytes=[3])


def read_records_in_order(path: str) -> list[dict]:
    from schooner.data import read_shards

    return list(read_shards(path))
