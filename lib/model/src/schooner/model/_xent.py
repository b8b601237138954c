"""The output projection fused with the cross-entropy: ``(nll, lse)`` of ``hidden @ head.T``, by chunks, never
materialising the full float32 logits. On the CPU kernel path (``kernels="cpu"``) the backward is hand-written
(below); on the plain path it is autodiff of chunks whose logits are recomputed.

The plain autodiff of ``logsumexp(h @ W.T)`` holds the float32 logits [tokens, vocab] for the backward and
then builds ``softmax - onehot`` in float32, scales it, and (for 16-bit compute) converts it: several passes
and about 4x the logits' float32 size in fresh memory per step. For the benchmark's tiny Llama (4088
predictions x 32000 vocab) that was 1.8 GB of the 2.3 GB of memory each CPU step faulted in, and the extra
kernel time made bf16 steps alternate between 2.0 and 3.1 s.

Here the work goes by chunks of positions (all batch rows at once, so a batch sharding is kept):

- forward, per chunk: the float32 logits of the chunk, their logsumexp, the target logit, and, when
  ``keep_probs``, the softmax in the compute dtype (the one [tokens, vocab] residual) and the target's
  probability in float32;
- backward, per chunk: ``d logits = (g_nll + g_lse) * p - g_nll * onehot`` in one pass straight into the
  compute dtype (the target column from the float32 probability, so ``p_t - 1`` keeps its precision),
  then ``d hidden = d logits @ W`` and ``d W += d logits.T @ hidden`` accumulated in float32.

Without ``keep_probs`` the backward recomputes each chunk's logits from ``hidden`` and the saved logsumexp
(one more vocab-sized matmul) and nothing of size [tokens, vocab] outlives a chunk: the memory-bounded mode
that ``loss_chunk_tokens`` selects.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ._matmul import barrier, matmul

# Automatic chunking: chunks of about this many bytes of float32 logits (for the whole batch). On the CPU path
# never more than _MAX_AUTO_CHUNKS of them: each chunk adds a read-modify-write of the float32 [D, V] weight
# gradient, so many small chunks would cost more than the memory they save there, and batches whose logits
# exceed _MAX_AUTO_CHUNKS x the budget should set `loss_chunk_tokens`. The XLA/TPU paths recompute each
# chunk's logits in the backward and take as many chunks as the budget needs: an accelerator's memory, not
# the extra pass over the weight gradient, is what runs out (16 x 2048 tokens of a 128k vocabulary are 16 GiB
# of float32 logits).
_AUTO_CHUNK_BYTES = 128 << 20
_MAX_AUTO_CHUNKS = 8


def auto_chunk_positions(
    batch: int, positions: int, vocab: int, *, max_chunks: int | None = _MAX_AUTO_CHUNKS
) -> int:
    """Positions per chunk: chunks of about 128 MiB of float32 logits [batch * chunk, vocab], at most
    ``max_chunks`` of them (None: no limit)."""
    total = batch * positions * vocab * 4
    n = max(1, -(-total // _AUTO_CHUNK_BYTES))
    if max_chunks is not None:
        n = min(max_chunks, n)
    return balanced_chunk(positions, -(-positions // n))


def balanced_chunk(positions: int, chunk: int) -> int:
    """The smallest chunk giving the same number of chunks as ``chunk``: the last one is not mostly padding."""
    n = -(-positions // max(1, min(chunk, positions)))
    return -(-positions // n)


def _to_chunks(x: jax.Array, chunk: int) -> jax.Array:
    """[B, T, ...] -> [T_pad / chunk, B, chunk, ...], zero-padded along T."""
    b, t = x.shape[:2]
    pad = (-t) % chunk
    if pad:
        x = jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2))
    return jnp.swapaxes(x.reshape(b, -1, chunk, *x.shape[2:]), 0, 1)


def _from_chunks(y: jax.Array, t: int) -> jax.Array:
    """Inverse of ``_to_chunks``: [n, B, chunk, ...] -> [B, t, ...]."""
    y = jnp.swapaxes(y, 0, 1)
    return y.reshape(y.shape[0], -1, *y.shape[3:])[:, :t]


def _store(x: jax.Array) -> jax.Array:
    """16-bit floats travel into, through and out of the scans as same-width integers.

    XLA:CPU's float normalization has no 16-bit dynamic-update-slice: a scan stacking bf16 outputs converts
    the whole stacked buffer to float32 and back around every update. Bit-casting to uint16 moves the same
    bytes with no conversion at all.
    """
    if jnp.issubdtype(x.dtype, jnp.floating) and x.dtype.itemsize == 2:
        return jax.lax.bitcast_convert_type(x, jnp.uint16)
    return x


def _load(x: jax.Array, dtype: jnp.dtype) -> jax.Array:
    return jax.lax.bitcast_convert_type(x, dtype) if x.dtype == jnp.uint16 and dtype != jnp.uint16 else x


def _logits(h: jax.Array, head: jax.Array) -> jax.Array:
    """float32 logits [rows, V] of a chunk h [..., D] (all leading axes flattened) against head [V, D]."""
    return matmul(h.reshape(-1, h.shape[-1]), head, transpose_b=True, out_dtype=jnp.float32, kernels="cpu")


def _chunk_stats(h: jax.Array, head: jax.Array, tgt: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    logits = _logits(h, head)
    lse = jax.nn.logsumexp(logits, axis=-1)
    target_logit = jnp.take_along_axis(logits, tgt.reshape(-1, 1), axis=-1)[:, 0]
    return logits, lse, target_logit


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _xent(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk: int, keep_probs: bool
) -> tuple[jax.Array, jax.Array]:
    return _xent_fwd(hidden, head, targets, chunk, False)[0]


def _xent_fwd(hidden, head, targets, chunk, keep_probs):
    b, t, _ = hidden.shape
    head_c = head.astype(hidden.dtype)

    def body(_, xs):
        h, tgt = _load(xs[0], hidden.dtype), xs[1]
        logits, lse, tl = _chunk_stats(h, head_c, tgt)
        out = {"nll": lse - tl, "lse": lse}
        if keep_probs:
            out["p"] = _store(jnp.exp(logits - lse[:, None]).astype(hidden.dtype))
            out["p_t"] = jnp.exp(tl - lse)
        return None, out

    _, o = jax.lax.scan(body, None, (_store(_to_chunks(hidden, chunk)), _to_chunks(targets, chunk)))
    nll = _from_chunks(o["nll"].reshape(-1, b, chunk), t)
    lse = _from_chunks(o["lse"].reshape(-1, b, chunk), t)
    res = (hidden, head, targets, o["lse"], o.get("p"), o.get("p_t"))
    return (nll, lse), res


def _xent_bwd(chunk, keep_probs, res, cotangents):
    hidden, head, targets, lse_c, p_c, pt_c = res
    g_nll, g_lse = cotangents
    b, t, d = hidden.shape
    dtype = hidden.dtype
    head_c = head.astype(dtype)
    g_nll_c = _to_chunks(g_nll.astype(jnp.float32), chunk).reshape(-1, b * chunk)
    g_lse_c = _to_chunks(g_lse.astype(jnp.float32), chunk).reshape(-1, b * chunk)
    # hidden^T per chunk, [n, D, B * chunk], built before the loop: XLA:CPU's fast 16-bit GEMMs need
    # row-major operands, and a transpose inside the loop would only relabel the layout. With it the head's
    # weight gradient is the canonical product hidden^T [D, c] @ d_logits [c, V], accumulated as [D, V].
    h_c = _to_chunks(hidden, chunk).reshape(-1, b * chunk, d)
    # On CPU the barriers keep XLA from folding these transposes into the products when the loop has a
    # single trip and is inlined: XLA:CPU has no fallback for a transposed bf16 x bf16 -> f32 product.
    ht_c = barrier(jnp.swapaxes(h_c, 1, 2))
    tgt_c = _to_chunks(targets, chunk).reshape(-1, b * chunk)

    def body(dw_t, xs):
        ht, tgt, gn, gl, lse = _load(xs[0], dtype), xs[1], xs[2], xs[3], xs[4]
        if keep_probs:
            p = _load(xs[5], dtype).astype(jnp.float32)
            p_t = xs[6]
        else:  # recompute this chunk's logits from its hidden states and the saved log-partition
            p = jnp.exp(_logits(_load(xs[5], dtype), head_c) - lse[:, None])
            p_t = jnp.take_along_axis(p, tgt[:, None], axis=-1)[:, 0]
        coef = gn + gl
        onehot = jnp.arange(p.shape[-1], dtype=jnp.int32)[None, :] == tgt.astype(jnp.int32)[:, None]
        dlogits = jnp.where(onehot, (coef * p_t - gn)[:, None], coef[:, None] * p).astype(dtype)
        dh = matmul(dlogits, head_c, out_dtype=dtype, kernels="cpu")
        dw_t = dw_t + matmul(ht, dlogits, out_dtype=jnp.float32, kernels="cpu")
        return dw_t, _store(dh.reshape(b, chunk, d))

    common = (_store(ht_c), tgt_c, g_nll_c, g_lse_c, lse_c)
    xs = (*common, p_c, pt_c) if keep_probs else (*common, _store(h_c))
    dw_t, dh = jax.lax.scan(body, jnp.zeros((d, head.shape[0]), jnp.float32), xs)
    return _from_chunks(_load(dh, dtype), t), barrier(dw_t).T.astype(head.dtype), None


_xent.defvjp(_xent_fwd, _xent_bwd)


def _plain_xent(
    hidden: jax.Array, head: jax.Array, targets: jax.Array, chunk: int
) -> tuple[jax.Array, jax.Array]:
    """The "xla" kernel path: chunks by ``lax.map``, plain autodiff, each chunk's logits recomputed in the
    backward (``jax.checkpoint``), so nothing of size [tokens, vocab] outlives a chunk."""
    b, t, d = hidden.shape

    @jax.checkpoint
    def one(xs: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        h, tgt = xs
        # The head is cast inside the chunk, so its gradient is accumulated across chunks in its own dtype.
        logits = matmul(h.reshape(-1, d), head.astype(h.dtype), transpose_b=True, out_dtype=jnp.float32)
        lse = jax.nn.logsumexp(logits, axis=-1)
        return lse - jnp.take_along_axis(logits, tgt.reshape(-1, 1), axis=-1)[:, 0], lse

    nll, lse = jax.lax.map(one, (_to_chunks(hidden, chunk), _to_chunks(targets, chunk)))
    return _from_chunks(nll.reshape(-1, b, chunk), t), _from_chunks(lse.reshape(-1, b, chunk), t)


def output_cross_entropy(
    hidden: jax.Array,
    head: jax.Array,
    targets: jax.Array,
    *,
    chunk_positions: int | None = None,
    keep_probs: bool = True,
    kernels: str = "xla",
) -> tuple[jax.Array, jax.Array]:
    """Negative log-likelihoods and log-partitions, float32[B, T], of ``targets`` under ``hidden @ head.T``.

    Args:
        hidden: [B, T, D] final hidden states in the compute dtype (the matmuls' operand dtype).
        head: [V, D] output embedding (any float dtype; cast to ``hidden``'s for the matmuls, and its
            gradient is accumulated in float32 and returned in ``head``'s dtype).
        targets: int[B, T] target ids in [0, V).
        chunk_positions: positions per chunk (all batch rows together), evened out so the last chunk is not
            mostly padding; None: chunks of about 128 MiB of float32 logits for the whole batch (at most 8 on
            the CPU path).
        keep_probs: keep the softmax (compute dtype) for the backward; False recomputes each chunk's logits
            in the backward instead, so no [B*T, V] array is ever held. The "xla" path always recomputes.
        kernels: ``"cpu"``: the hand-written backward described in the module docstring; ``"xla"``: plain
            autodiff of chunked, rematerialised logits (see ``schooner.model._kernels``).
    """
    b, t, _ = hidden.shape
    if chunk_positions is not None and (not isinstance(chunk_positions, int) or chunk_positions < 1):
        raise ValueError(f"chunk_positions must be an int >= 1 or None, got {chunk_positions!r}")
    if t == 0:
        empty = jnp.zeros((b, 0), jnp.float32)
        return empty, empty
    if chunk_positions is None:
        cap = _MAX_AUTO_CHUNKS if kernels == "cpu" else None
        chunk = auto_chunk_positions(b, t, head.shape[0], max_chunks=cap)
    else:
        chunk = chunk_positions
    chunk = balanced_chunk(t, chunk)
    if kernels == "cpu":
        return _xent(hidden, head, targets, chunk, keep_probs)
    return _plain_xent(hidden, head, targets, chunk)
