"""Loss and bits-per-byte of a model on token streams: the one scorer of train-time eval and ``schooner.eval``.

The numbers are a pure function of (model, stream, seq_len, respect_documents): the stream is cut into
windows by :mod:`._windows` without reference to the batch size, padding is masked, and every window's nats
are summed on the host in float64 in window order, so any batch size (and any data-parallel layout) gives
the same totals up to the float32 rounding of the per-token losses.

A Schooner :class:`Transformer` is scored with the fused output projection + cross-entropy
(:func:`token_losses`), which never materialises the [batch, positions, vocab] float32 log-softmax (16.8 GB at
batch 8, seq 4096 and a 128k vocabulary). Any other callable ``model(tokens, *, segment_ids) -> logits`` is
scored from its logits (small reference models in tests).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from ._loss import token_losses
from ._transformer import Transformer
from ._windows import TokenStream, WindowBatch, iter_window_batches, num_windows


@eqx.filter_jit
def token_nll(model: Any, tokens: jax.Array, segment_ids: jax.Array) -> jax.Array:
    """float32[B, T-1]: nats of each next-token prediction (``[b, t]`` is -log p(tokens[b, t+1] | ...))."""
    if isinstance(model, Transformer):
        return token_losses(model, tokens, segment_ids)
    logits = model(tokens, segment_ids=segment_ids)
    logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1)[..., 0]


def _vocab_size(model: Any, seq_len: int) -> int:
    if isinstance(model, Transformer):
        return model.config.vocab_size
    probe = eqx.filter_eval_shape(
        lambda m, t: m(t, segment_ids=t), model, jax.ShapeDtypeStruct((1, seq_len), jnp.int32)
    )
    return int(probe.shape[-1])


class StreamScorer:
    """Scores models on fixed windows of named token streams (see the module docstring).

    Args:
        streams: name -> the token stream to score.
        seq_len: window length in tokens (the model's context for scoring).
        batch_size: windows per device call; changes speed and memory, never the numbers.
        byte_lengths: int[vocab] UTF-8 bytes each token id stands for (bits-per-byte), or None.
        respect_documents: mask attention across documents and do not score the first token of each
            document, as training does; False scores each stream as one text.
        sharding: where the [batch, seq_len] arrays go (e.g. the data-parallel batch sharding).

    Raises:
        ValueError: a stream with a negative token id, or with an id beyond ``byte_lengths``.

    Example:
        >>> scorer = StreamScorer({"docs": TokenStream.from_cache(cache)}, seq_len=256, batch_size=8)
        >>> scorer(model)["docs"]["loss"]  # doctest: +SKIP
    """

    def __init__(
        self,
        streams: Mapping[str, TokenStream],
        *,
        seq_len: int,
        batch_size: int,
        byte_lengths: np.ndarray | None = None,
        respect_documents: bool = True,
        sharding: Any = None,
    ) -> None:
        if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 2:
            raise ValueError(f"seq_len must be an int >= 2, got {seq_len=}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an int >= 1, got {batch_size=}")
        self.streams = dict(streams)
        self.seq_len, self.batch_size = seq_len, batch_size
        self.respect_documents, self.sharding = respect_documents, sharding
        self.byte_lengths = None if byte_lengths is None else np.asarray(byte_lengths, np.int64)
        for name, stream in self.streams.items():
            if stream.num_tokens and int(stream.tokens.min()) < 0:
                raise ValueError(
                    f"evaluation set {name!r} holds a negative token id {int(stream.tokens.min())}"
                )
            top = int(stream.tokens.max()) if stream.num_tokens else -1
            if self.byte_lengths is not None and top >= self.byte_lengths.size:
                raise ValueError(
                    f"evaluation set {name!r} holds token id {top} but the tokenizer's byte table has only "
                    f"{self.byte_lengths.size} entries; pass the tokenizer the stream was built with"
                )

    def num_windows(self, name: str) -> int:
        """How many windows stream ``name`` is cut into."""
        return num_windows(self.streams[name].num_tokens, self.seq_len)

    def _batches(self, stream: TokenStream) -> Iterator[WindowBatch]:
        return iter_window_batches(
            stream, seq_len=self.seq_len, batch_size=self.batch_size, respect_documents=self.respect_documents
        )

    def _place(self, x: np.ndarray) -> jax.Array:
        return jax.device_put(x, self.sharding) if self.sharding is not None else jnp.asarray(x)

    def score(self, model: Any, name: str) -> dict[str, Any]:
        """The scores of stream ``name``: ``loss`` (nats/token), ``perplexity``, ``nats``, ``tokens``,
        ``documents``, ``windows`` and, with byte lengths, ``bytes``, ``bpb`` and ``bytes_per_token``."""
        stream = self.streams[name]
        vocab = _vocab_size(model, self.seq_len)
        top = int(stream.tokens.max()) if stream.num_tokens else -1
        if top >= vocab:
            raise ValueError(
                f"evaluation set {name!r} holds token id {top} but the model's vocabulary has {vocab} entries; "
                "the stream was built with a different tokenizer than the model was trained on"
            )
        window_nats: list[float] = []
        tokens = nbytes = 0
        table = self.byte_lengths
        for batch in self._batches(stream):
            nll = np.asarray(
                _gathered(token_nll(model, self._place(batch.tokens), self._place(batch.segment_ids))),
                np.float64,
            )
            for r in range(batch.num_real):
                mask = batch.target_mask[r]
                window_nats.append(float(nll[r][mask].sum()))
                tokens += int(mask.sum())
                if table is not None:
                    nbytes += int(table[batch.tokens[r, 1:][mask]].sum())
        if tokens == 0:
            raise ValueError(
                f"evaluation set {name!r} has no token to score ({stream.num_tokens} tokens in "
                f"{stream.num_documents} documents); it needs at least one document of two or more tokens"
            )
        nats = math.fsum(window_nats)
        loss = nats / tokens
        result: dict[str, Any] = {
            "loss": loss,
            "perplexity": math.exp(min(loss, 700.0)),
            "nats": nats,
            "tokens": tokens,
            "documents": stream.num_documents,
            "windows": len(window_nats),
        }
        if table is not None:
            result["bytes"] = nbytes
            result["bpb"] = nats / math.log(2) / nbytes if nbytes else float("nan")
            result["bytes_per_token"] = nbytes / tokens
        return result

    def __call__(self, model: Any) -> dict[str, dict[str, Any]]:
        """The scores of every stream, by name (see :meth:`score`)."""
        return {name: self.score(model, name) for name in self.streams}


def _gathered(x: jax.Array) -> Any:
    """`x` whole on this process: on several processes (multi-host) its rows are spread over all of them."""
    if x.is_fully_addressable:
        return x
    from jax.experimental import multihost_utils

    return multihost_utils.process_allgather(x, tiled=True)
