"""Tokenizing one input shard into a part of a token cache (the task `build_cache` runs per shard).

Memory stays bounded whatever the documents: records are encoded in batches of about `batch_chars`
characters, documents longer than `piece_chars` are encoded in pieces cut where the tokens are exactly
those of the whole document (`_split_text`), ids go straight into numpy arrays of the cache's dtype, and
the part's tokens are streamed to disk a few MiB at a time.

A part is `parts/part-NNNNN-<attempt>/{train,validation}.{tokens,offsets,bytes}` (raw little-endian
arrays: the tokens in the cache's dtype, int64 document lengths, and for text builds the int64 UTF-8 byte
count of each document's text) plus `parts/part-NNNNN.json`, the ledger entry,
written last: it marks the part finished and names the attempt's folder.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from schooner.cluster import storage

from ._split_text import split_for_encoding
from ._tokenizer import Tokenizer, load_tokenizer

logger = logging.getLogger("schooner.tokenize")

SPLITS = ("train", "validation")
_TOKENIZERS: dict[tuple[str, str, str | None], Tokenizer] = {}
_WRITE_BYTES = 4 << 20


def split_of(doc_key: str, validation_fraction: float, split_seed: int) -> str:
    """`"validation"` for a deterministic `validation_fraction` of document keys, else `"train"`.

    The rule hashes the record id (with the seed), so a document's split does not depend on shard order,
    on the other documents or on which worker tokenized it.
    """
    if validation_fraction <= 0.0:
        return "train"
    h = hashlib.blake2b(f"{split_seed}:{doc_key}".encode(), digest_size=8).digest()
    return "validation" if int.from_bytes(h, "little") < validation_fraction * 2.0**64 else "train"


def _tokenizer_for(path: str, fingerprint: str, encoder: str | None = None) -> Tokenizer:
    # Keyed by content too: a warm worker may see the same output folder rebuilt with another tokenizer.
    tok = _TOKENIZERS.get((path, fingerprint, encoder))
    if tok is None:
        tok = load_tokenizer(path, encoder=encoder)
        if tok.fingerprint != fingerprint:
            raise ValueError(
                f"{path}: tokenizer fingerprint {tok.fingerprint[:12]} is not the build's {fingerprint[:12]}; "
                "another build wrote into the same output folder"
            )
        if encoder == "tiktoken":  # the build checked this very JSON (same fingerprint) for the fast path
            tok._use_checked_fast_path()
        _TOKENIZERS[(path, fingerprint, encoder)] = tok
    return tok


class _PartWriter:
    """One split of a part: tokens streamed to a raw file, document lengths, sha256 and largest id; with
    `masks`, the loss mask streamed beside them, each document's first target and its info (JSON)."""

    def __init__(self, folder: str, split: str, dtype: str, masks: bool = False) -> None:
        self.dtype = np.dtype(dtype).newbyteorder("<")
        self._cms = {"tokens": storage.atomic_open(storage.join(folder, f"{split}.tokens"))}
        if masks:
            self._cms["mask"] = storage.atomic_open(storage.join(folder, f"{split}.mask"))
            self._cms["info"] = storage.atomic_open(storage.join(folder, f"{split}.info"))
        self._f = {k: cm.__enter__() for k, cm in self._cms.items()}
        self.folder, self.split, self.masks = folder, split, masks
        self.lengths: list[int] = []
        self.text_bytes: list[int] = []  # text builds (no masks): each document's UTF-8 bytes
        self.first_targets: list[int] = []
        self.info_lengths: list[int] = []
        self.sha = hashlib.sha256()
        self.mask_sha = hashlib.sha256()
        self.max_id = -1
        self.tokens = 0
        self.targets = 0
        self._buf: list[np.ndarray] = []
        self._mask_buf: list[np.ndarray] = []
        self._buffered = 0

    def add(self, pieces: list[np.ndarray], mask: np.ndarray | None = None, info: dict | None = None) -> None:
        n = 0
        for a in pieces:
            if a.size:
                self._buf.append(a)
                self._buffered += a.nbytes
                n += a.size
                self.max_id = max(self.max_id, int(a.max()))
        self.lengths.append(n)
        if self.masks:
            assert mask is not None and mask.size == n and info is not None
            self._mask_buf.append(mask.astype(np.uint8, copy=False))
            self.first_targets.append(int(np.argmax(mask[1:])) + 1)  # position 0 is predicted by nothing
            self.targets += int(mask.sum())
            line = json.dumps(info, ensure_ascii=False, sort_keys=True).encode("utf-8")
            self._f["info"].write(line)
            self.info_lengths.append(len(line))
        if self._buffered >= _WRITE_BYTES:
            self._flush()

    def add_batch(self, tokens: np.ndarray, lengths: list[int], text_bytes: list[int]) -> None:
        """Whole documents (concatenated, in the part's dtype), their lengths and the UTF-8 bytes of their
        texts, in one write."""
        self.text_bytes.extend(text_bytes)
        self._flush()
        if tokens.size:
            # `.data`: the arrays' memory as a memoryview (what write/update read through the buffer
            # protocol anyway); numpy's stubs declare ndarray a Buffer only for Python >= 3.12.
            self._f["tokens"].write(tokens.view(np.uint8).data)
            self.sha.update(tokens.astype("<i4", copy=False).view(np.uint8).data)
            self.tokens += tokens.size
            self.max_id = max(self.max_id, int(tokens.max()))
        self.lengths.extend(lengths)

    def _flush(self) -> None:
        if self._buf:
            data = np.concatenate(self._buf).astype(self.dtype, copy=False)
            self._f["tokens"].write(data.tobytes())
            self.sha.update(data.astype("<i4").tobytes())
            self.tokens += data.size
            self._buf, self._buffered = [], 0
        if self._mask_buf:
            m = np.concatenate(self._mask_buf).tobytes()
            self._f["mask"].write(m)
            self.mask_sha.update(m)
            self._mask_buf = []

    def close(self) -> dict:
        self._flush()
        for cm in self._cms.values():
            cm.__exit__(None, None, None)
        arrays = {"offsets": self.lengths}
        if not self.masks:  # text: the bytes of every document's text (bits per byte)
            arrays["bytes"] = self.text_bytes
        if self.masks:
            arrays |= {"first_target": self.first_targets, "info_lengths": self.info_lengths}
        for name, values in arrays.items():
            storage.write_bytes(storage.join(self.folder, f"{self.split}.{name}"),
                                np.asarray(values, dtype="<i8").tobytes())  # fmt: skip
        out = {"documents": len(self.lengths), "tokens": self.tokens, "max_token_id": self.max_id,
               "sha256": self.sha.hexdigest()}  # fmt: skip
        if not self.masks:
            out["text_bytes"] = sum(self.text_bytes)
        if self.masks:
            out |= {"mask_sha256": self.mask_sha.hexdigest(), "target_tokens": self.targets,
                    "info_bytes": sum(self.info_lengths)}  # fmt: skip
        return out

    def abort(self, exc: BaseException) -> None:
        for cm in self._cms.values():
            cm.__exit__(type(exc), exc, exc.__traceback__)


def _records(task: dict, skips: Any) -> Iterator[tuple[str, str]]:
    """(key, text) of a shard's records; the key is the record id, else `shard:index` when it has none.

    Bad records raise (naming file and line), or with `on_error="skip"` are counted in `skips`.
    """
    from schooner.data import DataError, read_records

    name = os.path.basename(task["shard"])
    records = read_records(
        task["shard"], text_field=task["text_field"], on_error=task["on_error"], skips=skips
    )
    for i, rec in enumerate(records):
        text = rec.get("text")
        if not isinstance(text, str):
            err = DataError(
                task["shard"],
                f"record {i} (id={rec.get('id')!r}) has text of type {type(text).__name__}, not str",
                row=i,
                fix=f"fix the record or choose another text_field (now {task['text_field']!r})",
            )
            if task["on_error"] != "skip":
                raise err
            skips.add(err)
            continue
        yield str(rec.get("id") or f"{name}:{i}"), text


def _batches(
    docs: Iterator[tuple[str, str]],
    tok: Tokenizer,
    batch_chars: int,
    piece_chars: int,
    stats: dict,
    where: str,
) -> Iterator[list[tuple[str, int, str]]]:
    """Batches of (key, piece count, piece text) of about `batch_chars` characters; a long document
    contributes its pieces in order, the first carrying the document's piece count."""
    batch: list[tuple[str, int, str]] = []
    size = 0
    for key, text in docs:
        if not text:
            stats["skipped_empty"] += 1
            continue
        if len(text) > piece_chars:
            pieces, complete = split_for_encoding(tok.encode, text, piece_chars)
            stats["long_documents"] += 1
            if not complete:
                stats["long_documents_uncut"] += 1
                logger.warning("%s: document %s (%d characters) has no exact cut for this tokenizer past "
                               "character %d; encoding the rest whole", where, key, len(text),
                               len(text) - len(pieces[-1]))  # fmt: skip
        else:
            pieces = [text]
        for j, piece in enumerate(pieces):
            batch.append((key, len(pieces) if j == 0 else 0, piece))
            size += len(piece)
            if size >= batch_chars:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


@contextlib.contextmanager
def serial_tokenizers() -> Iterator[None]:
    """`tokenizers` encodes batches on a thread per core by default. A shard task holds one CPU and
    parallelism comes from running shards side by side, so here it encodes on this thread: no threads
    competing with the other tasks for cores, none spinning between batches (measured: the same tokens
    for about 15% fewer CPU-seconds). The variable is only written when it is not already "false": shard
    tasks running on threads of one process (set once by `build_cache`) never write the environment while
    another thread's encoder may read it."""
    key = "TOKENIZERS_PARALLELISM"
    before = os.environ.get(key)
    if before == "false":
        yield
        return
    os.environ[key] = "false"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = before


def encode_shard(task: dict, tok: Tokenizer | None = None) -> dict:
    """Tokenize one input shard into `parts/part-NNNNN-<attempt>/`; return its ledger entry. Idempotent.

    `tok`: the build's own tokenizer, when the task runs in the process that planned the build (else the
    task loads the copy the build saved, and checks its fingerprint)."""
    if tok is None:
        tok = _tokenizer_for(task["tokenizer"], task["fingerprint"], task.get("encoder"))
    with serial_tokenizers():
        if task.get("kind", "text") == "text":
            return _encode_shard(task, tok)
        return _encode_documents_shard(task, tok)


def _where(task: dict, i: int, reader_skips: int) -> dict:
    """Location of record `i` of a shard for a `DataError`: its line in a JSON-lines file while the reader
    has skipped no line, else its record index."""
    jsonl = ".jsonl" in os.path.basename(task["shard"]) or ".ndjson" in os.path.basename(task["shard"])
    return {"line": i + 1} if jsonl and reader_skips == 0 else {"row": i}


def _encode_documents_shard(task: dict, tok: Tokenizer) -> dict:
    """A shard of chat or preference records: each record becomes one document (chat) or two (chosen then
    rejected), with its loss mask and info; bad records raise naming file and line, or are counted."""
    from schooner.data import DataError, SkipLog, read_records

    from ._documents import BadDocument, chat_documents, preference_documents

    dtype = np.dtype(task["dtype"])
    folder_name = f"part-{task['index']:05d}-{storage.unique_tag()}"
    folder = storage.join(task["output"], "parts", folder_name)
    writers = {s: _PartWriter(folder, s, task["dtype"], masks=True) for s in SPLITS}
    skips = SkipLog()
    name = os.path.basename(task["shard"])
    own = 0  # records skipped here (not by the reader)
    try:
        # chat and preference rows need no text (a file of `{"messages": [...]}` rows is a chat file)
        records = read_records(task["shard"], text_field=None, on_error=task["on_error"], skips=skips)
        for i, rec in enumerate(records):
            try:
                if task["kind"] == "chat":
                    docs = chat_documents(rec, tok, task["template"], task["max_length"])
                else:
                    docs = preference_documents(
                        rec, tok, task["template"], task["max_length"], task["prepend_bos"]
                    )
            except BadDocument as e:
                err = DataError(
                    task["shard"],
                    f"record {i} (id={rec.get('id')!r}): {e}",
                    **_where(task, i, skips.to_dict()["skipped"] - own),
                )
                if task["on_error"] != "skip":
                    raise err from None
                skips.add(err)
                own += 1
                continue
            split = split_of(
                str(rec.get("id") or f"{name}:{i}"), task["validation_fraction"], task["split_seed"]
            )
            for d in docs:
                writers[split].add([d.ids.astype(dtype)], d.mask, d.info)
        ledger_splits = {s: w.close() for s, w in writers.items()}
    except BaseException as e:
        for w in writers.values():
            w.abort(e)
        raise
    return _finish_ledger(task, tok, folder_name, ledger_splits, skips, {"skipped_empty": 0})


class _Documents:
    """Encoded pieces, a batch at a time, assembled into whole documents (BOS, ids, EOS) per split.

    A document's pieces may span batches: the unfinished one is kept (as views of its batches' arrays)
    until its last piece arrives. Nothing is copied per document but the final concatenation per split.
    """

    def __init__(self, task: dict, tok: Tokenizer, dtype: np.dtype) -> None:
        self.dtype = dtype
        self.vocab_size = tok.vocab_size
        self.eos = np.array([tok.eos_id], dtype=dtype)
        self.head = [np.array([tok.bos_id], dtype=dtype)] if task["prepend_bos"] else []
        self.fraction, self.seed, self.shard = task["validation_fraction"], task["split_seed"], task["shard"]
        self.key, self.left, self.nbytes = "", 0, 0
        self.pending: list[np.ndarray] = []  # the unfinished document's arrays

    def add(
        self, batch: list[tuple[str, int, str]], ids: list[np.ndarray]
    ) -> dict[str, tuple[np.ndarray, list[int], list[int]]]:
        """The documents this batch finishes: per split, their tokens (concatenated), lengths and the UTF-8
        bytes of their texts."""
        flat = np.concatenate(ids) if ids else np.zeros(0, self.dtype)
        top = int(flat.max()) if flat.size else -1
        if top >= self.vocab_size:  # a tokenizer bug or a corrupt JSON: never cast it into the dtype
            raise ValueError(f"{self.shard}: tokenizer produced id {top} >= vocab_size={self.vocab_size}")
        flat = flat.astype(self.dtype, copy=False)
        out: dict[str, tuple[list[np.ndarray], list[int], list[int]]] = {}
        start = 0
        for (key, count, piece), a in zip(batch, ids):
            if count:
                self.key, self.left, self.pending, self.nbytes = key, count, list(self.head), 0
            self.pending.append(flat[start : start + a.size])
            self.nbytes += len(piece.encode("utf-8"))
            start += a.size
            self.left -= 1
            if self.left == 0:
                self.pending.append(self.eos)
                split = split_of(self.key, self.fraction, self.seed)
                arrays, lengths, nbytes = out.setdefault(split, ([], [], []))
                arrays += self.pending
                lengths.append(sum(p.size for p in self.pending))
                nbytes.append(self.nbytes)
                self.pending = []
        return {s: (np.concatenate(a), n, b) for s, (a, n, b) in out.items()}


def _encode_shard(task: dict, tok: Tokenizer) -> dict:
    from schooner.data import SkipLog

    dtype = np.dtype(task["dtype"]).newbyteorder("<")
    # A fresh folder per attempt: an orphaned worker of a killed build finishing the same shard cannot
    # overwrite the files a rerun is writing; the ledger JSON (written last) names the folder to merge.
    folder_name = f"part-{task['index']:05d}-{storage.unique_tag()}"
    folder = storage.join(task["output"], "parts", folder_name)
    writers = {s: _PartWriter(folder, s, task["dtype"]) for s in SPLITS}
    stats = {"skipped_empty": 0, "long_documents": 0, "long_documents_uncut": 0}
    skips = SkipLog()
    documents = _Documents(task, tok, dtype)
    try:
        docs = _records(task, skips)
        for batch in _batches(docs, tok, task["batch_chars"], task["piece_chars"], stats, task["shard"]):
            ids = tok._encode_arrays([p for _, _, p in batch])
            for split, (tokens, lengths, nbytes) in documents.add(batch, ids).items():
                writers[split].add_batch(tokens, lengths, nbytes)
        ledger_splits = {s: w.close() for s, w in writers.items()}
    except BaseException as e:
        for w in writers.values():
            w.abort(e)
        raise
    return _finish_ledger(task, tok, folder_name, ledger_splits, skips, stats)


def _finish_ledger(
    task: dict, tok: Tokenizer, folder_name: str, ledger_splits: dict, skips: Any, stats: dict
) -> dict:
    """Check the part's ids, write its ledger entry (last: it marks the part finished) and return it."""
    for entry in ledger_splits.values():
        if entry["max_token_id"] >= tok.vocab_size:  # a tokenizer bug or a corrupt JSON; never write it
            raise ValueError(
                f"{task['shard']}: tokenizer produced id {entry['max_token_id']} >= vocab_size={tok.vocab_size}"
            )
    ledger: dict[str, Any] = {
        "index": task["index"],
        "folder": folder_name,
        "shard": task["shard"],
        "input": task["input"],
        "skipped_empty": stats["skipped_empty"],
        "long_documents": stats.get("long_documents", 0),
        "long_documents_uncut": stats.get("long_documents_uncut", 0),
        "skipped_bad": skips.to_dict(),
        "splits": ledger_splits,
    }
    storage.write_json(
        storage.join(task["output"], "parts", f"part-{task['index']:05d}.json"), ledger, indent=None
    )
    return ledger
