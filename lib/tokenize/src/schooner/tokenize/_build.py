"""Build a token cache from record folders: one task per input shard, resumable at shard granularity.

Layout of a build folder (the `tokenized` step's output):

- `tokenizer.json` / `tokenizer_config.json`: the tokenizer the workers load (and provenance).
- `build.json`: the plan (tokenizer fingerprint, shards, split rule), the identity of every input shard,
  and `complete` once the caches exist.
- `parts/part-00003.json` + `parts/part-00003-<attempt>/`: one finished input shard (see `_encode`). The
  JSON is written last, so it marks a part as complete; a killed build redoes only shards without one, or
  whose input changed since (each part records its input's identity). After the merge the parts go.
- `train/` and `validation/`: the two `TokenCache`s, merged from the parts in shard order.

The result depends only on the plan and the inputs' content, never on which shards were redone or which
client ran them. A folder holding a build of another plan, or of inputs that changed, is rebuilt (never
reused).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schooner.data import storage

from . import _arrays
from ._cache import FORMAT, FORMAT_VERSION, MANIFEST, TokenCache
from ._encode import SPLITS, encode_shard
from ._tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer

logger = logging.getLogger("schooner.tokenize")

BUILD_FILE = "build.json"
BATCH_CHARS = 1 << 20
"""Characters of text per `encode_batch` call."""
PIECE_CHARS = 1 << 18
"""Documents longer than this many characters are encoded in pieces (see `_split_text`)."""


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


def input_identities(inputs: Sequence[str], shards: Sequence[str]) -> list[Any]:
    """What identifies each shard's content: the sha256 a record folder's manifest lists for it, else the
    file's size and modification time (or object-store version)."""
    listed: dict[str, str] = {}
    for inp in inputs:
        m = storage.join(inp, "manifest.json")
        if not storage.has_glob(inp) and storage.isdir(inp) and storage.exists(m):
            for s in storage.read_json(m).get("shards", []):
                if s.get("sha256"):
                    listed[storage.join(inp, s["path"])] = s["sha256"]
    return [{"sha256": listed[s]} if s in listed else storage.file_identity(s) for s in shards]


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


def _merge(output: str, split: str, plan: dict, ledgers: list[dict], tok: Tokenizer) -> dict:
    """Concatenate the parts of one split into `output/split` and write its manifest last."""
    dest = storage.join(output, split)
    n_tok = sum(lg["splits"][split]["tokens"] for lg in ledgers)
    n_doc = sum(lg["splits"][split]["documents"] for lg in ledgers)
    chunk = _arrays.WRITE_CHUNK
    tokens = _AlignedWriter(_arrays.create_array(storage.join(dest, "tokens"), n_tok, plan["dtype"]), chunk,
                            plan["dtype"])  # fmt: skip
    offsets = _AlignedWriter(_arrays.create_array(storage.join(dest, "offsets"), n_doc + 1, "int64"), chunk,
                             "int64")  # fmt: skip
    offsets.append(np.zeros(1, np.int64))
    shards, doc_base = [], 0
    for lg in ledgers:
        s = lg["splits"][split]
        part = storage.join(output, "parts", lg["folder"])
        token_base = tokens.pos + tokens.buffered
        if s["tokens"]:
            for piece in _read_part(storage.join(part, f"{split}.tokens"), plan["dtype"], chunk):
                tokens.append(piece)
            end = token_base
            for lengths in _read_part(storage.join(part, f"{split}.offsets"), "int64", chunk):
                ends = np.cumsum(lengths, dtype=np.int64) + end
                offsets.append(ends)
                end = int(ends[-1])
        shards.append({
            "path": lg["shard"], "documents": s["documents"], "tokens": s["tokens"], "document_start": doc_base,
            "token_start": token_base, "sha256": s["sha256"], "skipped_empty": lg["skipped_empty"],
        })  # fmt: skip
        doc_base += s["documents"]
    tokens.close()
    offsets.close()
    train = split == "train"
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
    storage.write_json(storage.join(dest, MANIFEST), manifest, pretty=True)
    return manifest


def _merged_skips(ledgers: list[dict]) -> dict:
    from schooner.data import SkipLog

    log = SkipLog()
    for lg in ledgers:
        log.merge(lg["skipped_bad"])
    return log.to_dict()


def _start_fresh(output: str) -> None:
    """Remove a build of another plan (or of changed inputs) before building here."""
    for name in ("parts", *SPLITS):
        storage.remove_tree(storage.join(output, name))
    storage.remove(storage.join(output, BUILD_FILE))


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
    batch_chars: int = BATCH_CHARS,
    piece_chars: int = PIECE_CHARS,
    client: Any = None,
    max_workers: int | None = None,
) -> dict:
    """Tokenize record folders into `output/train` and `output/validation` token caches.

    One task per input shard runs on `client` (default: `schooner.cluster.current_client()`). Every
    document is encoded, EOS appended (BOS prepended with `prepend_bos`), and routed to validation by a
    hash of its id (`validation_fraction` of them). Text is encoded `batch_chars` characters at a time, and
    documents longer than `piece_chars` in pieces cut where the tokens equal those of the whole document
    (see `docs/packages/tokenize.md`), so memory stays bounded for any document. Rerunning after a crash
    redoes only unfinished shards (and shards whose input changed) and yields byte-identical caches;
    rerunning a finished build of the same plan and inputs returns at once; a folder holding a build of
    another plan or of changed inputs is rebuilt. Empty texts are skipped and counted (`skipped_empty`);
    bad records raise a `DataError` naming the file and line, or with `on_error="skip"` are counted with
    examples in the manifest's `skipped_bad`.

    Returns:
        A summary: documents/tokens per split, shards total and redone, seconds.

    Raises:
        ValueError: bad arguments or a tokenizer without EOS.
        FileNotFoundError: an input with no shards.
    """
    t0 = time.perf_counter()
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got on_error={on_error!r}")
    for name, v in (("batch_chars", batch_chars), ("piece_chars", piece_chars)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1024:
            raise ValueError(f"{name} must be an integer >= 1024, got {name}={v!r}")
    _arrays.check_supported(output)
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
    identities = input_identities(inputs, shards)
    plan = {
        "tokenizer_fingerprint": tok.fingerprint,
        "tokenizer_source": tok.source,
        "inputs": inputs,
        "shards": shards,
        "validation_fraction": float(validation_fraction),
        "split_seed": int(split_seed),
        "prepend_bos": bool(prepend_bos),
        "text_field": text_field,
        "on_error": on_error,
        "dtype": _arrays.token_dtype(tok.vocab_size),
    }
    build_path = storage.join(output, BUILD_FILE)
    if storage.exists(build_path):
        prev = storage.read_json(build_path)
        if prev.get("plan") != plan:
            diff = sorted(k for k in plan if prev.get("plan", {}).get(k) != plan[k])
            logger.warning("%s holds a build of another plan (differs in %s): rebuilding it", output, diff)
            _start_fresh(output)
        elif prev.get("complete") and prev.get("inputs") == identities:
            return prev["summary"]
        elif prev.get("complete"):
            logger.warning("%s: inputs changed since the build finished: rebuilding it", output)
            _start_fresh(output)
    tok.save(output)
    storage.write_json(build_path, {"plan": plan, "inputs": identities, "complete": False}, pretty=True)

    ledgers: dict[int, dict] = {}
    todo = []
    for i, shard in enumerate(shards):
        lpath = storage.join(output, "parts", f"part-{i:05d}.json")
        if storage.exists(lpath):
            lg = storage.read_json(lpath)
            if lg.get("shard") == shard and lg.get("input") == identities[i]:
                ledgers[i] = lg
                continue
        todo.append({
            "index": i, "shard": shard, "input": identities[i], "output": output,
            "tokenizer": storage.join(output, TOKENIZER_FILE), "fingerprint": tok.fingerprint,
            "validation_fraction": float(validation_fraction), "split_seed": int(split_seed),
            "prepend_bos": bool(prepend_bos), "text_field": text_field, "on_error": on_error,
            "batch_chars": int(batch_chars), "piece_chars": int(piece_chars), "dtype": plan["dtype"],
        })  # fmt: skip
    logger.info("token cache %s: %d shards, %d already done", output, len(shards), len(ledgers))
    if todo:
        if client is None:
            from schooner.cluster import current_client

            client = current_client()
        from schooner.cluster import ResourceConfig

        for lg in client.map(
            encode_shard, todo, resources=ResourceConfig.with_cpu(cpu=1), max_workers=max_workers,
            name="tokenize-shard",
        ):  # fmt: skip
            ledgers[lg["index"]] = lg
    ordered = [ledgers[i] for i in range(len(shards))]
    manifests = {split: _merge(output, split, plan, ordered, tok) for split in SPLITS}
    train = manifests["train"]
    summary = {
        "shards": len(shards),
        "shards_redone": len(todo),
        "seconds": round(time.perf_counter() - t0, 3),
        **{f"{s}_documents": m["num_documents"] for s, m in manifests.items()},
        **{f"{s}_tokens": m["num_tokens"] for s, m in manifests.items()},
        "skipped_empty": train["skipped_empty"],
        "skipped_bad": train["skipped_bad"]["skipped"],
        "long_documents": train["long_documents"],
        "long_documents_uncut": train["long_documents_uncut"],
    }
    storage.write_json(build_path, {"plan": plan, "inputs": identities, "complete": True, "summary": summary},
                       pretty=True)  # fmt: skip
    storage.remove_tree(storage.join(output, "parts"))
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
    _arrays.check_supported(path)
    dtype = _arrays.token_dtype(tokenizer.vocab_size)
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
    _arrays.write_all(
        _arrays.create_array(storage.join(path, "tokens"), tokens.size, dtype), tokens.astype(dtype)
    )
    _arrays.write_all(_arrays.create_array(storage.join(path, "offsets"), offsets.size, "int64"), offsets)
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
        ],  # fmt: skip
        "content_sha256": hashlib.sha256(sha.encode()).hexdigest(),
    }
    storage.write_json(storage.join(path, MANIFEST), manifest, pretty=True)
    return TokenCache.open(path)
