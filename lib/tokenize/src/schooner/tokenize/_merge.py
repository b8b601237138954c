"""Merging a build's parts, in shard order, into one split's token cache (tensorstore arrays + manifest).

Token ids and document offsets always; for text builds the UTF-8 bytes of each document's text; for chat
and preference builds the loss mask, each document's first target and its info (see `_cache`). The manifest is written last: a cache without one is
unfinished.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import numpy as np
import tensorstore as ts

from schooner.cluster import storage

from . import _arrays
from ._cache import FORMAT, FORMAT_VERSION, MANIFEST
from ._tokenizer import Tokenizer


class _AlignedWriter:
    """Appends 1-D arrays to a tensorstore array, writing whole stored chunks so none is rewritten."""

    def __init__(self, arr: ts.TensorStore, chunk: int, dtype: str) -> None:
        self.arr, self.chunk, self.dtype = arr, chunk, dtype
        self.pos = 0
        self.buf: list[np.ndarray] = []
        self.buffered = 0

    def append(self, x: np.ndarray) -> None:
        self.buf.append(x.astype(self.dtype, copy=False))
        self.buffered += x.size
        if self.buffered >= self.chunk:
            data = np.concatenate(self.buf)
            n = (data.size // self.chunk) * self.chunk
            _arrays.write_all(self.arr, data[:n], self.pos)
            self.pos += n
            self.buf = [data[n:]]
            self.buffered = data.size - n

    def close(self) -> None:
        if self.buffered:
            _arrays.write_all(self.arr, np.concatenate(self.buf), self.pos)
            self.pos += self.buffered
            self.buf, self.buffered = [], 0


def _read_part(path: str, dtype: str, chunk: int) -> Iterable[np.ndarray]:
    """A raw little-endian part file in arrays of at most `chunk` elements."""
    dt = np.dtype(dtype).newbyteorder("<")
    with storage.open_file(path, "rb") as f:
        while data := f.read(chunk * dt.itemsize):
            yield np.frombuffer(data, dtype=dt)


def _concat_lengths(writer: _AlignedWriter, path: str, base: int, chunk: int) -> int:
    """Append the running ends of a part's int64 lengths file to `writer`, starting at `base`."""
    end = base
    for lengths in _read_part(path, "int64", chunk):
        ends = np.cumsum(lengths, dtype=np.int64) + end
        writer.append(ends)
        end = int(ends[-1])
    return end


def merge_split(output: str, split: str, plan: dict, ledgers: list[dict], tok: Tokenizer) -> dict:
    """Concatenate the parts of one split into `output/split` and write its manifest last."""
    dest = storage.join(output, split)
    n_tok = sum(lg["splits"][split]["tokens"] for lg in ledgers)
    n_doc = sum(lg["splits"][split]["documents"] for lg in ledgers)
    kind = plan.get("kind", "text")
    masks = kind != "text"
    chunk = _arrays.WRITE_CHUNK

    def writer(name: str, n: int, dtype: str) -> _AlignedWriter:
        return _AlignedWriter(_arrays.create_array(storage.join(dest, name), n, dtype), chunk, dtype)

    tokens = writer("tokens", n_tok, plan["dtype"])
    offsets = writer("offsets", n_doc + 1, "int64")
    offsets.append(np.zeros(1, np.int64))
    # parts written before the byte counts existed (a build resumed across the upgrade) have none
    text_bytes = not masks and all("text_bytes" in lg["splits"][split] for lg in ledgers)
    if text_bytes:
        doc_bytes = writer("document_bytes", n_doc, "int64")
    if masks:
        n_info = sum(lg["splits"][split]["info_bytes"] for lg in ledgers)
        mask, first = writer("loss_mask", n_tok, "uint8"), writer("first_target", n_doc, "int64")
        info, info_off = writer("info", n_info, "uint8"), writer("info_offsets", n_doc + 1, "int64")
        info_off.append(np.zeros(1, np.int64))
        mask_sha, info_base, targets = hashlib.sha256(), 0, 0
    shards, doc_base = [], 0
    for lg in ledgers:
        s = lg["splits"][split]
        part = storage.join(output, "parts", lg["folder"])
        token_base = tokens.pos + tokens.buffered
        if s["documents"]:
            for piece in _read_part(storage.join(part, f"{split}.tokens"), plan["dtype"], chunk):
                tokens.append(piece)
            _concat_lengths(offsets, storage.join(part, f"{split}.offsets"), token_base, chunk)
            if text_bytes:
                for piece in _read_part(storage.join(part, f"{split}.bytes"), "int64", chunk):
                    doc_bytes.append(piece)
        if masks and s["documents"]:
            for piece in _read_part(storage.join(part, f"{split}.mask"), "uint8", chunk):
                mask.append(piece)
                mask_sha.update(piece.tobytes())
            for piece in _read_part(storage.join(part, f"{split}.first_target"), "int64", chunk):
                first.append(piece)
            for piece in _read_part(storage.join(part, f"{split}.info"), "uint8", chunk):
                info.append(piece)
            info_base = _concat_lengths(
                info_off, storage.join(part, f"{split}.info_lengths"), info_base, chunk
            )
            targets += s["target_tokens"]
        shards.append({
            "path": lg["shard"], "documents": s["documents"], "tokens": s["tokens"], "document_start": doc_base,
            "token_start": token_base, "sha256": s["sha256"], "skipped_empty": lg["skipped_empty"],
        })  # fmt: skip
        doc_base += s["documents"]
    for w in (tokens, offsets, *((mask, first, info, info_off) if masks else ())):
        w.close()
    if text_bytes:
        doc_bytes.close()
    train = split == "train"
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "has_loss_mask": masks,
        "split": split,
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_source": plan["tokenizer_source"],
        "encoder": plan.get("encoder"),
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "prepend_bos": plan["prepend_bos"],
        "dtype": plan["dtype"],
        "num_documents": n_doc,
        "num_tokens": n_tok,
        "max_token_id": max((lg["splits"][split]["max_token_id"] for lg in ledgers), default=-1),
        "skipped_empty": sum(lg["skipped_empty"] for lg in ledgers) if train else 0,
        "skipped_bad": _merged_skips(ledgers) if train else {"skipped": 0, "examples": []},
        "long_documents": sum(lg.get("long_documents", 0) for lg in ledgers) if train else 0,
        "long_documents_uncut": sum(lg.get("long_documents_uncut", 0) for lg in ledgers) if train else 0,
        "validation_fraction": plan["validation_fraction"],
        "split_rule": f"blake2b('{{split_seed}}:{{record id}}') < validation_fraction * 2**64, split_seed={plan['split_seed']}",
        "sources": plan["inputs"],
        "shards": shards,
        "content_sha256": hashlib.sha256("".join(s["sha256"] for s in shards).encode()).hexdigest(),
    }
    if text_bytes:
        manifest |= {"has_document_bytes": True,
                     "text_bytes": sum(lg["splits"][split]["text_bytes"] for lg in ledgers)}  # fmt: skip
    if masks:
        manifest |= {"chat_template": plan.get("template"), "max_length": plan.get("max_length"),
                     "target_tokens": targets, "loss_mask_sha256": mask_sha.hexdigest()}  # fmt: skip
    storage.write_json(storage.join(dest, MANIFEST), manifest, indent=2)
    return manifest


def _merged_skips(ledgers: list[dict]) -> dict:
    from schooner.data import SkipLog

    log = SkipLog()
    for lg in ledgers:
        log.merge(lg["skipped_bad"])
    return log.to_dict()
