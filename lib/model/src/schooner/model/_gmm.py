"""A grouped matmul for the experts on a GPU: a Pallas Triton kernel over rows sorted by expert.

``jax.lax.ragged_dot`` is lowered on a GPU (jax 0.10-0.11) to zero-padded dense products, about E/k times the
experts' FLOPs. This kernel computes only the groups' own rows: the rows (already sorted by expert, as
``_moe.py`` sorts them) are laid out so that each group starts on a multiple of the row tile ``block_m``
(zero rows fill each group's last tile: at most ``groups * (block_m - 1)`` extra rows), so every row tile
belongs to one group, and a tile's product reads that group's weights only:

- forward, ``y = x @ w[g]``: grid (row tiles, column tiles), a float32 accumulator over ``k`` blocks;
- ``dx = dy @ w[g]^T``: the same kernel with the weights read transposed;
- ``dw[g] = x[rows of g]^T @ dy[rows of g]``: grid (groups, k tiles, n tiles), each program looping over its
  group's row tiles (no tiles for an empty group: its gradient is 0).

Rows move into and out of the tiled layout by gathers only (padding rows read an appended zero row), so the
backward has no scatter. Same results as :func:`jax.lax.ragged_dot` up to float rounding (float32
accumulation, output in the operands' dtype). Off a GPU the kernels run through Pallas's interpreter: that is
how the CPU tests check them (``tests/test_gmm.py``); on a TPU they are refused (``_kernels.triton_interpret``).
"""

from __future__ import annotations

import functools
import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

BLOCK_M = 128
"""Row tile: each group's rows are padded to a multiple of it."""


class TiledLayout(NamedTuple):
    """Where the ``m`` sorted rows sit in the tiled layout of ``padded_rows`` rows (``padded_rows // block_m``
    tiles).

    Attributes:
        source: int32[padded_rows], the sorted row each tiled row reads, ``m`` (an appended zero row) for the
            padding rows.
        dest: int32[m], the tiled row of each sorted row.
        tile_group: int32[tiles], the group of each tile (the last group for tiles past the used ones).
        group_tiles: int32[groups + 1], the first tile of each group, then the number of used tiles.
    """

    source: jax.Array
    dest: jax.Array
    tile_group: jax.Array
    group_tiles: jax.Array


def padded_rows(m: int, groups: int, block_m: int = BLOCK_M) -> int:
    """The static row count of the tiled layout: enough for any split of ``m`` rows into ``groups`` groups."""
    return (math.ceil(m / block_m) + groups) * block_m


def tiled_layout(group_sizes: jax.Array, m: int, block_m: int = BLOCK_M) -> TiledLayout:
    """The tiled layout of ``m`` rows sorted into consecutive groups of ``group_sizes`` (int32[groups],
    summing to ``m``): each group starts on a multiple of ``block_m``."""
    groups = group_sizes.shape[0]
    sizes = group_sizes.astype(jnp.int32)
    tiles = (sizes + block_m - 1) // block_m
    group_tiles = jnp.concatenate([jnp.zeros((1,), jnp.int32), jnp.cumsum(tiles, dtype=jnp.int32)])
    starts = jnp.cumsum(sizes) - sizes  # first sorted row of each group
    total = padded_rows(m, groups, block_m)
    tile_index = jnp.arange(total // block_m, dtype=jnp.int32)
    tile_group = jnp.clip(jnp.searchsorted(group_tiles[1:], tile_index, side="right"), 0, groups - 1)
    row = jnp.arange(total, dtype=jnp.int32)
    g = tile_group[row // block_m]
    within = row - group_tiles[g] * block_m
    source = jnp.where(within < sizes[g], starts[g] + within, m).astype(jnp.int32)
    sorted_row = jnp.arange(m, dtype=jnp.int32)
    sorted_group = jnp.clip(jnp.searchsorted(jnp.cumsum(sizes), sorted_row, side="right"), 0, groups - 1)
    dest = (group_tiles[sorted_group] * block_m + sorted_row - starts[sorted_group]).astype(jnp.int32)
    return TiledLayout(source, dest, tile_group.astype(jnp.int32), group_tiles)


def _to_tiles(x: jax.Array, layout: TiledLayout) -> jax.Array:
    return jnp.concatenate([x, jnp.zeros((1, x.shape[1]), x.dtype)])[layout.source]


def _block(size: int, choices: tuple[int, ...]) -> int | None:
    return next((b for b in choices if size % b == 0), None)


def supported(k: int, n: int) -> bool:
    """Whether the kernel takes [m, k] x [groups, k, n] (both dims multiples of 16, Triton's smallest dot)."""
    return _block(k, (64, 32, 16)) is not None and _block(n, (128, 64, 32, 16)) is not None


def _compiler_params(num_warps: int, num_stages: int) -> Any:
    from jax.experimental.pallas import triton as pltriton

    return pltriton.CompilerParams(num_warps=num_warps, num_stages=num_stages)


def _tile_product(
    tile_group: jax.Array, x: jax.Array, w: jax.Array, *, transpose_w: bool, block_m: int, interpret: bool
) -> jax.Array:
    """[rows, k] (tiled layout) x per-tile w[group] ([groups, k, n], or [groups, n, k] read transposed)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    rows, k = x.shape
    n = w.shape[1] if transpose_w else w.shape[2]
    bm, bk, bn = block_m, _block(k, (64, 32, 16)), _block(n, (128, 64, 32, 16))
    assert bk is not None and bn is not None, (k, n)

    def kernel(tile_group_ref, x_ref, w_ref, o_ref):  # noqa: ANN001, ANN202 - refs
        i, j = pl.program_id(0), pl.program_id(1)
        g = tile_group_ref[i]
        r0, c0 = i * bm, j * bn

        def body(step, acc):  # noqa: ANN001, ANN202
            k0 = pl.multiple_of(step * bk, bk)
            a = x_ref[pl.ds(r0, bm), pl.ds(k0, bk)]
            if transpose_w:
                return acc + pltriton.dot(a, w_ref[g, pl.ds(c0, bn), pl.ds(k0, bk)], trans_b=True)
            return acc + pltriton.dot(a, w_ref[g, pl.ds(k0, bk), pl.ds(c0, bn)])

        acc = jax.lax.fori_loop(0, k // bk, body, jnp.zeros((bm, bn), jnp.float32))
        o_ref[pl.ds(r0, bm), pl.ds(c0, bn)] = acc.astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(rows // bm, n // bn),
        out_shape=jax.ShapeDtypeStruct((rows, n), x.dtype),
        compiler_params=None if interpret else _compiler_params(8, 3),
        interpret=interpret,
        name="schooner_gmm",
    )(tile_group, x, w)


def _group_product(
    group_tiles: jax.Array, x: jax.Array, dy: jax.Array, *, block_m: int, interpret: bool
) -> jax.Array:
    """dw[g] = x[tiles of g]^T @ dy[tiles of g]: [rows, k], [rows, n] (tiled layout) -> [groups, k, n]."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import triton as pltriton

    k, n = x.shape[1], dy.shape[1]
    groups = group_tiles.shape[0] - 1
    bm, bk, bn = block_m, _block(k, (64, 32, 16)), _block(n, (64, 32, 16))
    assert bk is not None and bn is not None, (k, n)

    def kernel(group_tiles_ref, x_ref, dy_ref, o_ref):  # noqa: ANN001, ANN202 - refs
        g, kb, nb = pl.program_id(0), pl.program_id(1), pl.program_id(2)
        k0, n0 = kb * bk, nb * bn

        def body(t, acc):  # noqa: ANN001, ANN202
            r0 = pl.multiple_of(t * bm, bm)
            a = x_ref[pl.ds(r0, bm), pl.ds(k0, bk)]
            b = dy_ref[pl.ds(r0, bm), pl.ds(n0, bn)]
            return acc + pltriton.dot(a, b, trans_a=True)

        first, end = group_tiles_ref[g], group_tiles_ref[g + 1]
        acc = jax.lax.fori_loop(first, end, body, jnp.zeros((bk, bn), jnp.float32))
        o_ref[g, pl.ds(k0, bk), pl.ds(n0, bn)] = acc.astype(o_ref.dtype)

    return pl.pallas_call(
        kernel,
        grid=(groups, k // bk, n // bn),
        out_shape=jax.ShapeDtypeStruct((groups, k, n), x.dtype),
        compiler_params=None if interpret else _compiler_params(4, 3),
        interpret=interpret,
        name="schooner_gmm_dw",
    )(group_tiles, x, dy)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _gmm(x: jax.Array, w: jax.Array, group_sizes: jax.Array, block_m: int, interpret: bool) -> jax.Array:
    layout = tiled_layout(group_sizes, x.shape[0], block_m)
    tiles = _to_tiles(x, layout)
    y = _tile_product(layout.tile_group, tiles, w, transpose_w=False, block_m=block_m, interpret=interpret)
    return y[layout.dest]


def _gmm_fwd(
    x: jax.Array, w: jax.Array, group_sizes: jax.Array, block_m: int, interpret: bool
) -> tuple[jax.Array, tuple]:
    return _gmm(x, w, group_sizes, block_m, interpret), (x, w, group_sizes)


def _gmm_bwd(block_m: int, interpret: bool, res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array, None]:
    x, w, group_sizes = res
    layout = tiled_layout(group_sizes, x.shape[0], block_m)
    dy_tiles = _to_tiles(dy.astype(x.dtype), layout)
    dx = _tile_product(
        layout.tile_group, dy_tiles, w, transpose_w=True, block_m=block_m, interpret=interpret
    )[layout.dest]
    dw = _group_product(
        layout.group_tiles, _to_tiles(x, layout), dy_tiles, block_m=block_m, interpret=interpret
    )
    return dx, dw.astype(w.dtype), None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def triton_grouped_matmul(
    x: jax.Array, w: jax.Array, group_sizes: jax.Array, *, interpret: bool, block_m: int = BLOCK_M
) -> jax.Array:
    """``x[rows of group g] @ w[g]`` for consecutive groups of rows, [m, k] x [groups, k, n] -> [m, n], by the
    Pallas Triton kernels of this module (``interpret``: through Pallas's interpreter, for CPU tests).

    ``group_sizes`` (int32[groups]) must sum to ``m``; ``x`` and ``w`` share a dtype; ``k`` and ``n`` are
    multiples of 16 (:func:`supported`); ``block_m`` (a power of 2, at least 16) is the row tile. Differentiable
    in ``x`` and ``w``.
    """
    if x.ndim != 2 or w.ndim != 3 or x.shape[1] != w.shape[1] or group_sizes.shape != (w.shape[0],):
        raise ValueError(
            "triton_grouped_matmul needs x [m, k], w [groups, k, n], group_sizes [groups]; got "
            f"x{list(x.shape)}, w{list(w.shape)}, group_sizes{list(group_sizes.shape)}."
        )
    if not supported(x.shape[1], w.shape[2]):
        raise ValueError(
            f"triton_grouped_matmul needs k and n multiples of 16; got k={x.shape[1]}, n={w.shape[2]}."
        )
    if block_m < 16 or block_m & (block_m - 1):
        raise ValueError(f"block_m must be a power of 2 >= 16; got {block_m=}.")
    return _gmm(x, w.astype(x.dtype), group_sizes, block_m, interpret)
