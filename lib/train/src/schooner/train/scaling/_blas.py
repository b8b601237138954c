"""One BLAS thread while fitting: the fits make thousands of tiny LAPACK calls (L-BFGS-B's updates, 3x3
solves), and a multi-threaded OpenBLAS wakes its threads for each, which on a busy machine made approach 3
about ten times slower than on one thread (measured on the 2-core development machine)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator


@contextlib.contextmanager
def single_threaded_blas() -> Iterator[None]:
    """Limit the BLAS libraries loaded by numpy and scipy to one thread inside the block."""
    import scipy.optimize  # noqa: F401  (loads scipy's own OpenBLAS, so the limit reaches it too)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield
