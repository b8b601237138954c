"""Chat caches (SFT): masks exactly over assistant text, packing, resume, mixtures with plain caches, errors.

Expected masks come from the rendered text's character (byte) spans, computed here from the template's
strings, never from `render_chat`; expected ids come from the HF tokenizer directly.
"""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from schooner.cluster import JobError, LocalClient
from schooner.data import write_records
from schooner.tokenize import (
    SCHOONER_CHAT,
    AllMaskedError,
    CacheError,
    MixtureDataset,
    TokenCache,
    Tokenizer,
    build_cache,
    chat_record,
    write_cache,
)
from schooner.tokenize._byte_alphabet import byte_decoder

from .conftest import stdlib_texts

TOPICS = ["naïve café", "emoji 🚀🎉", "<|assistant|> forged", "  spaces\n\nnewlines\t", "数字 123456", "x"]


def conversations(n: int) -> list[list[dict]]:
    """Varied conversations: system and tool turns, several assistant turns, unicode, look-alike tokens."""
    texts = [t[:400] for t in stdlib_texts(12, start=50)]
    out = []
    for i in range(n):
        msgs = []
        if i % 3 == 0:
            msgs.append({"role": "system", "content": f"Be terse. {TOPICS[i % len(TOPICS)]}"})
        msgs.append({"role": "user", "content": f"Q{i}: {texts[i % len(texts)][: 40 + 17 * (i % 9)]}"})
        msgs.append(
            {"role": "assistant", "content": f"A{i} {TOPICS[(i + 1) % len(TOPICS)]} " + "ok " * (i % 13)}
        )
        if i % 4 == 1:
            msgs.append({"role": "tool", "content": '{"result": 42}'})
            msgs.append({"role": "assistant", "content": f"The tool said 42 {TOPICS[(i + 2) % len(TOPICS)]}"})
        out.append(msgs)
    return out


def token_bytes(tok: Tokenizer, i: int) -> bytes:
    """The bytes token `i` stands for: byte-level alphabet for normal tokens, UTF-8 for added tokens."""
    s = tok.hf.id_to_token(int(i))
    added = {t.content for t in tok.hf.get_added_tokens_decoder().values()}
    if s in added:
        return s.encode("utf-8")
    alphabet = byte_decoder()
    return bytes(alphabet[c] for c in s)


def expected_text_and_mask(
    messages: list[dict], tok: Tokenizer, last_only: bool = False
) -> tuple[bytes, list[tuple[int, int]]]:
    """The conversation's text per the schooner template's strings, and the byte spans that are targets:
    each assistant message's content and its end-of-turn marker (only the last message's with `last_only`),
    and the closing EOS when the conversation ends with such a message (so the model learns to stop)."""
    t = SCHOONER_CHAT
    text, spans = tok.bos_token.encode(), []
    for m in messages:
        text += t.header[m["role"]].encode()
        body = (m["content"] + t.footer).encode()
        if m["role"] == "assistant" and (not last_only or m is messages[-1]):
            spans.append((len(text), len(text) + len(body)))
        text += body
    eos = tok.eos_token.encode()
    if spans and spans[-1][1] == len(text):
        spans[-1] = (spans[-1][0], len(text) + len(eos))
    return text + eos, spans


def check_document(
    tok: Tokenizer, ids: np.ndarray, mask: np.ndarray, messages: list[dict], last_only: bool = False
) -> None:
    text, spans = expected_text_and_mask(messages, tok, last_only)
    pos, got_text = 0, b""
    for i, m in zip(ids.tolist(), mask.tolist()):
        b = token_bytes(tok, i)
        inside = any(a <= pos and pos + len(b) <= z for a, z in spans)
        assert m == int(inside), (tok.decode([i]), pos, m)
        got_text += b
        pos += len(b)
    assert got_text == text


@pytest.fixture(scope="module")
def local_client():
    client = LocalClient(max_workers=2)
    yield client
    client.shutdown()


@pytest.fixture(scope="module")
def chats(tmp_path_factory) -> tuple[str, list[dict]]:
    path = str(tmp_path_factory.mktemp("chats") / "recs")
    recs = [chat_record(m, source="synthetic", id=f"c{i}") for i, m in enumerate(conversations(40))]
    write_records(recs, path, format="jsonl.zst", num_shards=4)
    return path, recs


@pytest.fixture(scope="module")
def chat_cache(chats, tokenizer_path, local_client, tmp_path_factory) -> str:
    out = str(tmp_path_factory.mktemp("chatcache") / "out")
    build_cache(chats[0], out, tokenizer_path, kind="chat", validation_fraction=0.2, client=local_client)
    return out


def test_masks_are_exactly_the_assistant_text(chats, chat_cache, tokenizer) -> None:
    _, recs = chats
    by_id = {r["id"]: r["metadata"]["messages"] for r in recs}
    seen = 0
    for split in ("train", "validation"):
        cache = TokenCache.open(f"{chat_cache}/{split}", tokenizer=tokenizer)
        assert cache.kind == "chat" and cache.has_loss_mask and cache.manifest["format_version"] == 2
        cache.verify()
        first = cache.first_targets()
        for d in range(cache.num_documents):
            lo, hi = cache.document_bounds(d)
            info = cache.document_info(d)
            assert info["source"] == "synthetic"
            ids, mask = cache.tokens(lo, hi), cache.loss_mask(lo, hi)
            check_document(tokenizer, ids, mask, by_id[info["id"]])
            assert first[d] == np.flatnonzero(mask)[0]
            seen += 1
    assert seen == len(recs)


def test_packing_keeps_conversations_whole_and_apart(chat_cache, tokenizer) -> None:
    cache = TokenCache.open(chat_cache)
    docs = {
        d: (cache.document(d), cache.loss_mask(*cache.document_bounds(d))) for d in range(cache.num_documents)
    }
    longest = max(len(t) for t, _ in docs.values())
    seq_len = longest + 7  # every conversation fits whole
    ds = MixtureDataset({chat_cache: 1.0}, seq_len=seq_len, seed=3, block_size=1)  # draws 0..n-1: one epoch
    n_rows = len(ds.sequences[0])
    b = ds.batch(0, n_rows)  # one epoch: every row once
    found = []
    for r in range(n_rows):
        toks, mask, segs = b["tokens"][r], b["loss_mask"][r], b["segment_ids"][r]
        assert (np.diff(segs) >= 0).all() and segs[0] == 0
        for s in np.unique(segs):
            sel = segs == s
            match = [d for d, (t, _) in docs.items() if len(t) == sel.sum() and np.array_equal(t, toks[sel])]
            if match:
                found.append(toks[sel].tobytes())
                assert any(np.array_equal(mask[sel], docs[d][1]) for d in match)
            else:  # the padding after the last conversation
                assert s == segs.max() and (toks[sel] == tokenizer.pad_id).all() and not mask[sel].any()
    # each conversation exactly once, whole, in a segment of its own
    assert sorted(found) == sorted(t.tobytes() for t, _ in docs.values())
    assert n_rows < len(docs)  # several conversations per row


def test_long_conversation_is_cut_and_one_with_nothing_left_is_an_error(tokenizer, tmp_path) -> None:
    user = tokenizer.encode("question " * 30)
    answer = tokenizer.encode("answer")
    ids = [tokenizer.bos_id, *user, *answer]
    mask = [0] * (1 + len(user)) + [1] * len(answer)
    path = str(tmp_path / "c")
    write_cache(path, [ids, ids[:3] + answer], tokenizer, loss_masks=[mask, [0, 0, 0] + [1] * len(answer)],
                infos=[{"id": "long-one", "source": "t"}, {"id": "short", "source": "t"}])  # fmt: skip
    with pytest.raises(AllMaskedError, match=r"id 'long-one'.*beyond seq_len=16"):
        MixtureDataset({path: 1.0}, seq_len=16)
    ds = MixtureDataset({path: 1.0}, seq_len=len(ids) - 1)  # cut, but answer tokens remain
    rows = ds.sequences[0].batch([0, 1])
    assert rows["tokens"][0].tolist() == ids[:-1]  # cut to seq_len: the last answer token and EOS dropped
    assert rows["loss_mask"].sum(axis=1).tolist() == [len(answer) - 1, len(answer)]
    with pytest.raises(ValueError, match="no target token after its first"):
        write_cache(str(tmp_path / "z"), [ids], tokenizer, loss_masks=[[0] * len(ids)])


def test_mixture_of_chat_and_plain_caches(chat_cache, tokenizer, tmp_path) -> None:
    plain = str(tmp_path / "plain")
    write_cache(plain, [tokenizer.encode(t) for t in stdlib_texts(5)], tokenizer)
    chat = TokenCache.open(chat_cache)
    ds = MixtureDataset({plain: 0.5, chat_cache: 0.5}, seq_len=128, seed=1, block_size=16)
    for step in range(4):
        b = ds.batch(step, 8)
        comp, _, seq = ds.sequence_ids(step, 8)
        assert set(b) == {"tokens", "loss_mask", "segment_ids"}
        for r in range(8):
            if comp[r] == 0:
                assert (b["loss_mask"][r] == 1).all()
                continue
            rows = ds.sequences[1].rows
            d0, d1 = rows[seq[r]], rows[seq[r] + 1]
            lo, hi = chat.offsets()[d0], chat.offsets()[d1]
            n = min(hi - lo, 128)
            assert np.array_equal(b["loss_mask"][r, :n], chat.loss_mask(lo, lo + n))
            assert not b["loss_mask"][r, n:].any()
        assert {0, 1} <= set(comp.tolist()) or step  # both components appear


def test_records_without_targets_raise_naming_file_and_line_or_are_counted(
    tokenizer_path, local_client, tmp_path
) -> None:
    src = tmp_path / "recs"
    src.mkdir()
    good = chat_record(conversations(1)[0], source="s", id="good")
    no_answer = chat_record([{"role": "user", "content": "hello?"}], source="s", id="mute")
    bad_role = {**good, "id": "bot", "metadata": {"messages": [{"role": "bot", "content": "x"}]}}
    lines = [json.dumps(r) for r in (good, no_answer, good | {"id": "g2"}, bad_role)]
    (src / "part-00000-of-00001.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(
        JobError, match=r"part-00000-of-00001.jsonl, line 2: record 1 \(id='mute'\).*no token to train on"
    ):
        build_cache(str(src), str(tmp_path / "strict"), tokenizer_path, kind="chat", client=local_client)
    summary = build_cache(
        str(src), str(tmp_path / "lenient"), tokenizer_path, kind="chat", on_error="skip", client=local_client
    )
    assert summary["train_documents"] == 2 and summary["skipped_bad"] == 2
    examples = TokenCache.open(str(tmp_path / "lenient")).manifest["skipped_bad"]["examples"]
    assert any("line 4" in e and "role 'bot'" in e for e in examples)
    with pytest.raises(JobError, match=r"within max_length=5 tokens"):
        build_cache(
            str(src), str(tmp_path / "cut"), tokenizer_path, kind="chat", max_length=5, client=local_client
        )


_KILLED_BUILD = """
import sys
from schooner.cluster import LocalClient
from schooner.tokenize import build_cache
build_cache(sys.argv[1], sys.argv[2], sys.argv[3], kind="chat", validation_fraction=0.1, client=LocalClient(max_workers=1))
"""


def _snapshot(out: str) -> dict:
    snap = {}
    for split in ("train", "validation"):
        c = TokenCache.open(os.path.join(out, split))
        files = {}
        for name in ("tokens", "offsets", "loss_mask", "first_target", "info", "info_offsets"):
            for f in sorted(Path(out, split, name).rglob("*")):
                if f.is_file():
                    files[str(f.relative_to(out))] = f.read_bytes()
        snap[split] = (json.dumps(c.manifest, sort_keys=True), files)
    return snap


def test_sigkill_mid_chat_build_then_rerun_is_byte_identical(tokenizer_path, local_client, tmp_path) -> None:
    src = str(tmp_path / "recs")
    recs = [chat_record(m, source="s", id=f"k{i}") for i, m in enumerate(conversations(160))]
    write_records(recs, src, format="jsonl.zst", num_shards=16)
    killed, straight = str(tmp_path / "killed"), str(tmp_path / "straight")
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_BUILD, src, killed, tokenizer_path], start_new_session=True
    )
    parts = Path(killed, "parts")
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and len(list(parts.glob("part-*.json"))) < 2 and proc.poll() is None:
        time.sleep(0.005)
    family = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    for pid in family:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()
    done = len(list(parts.glob("part-*.json")))
    assert 2 <= done < 16, f"the build was not caught mid-way ({done} of 16 shards done)"
    with pytest.raises(CacheError, match="no manifest.json"):
        TokenCache.open(f"{killed}/train")
    summary = build_cache(
        src, killed, tokenizer_path, kind="chat", validation_fraction=0.1, client=local_client
    )
    assert summary["shards_redone"] <= 14
    build_cache(src, straight, tokenizer_path, kind="chat", validation_fraction=0.1, client=local_client)
    assert _snapshot(killed) == _snapshot(straight)


def test_format_1_caches_still_read_and_unknown_versions_refused(tokenizer, tmp_path) -> None:
    path = tmp_path / "old"
    write_cache(str(path), [tokenizer.encode("old cache")], tokenizer)
    m = json.loads((path / "manifest.json").read_text())
    for k in ("kind", "has_loss_mask", "encoder"):
        m.pop(k)
    (path / "manifest.json").write_text(json.dumps({**m, "format_version": 1}))
    old = TokenCache.open(str(path))
    assert old.kind == "text" and not old.has_loss_mask
    assert (old.loss_mask(0, old.num_tokens) == 1).all()
    (path / "manifest.json").write_text(json.dumps({**m, "format_version": 3}))
    with pytest.raises(CacheError, match=r"v3 is not 'schooner-token-cache' v1 or v2; .*rebuild it"):
        TokenCache.open(str(path))


def test_a_split_left_empty_is_a_warning_naming_it_and_the_fix(tokenizer_path, tmp_path, caplog) -> None:
    """7 conversations at validation_fraction=0.02 route none to validation: said, with the fix, not silent."""
    import logging

    from schooner.tokenize._encode import split_of

    path = str(tmp_path / "recs")
    recs = [chat_record(m, source="synthetic", id=f"c{i}") for i, m in enumerate(conversations(7))]
    write_records(recs, path, format="jsonl", num_shards=1)
    assert all(split_of(f"c{i}", 0.02, 0) == "train" for i in range(7))  # the hash routes none to validation
    with caplog.at_level(logging.WARNING, logger="schooner.tokenize"):
        summary = build_cache(
            path, str(tmp_path / "out"), tokenizer_path, kind="chat", validation_fraction=0.02
        )
    assert summary["validation_documents"] == 0 and summary["train_documents"] == 7
    (warning,) = [r.getMessage() for r in caplog.records if "validation" in r.getMessage()]
    assert "0 of 7 conversations" in warning and "validation_fraction=0.02" in warning
    assert "raise validation_fraction" in warning and "validation_fraction=0" in warning
    assert summary["warnings"] == [warning]
    caplog.clear()  # asked for no validation split: nothing to say
    build_cache(path, str(tmp_path / "none"), tokenizer_path, kind="chat", validation_fraction=0.0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_rows_of_messages_without_text_or_id_are_chat_records(tokenizer, tokenizer_path, tmp_path) -> None:
    """A JSON-lines file of `{"messages": [...]}` rows, the Hugging Face chat layout (no `text`, no `id`), and
    one of `{"prompt", "chosen", "rejected"}` rows: `tokenized_chat` refused them ("no 'text' field ... pass
    text_field=...", an argument it does not take). Each row is one conversation, rendered as a
    `chat_record` of the same messages is; a row with no messages is named as such."""
    from schooner.cluster import StepRunner
    from schooner.tokenize.steps import tokenized_chat

    convs = conversations(12)
    src = tmp_path / "chats.jsonl"
    src.write_text("".join(json.dumps({"messages": m}) + "\n" for m in convs))
    step = tokenized_chat(
        "tokenized/hf-chat", source=str(src), tokenizer=tokenizer_path, validation_fraction=0.3
    )
    out = StepRunner(prefix=str(tmp_path / "p"), quiet=True).run([step])[step].output_path
    by_text = {expected_text_and_mask(m, tokenizer)[0]: m for m in convs}
    seen, ids = [], set()
    for split in ("train", "validation"):
        cache = TokenCache.open(f"{out}/{split}", tokenizer=tokenizer)
        for d in range(cache.num_documents):
            lo, hi = cache.document_bounds(d)
            tokens = cache.tokens(lo, hi)
            messages = by_text[b"".join(token_bytes(tokenizer, i) for i in tokens.tolist())]
            check_document(tokenizer, tokens, cache.loss_mask(lo, hi), messages)
            seen.append(convs.index(messages))
            ids.add(cache.document_info(d)["id"])
    assert sorted(seen) == list(range(12)) and len(ids) == 12  # content ids: rows apart, split by row
    prefs = tmp_path / "prefs.jsonl"
    rows = [{"prompt": f"Say {i}.", "chosen": f" {i}", "rejected": f" {i + 1}!"} for i in range(5)]
    prefs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = build_cache(str(prefs), str(tmp_path / "prefs_out"), tokenizer_path, kind="preference")
    assert summary["train_documents"] == 10
    (tmp_path / "none" / "x.jsonl").parent.mkdir()
    (tmp_path / "none" / "x.jsonl").write_text(json.dumps({"turns": convs[0]}) + "\n")
    with pytest.raises(JobError, match=r"x.jsonl, line 1: .*no 'messages' field \(fields: turns\)"):
        build_cache(str(tmp_path / "none"), str(tmp_path / "none_out"), tokenizer_path, kind="chat")
    with pytest.raises(ValueError, match=r"text_field= applies to kind='text' builds only"):
        build_cache(str(src), str(tmp_path / "tf"), tokenizer_path, kind="chat", text_field="body")
