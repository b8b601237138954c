"""Log-likelihood of continuations given contexts, the same for any batch size, padding or request order.

A request is a context and a continuation, both already in token space, split from text as
lm-evaluation-harness splits it (`encode_pair`: trailing whitespace goes with the continuation, which is cut
from the encoding of the whole string), so every choice of a multiple-choice question is scored after the very
same context tokens and the numbers are those of lm-eval's `hf` backend for the same model and tokenizer. The
model reads `context + continuation[:-1]` and the request's score is the sum of the log-probabilities of the
continuation tokens, plus whether each of them is the argmax (the greedy continuation, LAMBADA's accuracy).

Why the numbers do not depend on the batch: each request becomes one row on its own, its length rounded up to
a bucket that depends on that request alone (`_bucket`), the padding after it is a separate segment (real
tokens never attend to it), every call has `batch_size` rows (short batches are filled with copies of a
dummy row), and per-token log-probabilities are summed on the host in float64 in token order. So a request's
score is a function of the request, the model, the bucket size and `micro_batch` only: the same bits for batch 1, 3 or 16 and
for any order of requests (tested on CPU).

Requests longer than `max_length + 1` tokens keep their last `max_length + 1` tokens (the continuation is
never cut; a continuation longer than the window is an error).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

BUCKET = 32
"""Row lengths are rounded up to a multiple of this (one compilation per bucket in use)."""


@dataclasses.dataclass(frozen=True)
class Request:
    """One log-likelihood request in token space.

    Attributes:
        context: token ids the model conditions on (at least one: start documents with a BOS/EOS id).
        continuation: token ids whose log-probability is measured (at least one).
    """

    context: tuple[int, ...]
    continuation: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.context:
            raise ValueError("a request needs a non-empty context; start it with the tokenizer's BOS/EOS id")
        if not self.continuation:
            raise ValueError(f"a request needs a non-empty continuation (context ends {self.context[-5:]})")


@dataclasses.dataclass(frozen=True)
class Score:
    """The score of one request.

    Attributes:
        logprob: sum of the continuation tokens' log-probabilities (nats, float64 sum of float32 terms).
        greedy: every continuation token is the model's argmax at its position.
        num_tokens: continuation length in tokens.
    """

    logprob: float
    greedy: bool
    num_tokens: int


def start_id(tokenizer: Any) -> int:
    """The id a context-free text starts from: the tokenizer's BOS, else its EOS (documents are EOS-separated)."""
    for name in ("bos_id", "eos_id"):
        value = getattr(tokenizer, name, None)
        if value is not None:
            return int(value)
    raise ValueError("scoring text without a context needs a tokenizer with a BOS or EOS token")


def encode_pair(tokenizer: Any, context: str, continuation: str) -> Request:
    """The `Request` of `context` + `continuation`, split exactly as lm-evaluation-harness splits it.

    lm-eval's rule (`TemplateLM._encode_pair`, causal models): all trailing whitespace of `context` (spaces,
    tabs, newlines: `str.rstrip()`) moves to the front of `continuation`, so "Answer: " + "Paris" and
    "Answer:" + " Paris" are the same request and a code task's "\n    " is scored with the next line it
    starts, as a byte-level BPE pre-tokenizes it. The context is then encoded alone, the whole string
    `context + continuation` is encoded once, and the continuation is the whole string's tokens after the
    context's token count. Every choice is scored after the same context tokens, and the continuation's tokens
    are those the tokenizer gives in running text (with no delimiter, `target_delimiter: ""`, a word split
    across the boundary is tokenized as one word would be).

    An empty (or whitespace-only) context starts from `start_id(tokenizer)` (lm-eval's `prefix_token_id`)
    and the continuation is encoded alone.

    Raises:
        ValueError: the continuation gets no token of its own (e.g. it is empty, or merges into the context's
            last token); lm-eval would score it as log-probability 0.
    """
    stripped = context.rstrip()
    if len(stripped) != len(context):
        continuation = context[len(stripped) :] + continuation
        context = stripped
    if context:
        ctx = [int(t) for t in tokenizer.encode(context)]
        cont = [int(t) for t in tokenizer.encode(context + continuation)][len(ctx) :]
    else:
        ctx, cont = [], [int(t) for t in tokenizer.encode(continuation)]
    if not ctx:
        ctx = [start_id(tokenizer)]
    if not cont:
        raise ValueError(
            f"continuation {continuation!r} gets no token of its own after context ending {context[-40:]!r} "
            "(it is empty, or the tokenizer merges it into the context's last token); give every choice "
            "some text, or a delimiter between context and continuation"
        )
    return Request(tuple(ctx), tuple(cont))


def _chunk_scores(model: Any, tokens: jax.Array, segment_ids: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = model(tokens, segment_ids=segment_ids)[:, :-1].astype(jnp.float32)
    logp = jax.nn.log_softmax(logits, axis=-1)
    target = tokens[:, 1:]
    picked = jnp.take_along_axis(logp, target[..., None], axis=-1)[..., 0]
    return picked, jnp.argmax(logits, axis=-1) == target


@eqx.filter_jit
def _row_scores(
    model: Any, tokens: jax.Array, segment_ids: jax.Array, micro_batch: int
) -> tuple[jax.Array, jax.Array]:
    """float32[B, T-1] log p(tokens[:, t+1] | ...) and bool[B, T-1] whether it is the argmax.

    The model runs on `micro_batch` rows at a time (a `lax.map` over chunks), so the shapes of every matmul are
    the same whatever B is: XLA's CPU kernels pick blockings (and so summation orders) by shape.
    """
    b, t = tokens.shape
    chunks = (
        tokens.reshape(b // micro_batch, micro_batch, t),
        segment_ids.reshape(b // micro_batch, micro_batch, t),
    )
    picked, hit = jax.lax.map(lambda c: _chunk_scores(model, c[0], c[1]), chunks)
    return picked.reshape(b, t - 1), hit.reshape(b, t - 1)


def _bucket(length: int, max_length: int) -> int:
    return min(-(-length // BUCKET) * BUCKET, max_length)


def _window(request: Request, max_length: int, name: str) -> np.ndarray:
    tokens = np.asarray(request.context + request.continuation, np.int32)
    if len(request.continuation) > max_length:
        raise ValueError(
            f"{name}: a continuation of {len(request.continuation)} tokens does not fit the {max_length}-token "
            "window; raise max_length (at most the model's max_seq_len) or shorten the continuation"
        )
    return tokens[-(max_length + 1) :]


def model_max_length(model: Any, default: int = 2048) -> int:
    """The model's context length (`model.config.max_seq_len`), else `default`."""
    value = getattr(getattr(model, "config", None), "max_seq_len", None)
    return int(value) if value else default


def check_token_ids(model: Any, rows: Sequence[Any], what: str, names: Sequence[str] | None = None) -> None:
    """A ValueError when a token id of `rows` (sequences or 1-D arrays of ids) is negative or past the model's
    vocabulary (`model.config.vocab_size`); the message names row `i` as `names[i]`, else `"{what} {i}"`.

    Such an id reads outside the embedding table, which gives NaN (or another row's) log-probabilities
    silently: it means the tokenizer is not the one the model was trained with.
    """
    vocab = getattr(getattr(model, "config", None), "vocab_size", None)
    for i, row in enumerate(rows):
        if not len(row):
            continue
        top, low = max(row), min(row)
        if (vocab is not None and top >= vocab) or low < 0:
            bad = top if low >= 0 else low
            raise ValueError(
                f"{names[i] if names else f'{what} {i}'} holds token id {int(bad)} but the model's vocabulary has {vocab} entries: the "
                "tokenizer is not the one the model was trained with; pass the checkpoint's own tokenizer"
            )


def score_requests(
    model: Any,
    requests: Sequence[Request],
    *,
    batch_size: int = 8,
    max_length: int | None = None,
    micro_batch: int = 1,
    names: Sequence[str] | None = None,
) -> list[Score]:
    """Score each request (see the module docstring); results in the order of `requests`.

    Args:
        model: `model(tokens int32[B, T], *, segment_ids=int32[B, T]) -> logits [B, T, V]`.
        requests: what to score.
        batch_size: rows per device call (speed and memory only; the numbers do not depend on it); rounded
            up to a multiple of `micro_batch`.
        max_length: the model's window in tokens (default `model.config.max_seq_len`).
        micro_batch: rows the model computes at once inside a call. Part of the numbers' definition (with
            `BUCKET`): keep 1 for bitwise reproducibility across batch sizes on CPU; on an accelerator use, say,
            16 for throughput (then every batch size that is a multiple of it gives the same numbers).
        names: what each request is (`"task 'arc': document 17 (arc.jsonl:18), choice 2"`), for the errors
            (a continuation longer than the window, a token id past the vocabulary); default `"request {i}"`.

    Raises:
        ValueError: a continuation longer than `max_length` tokens (lm-eval's `hf` backend asserts the same
            limit) or a token id outside the model's vocabulary; the message names the request.
    """
    if names is not None and len(names) != len(requests):
        raise ValueError(
            f"names holds {len(names)} entries for {len(requests)} requests; give one per request"
        )
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size=}")
    if isinstance(micro_batch, bool) or not isinstance(micro_batch, int) or micro_batch < 1:
        raise ValueError(f"micro_batch must be an int >= 1, got {micro_batch=}")
    batch_size = -(-batch_size // micro_batch) * micro_batch
    limit = max_length or model_max_length(model)
    windows = [_window(r, limit, names[i] if names else f"request {i}") for i, r in enumerate(requests)]
    check_token_ids(model, windows, "request", names)
    by_bucket: dict[int, list[int]] = {}
    for i, w in enumerate(windows):
        by_bucket.setdefault(_bucket(len(w), limit + 1), []).append(i)
    results: list[Score | None] = [None] * len(requests)
    for length in sorted(by_bucket):
        members = by_bucket[length]
        for start in range(0, len(members), batch_size):
            chunk = members[start : start + batch_size]
            tokens = np.zeros((batch_size, length), np.int32)
            segments = np.ones((batch_size, length), np.int32)
            for row, i in enumerate(chunk):
                tokens[row, : len(windows[i])] = windows[i]
                segments[row, : len(windows[i])] = 0
            device_logp, device_hit = _row_scores(
                model, jnp.asarray(tokens), jnp.asarray(segments), micro_batch
            )
            logp, hit = np.asarray(device_logp, np.float64), np.asarray(device_hit)
            for row, i in enumerate(chunk):
                n, k = len(windows[i]), len(requests[i].continuation)
                terms = logp[row, n - 1 - k : n - 1]
                results[i] = Score(float(math.fsum(terms)), bool(hit[row, n - 1 - k : n - 1].all()), k)
    return [r for r in results if r is not None]


def rolling_requests(tokens: Sequence[int], *, start: int, max_length: int) -> list[Request]:
    """Disjoint windows scoring every token of a document once (lm-eval's `loglikelihood_rolling`).

    The first window predicts the document's first `max_length` tokens from `start` (BOS/EOS); each later
    window predicts the next `max_length` tokens with the preceding tokens as context (up to `max_length`
    tokens of it), so a long document gets the longest context the window allows.
    """
    ids = [int(t) for t in tokens]
    out: list[Request] = []
    for begin in range(0, len(ids), max_length):
        target = ids[begin : begin + max_length]
        context = ([start] + ids)[max(0, begin + 1 - (max_length + 1 - len(target))) : begin + 1]
        out.append(Request(tuple(context), tuple(target)))
    return out


def score_rolling(
    model: Any,
    documents: Sequence[Sequence[int]],
    *,
    start: int,
    batch_size: int = 8,
    max_length: int | None = None,
) -> list[float]:
    """Total log-probability (nats) of each document's tokens, each predicted once (see `rolling_requests`)."""
    limit = max_length or model_max_length(model)
    requests: list[Request] = []
    owner: list[int] = []
    for d, doc in enumerate(documents):
        for r in rolling_requests(doc, start=start, max_length=limit):
            requests.append(r)
            owner.append(d)
    scores = score_requests(model, requests, batch_size=batch_size, max_length=limit)
    per_doc: list[list[float]] = [[] for _ in documents]
    for d, s in zip(owner, scores, strict=True):
        per_doc[d].append(s.logprob)
    return [math.fsum(v) for v in per_doc]
