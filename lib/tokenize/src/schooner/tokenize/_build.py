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

import concurrent.futures
import dataclasses
import hashlib
import json
import logging
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from schooner.cluster import storage
from schooner.data.storage import file_identity, has_glob

from . import _arrays
from ._cache import FORMAT, FORMAT_VERSION, KINDS, MANIFEST, TokenCache
from ._chat import resolve_template
from ._encode import SPLITS, encode_shard, serial_tokenizers
from ._merge import merge_split
from ._tokenizer import TOKENIZER_FILE, Tokenizer, load_tokenizer

logger = logging.getLogger("schooner.tokenize")

BUILD_FILE = "build.json"
BATCH_CHARS = 1 << 20
"""Characters of text per `encode_batch` call."""
PIECE_CHARS = 1 << 18
"""Documents longer than this many characters are encoded in pieces (see `_split_text`)."""
IN_PROCESS_BELOW = 64 << 20
"""Bytes of input (the shard files still to tokenize, as stored) below which a build runs its shard tasks
on threads of the calling process rather than on the cluster client. A fresh worker process spends about
0.6 CPU-seconds importing numpy, tensorstore, `tokenizers` and Schooner before its first record, as long
as the fast path takes to encode 7 MB of text; threads share what this process has imported and loaded,
and encode in parallel (both encoders release the GIL)."""


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
        if not has_glob(inp) and storage.isdir(inp) and storage.exists(m):
            for s in storage.read_json(m).get("shards", []):
                if s.get("sha256"):
                    listed[storage.join(inp, s["path"])] = s["sha256"]
    return [{"sha256": listed[s]} if s in listed else file_identity(s) for s in shards]


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
    kind: str = "text",
    chat_template: Any = None,
    max_length: int | None = None,
    encoder: str | None = None,
    client: Any = None,
    max_workers: int | None = None,
    in_process_below: int = IN_PROCESS_BELOW,
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
    bad records raise (a `JobError` naming the shard's task, caused by a `DataError` naming the file and
    line), or with `on_error="skip"` are counted with examples in the manifest's `skipped_bad`.

    `kind="chat"` reads chat records (`messages`) and `kind="preference"` preference records (`prompt`,
    `chosen`, `rejected`; two documents per record, chosen then rejected), rendered with `chat_template`
    (default: the tokenizer's), into caches with a per-token loss mask; `max_length` cuts each document
    (a record left without a target token is bad input: raised naming file and line, or skipped and
    counted). See `schooner.tokenize.steps.tokenized_chat`.

    `encoder` ("auto", "hf", "tiktoken"; default: the tokenizer's own setting) chooses how text is encoded:
    tiktoken where it provably gives HF's ids, else HF `tokenizers`. The choice is logged, recorded in the
    manifests (`encoder`), and part of the plan (switching rebuilds); the caches are the same either way.

    Where the shard files still to tokenize hold fewer than `in_process_below` bytes (default 64 MiB, about
    250 MB of text as .jsonl.zst), the tasks run on up to `max_workers` threads of this process (default:
    the CPUs `client` may use, else this process's) instead of on the client, whose worker processes
    each spend about 0.6 CPU-seconds importing and loading the tokenizer before their first record (a
    noticeable share of such a build); a failing task raises the same `JobError` either way.
    `in_process_below=0` always uses the client. The caches are the same either way.

    Returns:
        A summary: documents/tokens per split, shards total and redone, seconds.

    Raises:
        ValueError: bad arguments or a tokenizer without EOS.
        FileNotFoundError: an input with no shards.
    """
    t0 = time.perf_counter()
    if not 0.0 <= validation_fraction < 1.0:
        raise ValueError(f"validation_fraction must be in [0, 1), got {validation_fraction!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got kind={kind!r}")
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 2
    ):
        raise ValueError(f"max_length must be an int >= 2 or None, got max_length={max_length!r}")
    if kind == "text" and (chat_template is not None or max_length is not None):
        raise ValueError("chat_template= and max_length= apply to kind='chat' or 'preference' builds only")
    if kind != "text" and text_field != "text":
        raise ValueError(
            f"text_field= applies to kind='text' builds only, got text_field={text_field!r} with kind={kind!r}: "
            "chat and preference records need no text (they are read from `messages`, or `prompt`, `chosen` "
            "and `rejected`)"
        )
    if on_error not in ("raise", "skip"):
        raise ValueError(f"on_error must be 'raise' or 'skip', got on_error={on_error!r}")
    if isinstance(in_process_below, bool) or not isinstance(in_process_below, int) or in_process_below < 0:
        raise ValueError(
            f"in_process_below must be an integer >= 0 (bytes), got in_process_below={in_process_below!r}"
        )
    for name, v in (("batch_chars", batch_chars), ("piece_chars", piece_chars)):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1024:
            raise ValueError(f"{name} must be an integer >= 1024, got {name}={v!r}")
    _arrays.check_supported(output)
    tok = tokenizer if isinstance(tokenizer, Tokenizer) else load_tokenizer(tokenizer, encoder=encoder)
    if encoder is not None and tok._encoder_request != encoder:
        tok = tok._with_encoder(encoder)
    choice = tok.encoder_choice
    logger.info("token cache %s: encoder %s (%s)", output, choice.encoder, choice.reason)
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
        # the fingerprint covers tokenizer.json only; the special tokens (tokenizer_config.json) decide
        # which EOS ends every document
        "special_ids": {"bos_id": tok.bos_id, "eos_id": tok.eos_id, "pad_id": tok.pad_id},
        "inputs": inputs,
        "shards": shards,
        "validation_fraction": float(validation_fraction),
        "split_seed": int(split_seed),
        "prepend_bos": bool(prepend_bos),
        "text_field": text_field,
        "on_error": on_error,
        "dtype": _arrays.token_dtype(tok.vocab_size),
        "kind": kind,
        "encoder": choice.to_dict(),
    }
    template = None
    if kind != "text":
        template = resolve_template(tok, chat_template)
        plan |= {"template": dataclasses.asdict(template), "max_length": max_length}
    plan = json.loads(json.dumps(plan))  # as build.json will hold it (tuples become lists), to compare
    build_path = storage.join(output, BUILD_FILE)
    if storage.exists(build_path):
        prev = storage.read_json(build_path)
        if prev.get("plan") != plan:
            diff = sorted(k for k in plan if prev.get("plan", {}).get(k) != plan[k])
            logger.warning("%s holds a build of another plan (differs in %s): rebuilding it", output, diff)
            _start_fresh(output)
        elif prev.get("complete") and prev.get("inputs") == identities:
            for message in prev["summary"].get("warnings", []):
                logger.warning(message)
            return prev["summary"]
        elif prev.get("complete"):
            logger.warning("%s: inputs changed since the build finished: rebuilding it", output)
            _start_fresh(output)
    tok.save(output)
    storage.write_json(build_path, {"plan": plan, "inputs": identities, "complete": False}, indent=2)

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
            "kind": kind, "template": template, "max_length": max_length, "encoder": choice.encoder,
        })  # fmt: skip
    logger.info("token cache %s: %d shards, %d already done", output, len(shards), len(ledgers))
    if todo and _input_bytes([t["shard"] for t in todo], in_process_below) < in_process_below:
        threads = min(len(todo), max_workers or _cpus(client))
        logger.info("token cache %s: %d shards on %d threads of this process", output, len(todo), threads)
        for lg in _in_process(todo, tok, threads):
            ledgers[lg["index"]] = lg
    elif todo:
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
    manifests = {split: merge_split(output, split, plan, ordered, tok) for split in SPLITS}
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
    if validation_fraction > 0:
        summary["warnings"] = _empty_splits(output, kind, validation_fraction, split_seed, manifests)
        for message in summary["warnings"]:
            logger.warning(message)
    storage.write_json(build_path, {"plan": plan, "inputs": identities, "complete": True, "summary": summary},
                       indent=2)  # fmt: skip
    storage.remove_tree(storage.join(output, "parts"))
    return summary


def _empty_splits(output: str, kind: str, fraction: float, seed: int, manifests: dict) -> list[str]:
    """A message for each split the id hash left empty (a held-out set asked for and not built, or nothing to
    train on), naming the split, the counts and the fix."""
    per_record = 2 if kind == "preference" else 1  # a preference record is two documents
    what = {"preference": "pairs", "chat": "conversations"}.get(kind, "documents")
    counts = {split: m["num_documents"] // per_record for split, m in manifests.items()}
    total = sum(counts.values())
    fixes = {
        "validation": f"raise validation_fraction (1/{total} = {1 / max(total, 1):.3g} expects one), try another "
        "split_seed, or pass validation_fraction=0 to build no validation split",
        "train": "lower validation_fraction",
    }
    return [
        f"token cache {output}: the {split} split is empty: 0 of {total} {what} went to {split} "
        f"(validation_fraction={fraction:g}, split_seed={seed}, by a hash of each record id); {fixes[split]}"
        for split in SPLITS
        if total and counts[split] == 0
    ]


def _input_bytes(shards: Sequence[str], limit: int) -> int:
    """Bytes of the shard files, counted until `limit` is reached (each is a stat, or a request on an
    object store)."""
    total = 0
    for shard in shards:
        if total >= limit:
            break
        total += storage.file_size(shard)
    return total


def _cpus(client: Any) -> int:
    """The CPUs a build may use here: those of a `LocalClient`, else those of the enclosing job, else
    those of this process."""
    cpus = getattr(getattr(client, "machine", None), "cpus", None)
    if cpus is None:
        cpus = float(os.environ.get("SCHOONER_LOCAL_CPUS") or 0) or (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
        )
    return max(1, int(cpus))


def _in_process(todo: list[dict], tok: Tokenizer, threads: int) -> list[dict]:
    """Run the shard tasks on `threads` threads of this process, with this process's tokenizer; the first
    failure (in shard order) cancels the tasks not yet started and is raised, once the running ones end,
    as the client would raise it: a `JobError` naming the task, with the error as its cause."""
    with serial_tokenizers():  # set once here: threads never write the environment
        pool = concurrent.futures.ThreadPoolExecutor(threads, thread_name_prefix="tokenize-shard")
        try:
            futures = [pool.submit(encode_shard, t, tok) for t in todo]
            out = []
            for i, f in enumerate(futures):
                try:
                    out.append(f.result())
                except Exception as e:
                    raise _job_error(f"tokenize-shard[{i}]", e) from e
            return out
        finally:
            pool.shutdown(wait=True, cancel_futures=True)


def _job_error(name: str, e: Exception) -> Exception:
    """`e` as a cluster client reports a failed task (`JobError`: type, message and traceback)."""
    import traceback

    from schooner.cluster import JobError

    tp = type(e)
    type_name = tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
    tb = "".join(traceback.format_exception(e))
    return JobError(name, f"{type_name}: {e}", tb, cause_type=type_name)


def write_cache(
    path: str,
    documents: Iterable[Sequence[int] | np.ndarray],
    tokenizer: Tokenizer,
    *,
    append_eos: bool = True,
    source: str = "<memory>",
    loss_masks: Iterable[Sequence[int] | np.ndarray] | None = None,
    infos: Iterable[dict] | None = None,
    kind: str | None = None,
    document_bytes: Iterable[int] | None = None,
) -> TokenCache:
    """Write in-memory token documents as a cache at `path` (held in memory once: for small caches,
    tests and derived sets; use `build_cache` for corpora). Returns the opened cache.

    With `loss_masks` (one 0/1 array per document, its length) the cache is a `kind="chat"` cache (or
    `"preference"`: documents 2i and 2i+1 are pair i's chosen and rejected); the appended EOS is not a
    target. `infos` gives each document's `{"id", "source", ...}` (default: its index and `source`).
    `document_bytes` gives the UTF-8 bytes of each document's text (a text cache; what bits per byte divides
    by, see `TokenCache.document_bytes`).
    """
    _arrays.check_supported(path)
    kind = kind or ("text" if loss_masks is None else "chat")
    if kind not in KINDS or (kind == "text") != (loss_masks is None):
        raise ValueError(f"write_cache: kind={kind!r} needs loss_masks exactly when it is not 'text'")
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
    arrays: dict[str, tuple[np.ndarray, str]] = {"tokens": (tokens, dtype), "offsets": (offsets, "int64")}
    extra: dict[str, Any] = {}
    if document_bytes is not None:
        nbytes = np.asarray(list(document_bytes), dtype=np.int64).reshape(-1)
        if kind != "text" or nbytes.size != len(docs) or (nbytes < 0).any():
            raise ValueError(
                f"write_cache {path!r}: document_bytes holds {nbytes.size} entries for {len(docs)} documents; "
                "give one non-negative UTF-8 byte count per document of a text cache"
            )
        arrays["document_bytes"] = (nbytes, "int64")
        extra = {"has_document_bytes": True, "text_bytes": int(nbytes.sum())}
    if loss_masks is not None:
        masks = _document_masks(path, loss_masks, docs, len(eos))
        info_list = (
            list(infos) if infos is not None else [{"id": str(i), "source": source} for i in range(len(docs))]
        )
        if len(info_list) != len(docs):
            raise ValueError(f"write_cache {path!r}: {len(info_list)} infos for {len(docs)} documents")
        lines = [json.dumps(x, ensure_ascii=False, sort_keys=True).encode("utf-8") for x in info_list]
        mask = np.concatenate(masks) if masks else np.zeros(0, np.uint8)
        arrays |= {
            "loss_mask": (mask, "uint8"),
            "first_target": (np.array([int(np.argmax(m[1:])) + 1 for m in masks], dtype=np.int64), "int64"),
            "info": (np.frombuffer(b"".join(lines), dtype=np.uint8), "uint8"),
            "info_offsets": (
                np.concatenate([[0], np.cumsum([len(x) for x in lines])]).astype(np.int64),
                "int64",
            ),
        }
        extra = {"chat_template": None, "max_length": None, "target_tokens": int(mask.sum()),
                 "loss_mask_sha256": hashlib.sha256(mask.tobytes()).hexdigest()}  # fmt: skip
    for name, (data, dt) in arrays.items():
        _arrays.write_all(_arrays.create_array(storage.join(path, name), data.size, dt), data.astype(dt))
    sha = hashlib.sha256(tokens.astype("<i4").tobytes()).hexdigest()
    manifest = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "kind": kind,
        "has_loss_mask": loss_masks is not None,
        "split": "train",
        "tokenizer_fingerprint": tokenizer.fingerprint,
        "tokenizer_source": tokenizer.source,
        "encoder": None,
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
        **extra,
    }
    storage.write_json(storage.join(path, MANIFEST), manifest, indent=2)
    return TokenCache.open(path)


def _document_masks(path: str, loss_masks: Iterable, docs: list[np.ndarray], n_eos: int) -> list[np.ndarray]:
    """Each document's mask with the EOS (not a target) appended; every document needs a target after
    its first token (the first token of a segment is predicted by nothing)."""
    masks = [
        np.concatenate([np.asarray(m, dtype=np.uint8).reshape(-1), np.zeros(n_eos, np.uint8)])
        for m in loss_masks
    ]
    if len(masks) != len(docs):
        raise ValueError(f"write_cache {path!r}: {len(masks)} loss masks for {len(docs)} documents")
    for i, (m, d) in enumerate(zip(masks, docs)):
        if m.size != d.size or not np.isin(m, (0, 1)).all():
            raise ValueError(
                f"write_cache {path!r}: loss mask {i} must be 0/1 of its document's length {d.size - n_eos}"
            )
        if not m[1:].any():
            raise ValueError(
                f"write_cache {path!r}: document {i} has no target token after its first (loss mask all 0 there); "
                "a document must have something to train on"
            )
    return masks
