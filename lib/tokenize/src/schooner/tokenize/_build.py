"""Build a token cache from record folders: one task per input shard, resumable at shard granularity.

Layout of a build folder (the `tokenized` step's output):

- `tokenizer.json` / `tokenizer_config.json`: the tokenizer the workers load (and provenance).
- `build.json`: the plan (tokenizer fingerprint, shards, split rule); `complete` once the caches exist.
- `parts/part-00003.json` + `parts/part-00003-<attempt>/{train,validation}/{tokens,offsets}`: one
  finished input shard. The JSON is written last, so it marks a part as complete (and names the
  attempt's folder); a killed build redoes only shards without one. After the merge the parts are deleted.
- `train/` and `validation/`: the two `TokenCache`s, merged from the parts in shard order.

The result depends only on the plan, never on which shards were redone or which client ran them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from itertools import chain
from typing import Any

import numpy as np

from . import _store
from ._cache import FORMAT, FORMAT_VERSION, MANIFEST, TokenCache
from ._tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer

logger = logging.getLogger(__name__)

SPLITS = ("train", "validation")
BUILD_FILE = "build.json"
_TOKENIZERS: dict[tuple[str, str], Tokenizer] = {}


def split_of(doc_key: str, validation_fraction: float, split_seed: int) -> str:
    """`"validation"` for a deterministic `validation_fraction` of document keys, else `"train"`.

    The rule hashes the record id (with the seed), so a document's split does not depend on shard order,
    on the other documents or on which worker tokenized it.
    """
    if validation_fraction <= 0.0:
        return "train"
    h = hashlib.blake2b(f"{split_seed}:{doc_key}".encode(), digest_size=8).digest()
    return "validation" if int.from_bytes(h, "little") < validation_fraction * 2.0**64 else "train"


def resolve_shards(inputs: Sequence[str]) -> list[str]:
    """The shard files of every input (record folders, files or globs), in input order."""
    from schooner.data import list_shards

    shards: list[str] = []
    for inp in inputs:
        try:
            shards.extend(list_shards(inp))
        except FileNotFoundError as e:
            raise FileNotFoundError(f"token cache input {inp!r}: {e}") from e
    return shards


def _shard_size(path: str) -> int:
    p = _store.local(path)
    return os.path.getsize(p) if os.path.exists(p) else -1


class _AlignedWriter:
    """Appends 1-D arrays to a tensorstore array, writing whole stored chunks so none is rewritten."""

    def __init__(self, arr, chunk: int, dtype: str) -> None:
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
            _store.write_all(self.arr, data[:n], self.pos)
            self.pos += n
            self.buf = [data[n:]]
            self.buffered = data.size - n

    def close(self) -> None:
        if self.buffered:
            _store.write_all(self.arr, np.concatenate(self.buf), self.pos)
            self.pos += self.buffered
            self.buf, self.buffered = [], 0


# -- the per-shard task (runs on a worker) ---------------------------------------------------------


def _tokenizer_for(path: str, fingerprint: str) -> Tokenizer:
    # Keyed by content too: a warm worker may see the same output folder rebuilt with another tokenizer.
    tok = _TOKENIZERS.get((path, fingerprint))
    if tok is None:
        tok = load_tokenizer(path)
        if tok.fingerprint != fingerprint:
            raise ValueError(
                f"{path}: tokenizer fingerprint {tok.fingerprint[:12]} is not the build's {fingerprint[:12]}; "
                "another build wrote into the same output folder"
            )
        _TOKENIZERS[(path, fingerprint)] = tok
    return tok


def _batches(task: dict, skips: Any) -> Iterator[list[tuple[str, str]]]:
    """(key, text) batches of a shard; the key is the record id, else `shard:line` when it has none.

    Bad records raise (naming file and line), or with `on_error="skip"` are counted in `skips`.
    """
    from schooner.data import DataError, read_records

    batch: list[tuple[str, str]] = []
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
        batch.append((str(rec.get("id") or f"{name}:{i}"), text))
        if len(batch) >= task["encode_batch_size"]:
            yield batch
            batch = []
    if batch:
        yield batch


def _frame(flat: np.ndarray, lens: np.ndarray, eos: int, bos: int | None, dtype: str) -> np.ndarray:
    """Concatenated documents `flat` (lengths `lens`) -> [BOS] doc EOS per document, vectorised."""
    extra = 1 + (bos is not None)
    new_ends = np.cumsum(lens + extra)
    out = np.empty(int(new_ends[-1]), dtype=dtype)
    shift = np.repeat(np.arange(lens.size, dtype=np.int64) * extra + (bos is not None), lens)
    out[np.arange(flat.size, dtype=np.int64) + shift] = flat
    out[new_ends - 1] = eos
    if bos is not None:
        out[new_ends - lens - extra] = bos
    return out


def encode_shard(task: dict) -> dict:
    """Tokenize one input shard into `parts/part-NNNNN`; return its ledger entry. Idempotent."""
    tok = _tokenizer_for(task["tokenizer"], task["fingerprint"])
    out: dict[str, list[np.ndarray]] = {s: [] for s in SPLITS}
    lengths: dict[str, list[int]] = {s: [] for s in SPLITS}
    skipped_empty = 0
    from schooner.data import SkipLog

    skips = SkipLog()
    for batch in _batches(task, skips):
        keep = [(k, t) for k, t in batch if t]
        skipped_empty += len(batch) - len(keep)
        if not keep:
            continue
        encoded = tok.encode_batch([t for _, t in keep])
        splits = [split_of(k, task["validation_fraction"], task["split_seed"]) for k, _ in keep]
        for split in SPLITS:
            docs = [ids for ids, s in zip(encoded, splits) if s == split]
            if not docs:
                continue
            # One flat array per batch: BOS? + ids + EOS per document, built without a Python loop per token.
            lens = np.fromiter(map(len, docs), dtype=np.int64, count=len(docs))
            flat = np.fromiter(chain.from_iterable(docs), dtype=np.int64, count=int(lens.sum()))
            out[split].append(
                _frame(flat, lens, tok.eos_id, tok.bos_id if task["prepend_bos"] else None, task["dtype"])
            )
            lengths[split].extend((lens + 1 + int(task["prepend_bos"])).tolist())

    # A fresh folder per attempt: an orphaned worker of a killed build finishing the same shard cannot
    # overwrite the arrays a rerun is writing; the ledger JSON (written last) names the folder to merge.
    folder = f"part-{task['index']:05d}-{uuid.uuid4().hex[:12]}"
    part = _store.join(task["output"], "parts", folder)
    ledger: dict[str, Any] = {
        "index": task["index"],
        "folder": folder,
        "shard": task["shard"],
        "shard_bytes": task["shard_bytes"],
        "skipped_empty": skipped_empty,
        "skipped_bad": skips.to_dict(),
        "splits": {},
    }
    for split in SPLITS:
        tokens = (
            np.concatenate(out[split]).astype(task["dtype"]) if out[split] else np.zeros(0, task["dtype"])
        )
        offsets = np.concatenate([[0], np.cumsum(lengths[split], dtype=np.int64)]).astype(np.int64)
        max_id = int(tokens.max()) if tokens.size else -1
        if max_id >= tok.vocab_size:  # a tokenizer bug or a corrupt JSON; never write such a cache
            raise ValueError(
                f"{task['shard']}: tokenizer produced id {max_id} >= vocab_size={tok.vocab_size}"
            )
        _store.write_all(
            _store.create_array(_store.join(part, split, "tokens"), tokens.size, task["dtype"]), tokens
        )
        _store.write_all(
            _store.create_array(_store.join(part, split, "offsets"), offsets.size, "int64"), offsets
        )
        ledger["splits"][split] = {
            "documents": len(lengths[split]),
            "tokens": int(tokens.size),
            "max_token_id": max_id,
            "sha256": hashlib.sha256(tokens.astype("<i4").tobytes()).hexdigest(),
        }
    _store.write_json(_store.join(task["output"], "parts", f"part-{task['index']:05d}.json"), ledger)
    return ledger


# -- the driver ------------------------------------------------------------------------------------


def _merge(output: str, split: str, plan: dict, ledgers: list[dict], tok: Tokenizer) -> dict:
    """Concatenate the parts of one split into `output/split` and write its manifest last."""
    dest = _store.join(output, split)
    n_tok = sum(lg["splits"][split]["tokens"] for lg in ledgers)
    n_doc = sum(lg["splits"][split]["documents"] for lg in ledgers)
    tokens = _AlignedWriter(
        _store.create_array(_store.join(dest, "tokens"), n_tok, plan["dtype"]),
        _store.WRITE_CHUNK,
        plan["dtype"],
    )
    offsets = _AlignedWriter(
        _store.create_array(_store.join(dest, "offsets"), n_doc + 1, "int64"), _store.WRITE_CHUNK, "int64"
    )
    offsets.append(np.zeros(1, np.int64))
    shards, doc_base = [], 0
    for lg in ledgers:
        s = lg["splits"][split]
        part = _store.join(output, "parts", lg["folder"], split)
        token_base = tokens.pos + tokens.buffered
        if s["tokens"]:
            tokens.append(_store.open_array(_store.join(part, "tokens")).read().result())
            offsets.append(_store.open_array(_store.join(part, "offsets"))[1:].read().result() + token_base)
        shards.append(
            {
                "path": lg["shard"],
                "documents": s["documents"],
                "tokens": s["tokens"],
                "document_start": doc_base,
                "token_start": token_base,
                "sha256": s["sha256"],
                "skipped_empty": lg["skipped_empty"],
            }
        )
        doc_base += s["documents"]
    tokens.close()
    offsets.close()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "split": split,
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_source": plan["tokenizer_source"],
        "vocab_size": tok.vocab_size,
        "bos_id": tok.bos_id,
        "eos_id": tok.eos_id,
        "pad_id": tok.pad_id,
        "prepend_bos": plan["prepend_bos"],
        "dtype": plan["dtype"],
        "num_documents": n_doc,
        "num_tokens": n_tok,
        "max_token_id": max((lg["splits"][split]["max_token_id"] for lg in ledgers), default=-1),
        "skipped_empty": sum(lg["skipped_empty"] for lg in ledgers) if split == "train" else 0,
        "skipped_bad": _merged_skips(ledgers) if split == "train" else {"skipped": 0, "examples": []},
        "validation_fraction": plan["validation_fraction"],
        "split_rule": f"blake2b('{{split_seed}}:{{record id}}') < validation_fraction * 2**64, split_seed={plan['split_seed']}",
        "sources": plan["inputs"],
        "shards": shards,
        "content_sha256": hashlib.sha256("".join(s["sha256"] for s in shards).encode()).hexdigest(),
    }
    _store.write_json(_store.join(dest, MANIFEST), manifest)
    return manifest


def _merged_skips(ledgers: list[dict]) -> dict:
    from schooner.data import SkipLog

    log = SkipLog()
    for lg in ledgers:
        log.merge(lg["skipped_bad"])
    return log.to_dict()


def build_cache(
    inputs: str | Sequence[str],
    output: str,
    tokenizer: Tokenizer | str,
    *,
    validation_fraction: float = 0.0,
    split_seed: int = 0,
    prepend_bos: bool = False,
    text_field: str = "text",
    on_error: str = "raise",
    encode_batch_size: int = 512,
    client: Any = None,
    max_workers: int | None = None,
) -> dict:
    """Tokenize record folders into `output/train` and `output/validation` token caches.

    One task per input shard runs on `client` (default: `schooner.cluster.current_client()`). Every
    document is encoded, EOS appended (BOS prepended with `prepend_bos`), and routed to validation by a
    hash of its id (`validation_fraction` of them). Rerunning after a crash redoes only unfinished shards
    and yields byte-identical caches; rerunning a finished build returns at once. Empty texts are
    skipped and counted (`skipped_empty`); bad records raise a `DataError` naming the file and line, or
    with `on_error="skip"` are counted with examples in the manifest's `skipped_bad`.

    Returns:
        A summary: documents/tokens per split, shards total and redone, seconds.

    Raises:
        ValueError: bad arguments, a tokenizer without EOS, or `output` holding a different build.
        FileNotFoundError: an input with no shards.
    """
    t0 = time.perf_counter()
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got on_error={on_error!r}")
    if encode_batch_size < 1:
        raise ValueError(f"encode_batch_size must be >= 1, got {encode_batch_size!r}")
    _store.check_supported(output)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer)
    if tok.eos_id is None:
        raise ValueError(
            f"tokenizer {tok.source}: has no EOS token, which every cached document ends with; "
            "load it with eos_token='...' naming one of its tokens"
        )
    if prepend_bos and tok.bos_id is None:
        raise ValueError(
            f"tokenizer {tok.source}: prepend_bos=True but it has no BOS token; pass bos_token='...'"
        )
    inputs = [inputs] if isinstance(inputs, str) else list(inputs)
    shards = resolve_shards(inputs)
    plan = {
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_source": tok.source,
        "inputs": inputs,
        "shards": shards,  # sizes are checked per part: a changed shard is redone, the rest kept
        "validation_fraction": float(validation_fraction),
        "split_seed": int(split_seed),
        "prepend_bos": bool(prepend_bos),
        "text_field": text_field,
        "on_error": on_error,
        "dtype": _store.token_dtype(tok.vocab_size),
    }
    build_path = _store.join(output, BUILD_FILE)
    if _store.exists(build_path):
        prev = _store.read_json(build_path)
        if prev.get("plan") != plan:
            diff = sorted(k for k in plan if prev.get("plan", {}).get(k) != plan[k])
            raise ValueError(
                f"{output!r} holds a build with a different plan (fields differ: {diff}); use a new output "
                "folder or delete this one"
            )
        if prev.get("complete"):
            return prev["summary"]
    tok.save(output)
    _store.write_json(build_path, {"plan": plan, "complete": False})

    ledgers: dict[int, dict] = {}
    todo = []
    for i, shard in enumerate(shards):
        lpath = _store.join(output, "parts", f"part-{i:05d}.json")
        if _store.exists(lpath):
            lg = _store.read_json(lpath)
            if lg.get("shard") == shard and lg.get("shard_bytes") == _shard_size(shard):
                ledgers[i] = lg
                continue
        todo.append(
            {
                "index": i,
                "shard": shard,
                "shard_bytes": _shard_size(shard),
                "output": output,
                "tokenizer": _store.join(output, TOKENIZER_FILE),
                "fingerprint": tok.fingerprint,
                "validation_fraction": float(validation_fraction),
                "split_seed": int(split_seed),
                "prepend_bos": bool(prepend_bos),
                "text_field": text_field,
                "on_error": on_error,
                "encode_batch_size": int(encode_batch_size),
                "dtype": plan["dtype"],
            }
        )
    logger.info("token cache %s: %d shards, %d already done", output, len(shards), len(ledgers))
    if todo:
        if client is None:
            from schooner.cluster import current_client

            client = current_client()
        from schooner.cluster import ResourceConfig

        for lg in client.map(
            encode_shard,
            todo,
            resources=ResourceConfig.with_cpu(cpu=1),
            max_workers=max_workers,
            name="tokenize-shard",
        ):
            ledgers[lg["index"]] = lg
    ordered = [ledgers[i] for i in range(len(shards))]
    manifests = {split: _merge(output, split, plan, ordered, tok) for split in SPLITS}
    summary = {
        "shards": len(shards),
        "shards_redone": len(todo),
        "seconds": round(time.perf_counter() - t0, 3),
        **{f"{s}_documents": m["num_documents"] for s, m in manifests.items()},
        **{f"{s}_tokens": m["num_tokens"] for s, m in manifests.items()},
        "skipped_empty": manifests["train"]["skipped_empty"],
        "skipped_bad": manifests["train"]["skipped_bad"]["skipped"],
    }
    _store.write_json(build_path, {"plan": plan, "complete": True, "summary": summary})
    _store.remove_tree(_store.join(output, "parts"))
    return summary


def write_cache(
    path: str,
    documents: Iterable[Sequence[int] | np.ndarray],
    tokenizer: Tokenizer,
    *,
    append_eos: bool = True,
    source: str = "<memory>",
) -> TokenCache:
    """Write in-memory token documents as a cache at `path` (held in memory once: for small caches,
    tests and derived sets; use `build_cache` for corpora). Returns the opened cache."""
    _store.check_supported(path)
    dtype = _store.token_dtype(tokenizer.vocab_size)
    eos = [tokenizer.eos_id] if append_eos else []
    if append_eos and tokenizer.eos_id is None:
        raise ValueError(f"tokenizer {tokenizer.source}: has no EOS token to append; pass append_eos=False")
    docs = [
        np.concatenate([np.asarray(d, dtype=np.int64).reshape(-1), np.asarray(eos, dtype=np.int64)])
        for d in documents
    ]
    tokens = np.concatenate(docs) if docs else np.zeros(0, np.int64)
    if tokens.size and (tokens.min() < 0 or tokens.max() >= tokenizer.vocab_size):
        bad = int(tokens[(tokens < 0) | (tokens >= tokenizer.vocab_size)][0])
        raise ValueError(
            f"write_cache {path!r}: token id {bad} is outside [0, vocab_size={tokenizer.vocab_size})"
        )
    offsets = np.concatenate([[0], np.cumsum([d.size for d in docs], dtype=np.int64)]).astype(np.int64)
    _store.write_all(
        _store.create_array(_store.join(path, "tokens"), tokens.size, dtype), tokens.astype(dtype)
    )
    _store.write_all(_store.create_array(_store.join(path, "offsets"), offsets.size, "int64"), offsets)
    sha = hashlib.sha256(tokens.astype("<i4").tobytes()).hexdigest()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "split": "train",
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "tokenizer_source": tokenizer.source,
        "vocab_size": tokenizer.vocab_size,
        "bos_id": tokenizer.bos_id,
        "eos_id": tokenizer.eos_id,
        "pad_id": tokenizer.pad_id,
        "prepend_bos": False,
        "dtype": dtype,
        "num_documents": len(docs),
        "num_tokens": int(tokens.size),
        "max_token_id": int(tokens.max()) if tokens.size else -1,
        "skipped_empty": 0,
        "skipped_bad": {"skipped": 0, "examples": []},
        "validation_fraction": 0.0,
        "split_rule": "none (written from memory)",
        "sources": [source],
        "shards": [
            {
                "path": source,
                "documents": len(docs),
                "tokens": int(tokens.size),
                "document_start": 0,
                "token_start": 0,
                "sha256": sha,
                "skipped_empty": 0,
            }
        ],
        "content_sha256": hashlib.sha256(sha.encode()).hexdigest(),
    }
    _store.write_json(_store.join(path, MANIFEST), manifest)
    return TokenCache.open(path)
