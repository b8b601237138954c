"""glibc malloc settings for the processes the cluster layer starts (LocalClient workers, Ray workers).

XLA's CPU runtime allocates each execution's temporary buffers afresh, and glibc serves allocations over its
mmap threshold (at most 32 MiB) with new mappings that are unmapped again on free, so every page of them
faults on first touch, step after step. On the train benchmark's tiny Llama (2 cores) that was about 560,000
minor faults and 1.2 s of kernel time per 3.1 s step. glibc reads its tunables once, when a process starts,
so they have to be in the environment of the process that runs the work; hence they are set here.

* Every worker starts with ``glibc.malloc.hugetlb=1``: large mappings get transparent huge pages
  (``madvise``), 512x fewer faults. Harmless for other work.
* Processes whose work is XLA on CPU (``train_lm`` jobs; see :func:`xla_process_env`) start with
  ``mmap_max=0:arena_max=1:trim_threshold=16 GiB`` instead: every allocation comes from the main heap and
  freed memory stays there for the next step, so after the first step nothing faults at all. Measured on the
  benchmark's bf16 run over 21 steps: huge pages alone alternate between 2.0 s and 3.2 s steps (the kernel
  zeroing and compacting fresh huge pages); the heap keeps every step at 2.0 s. The price is that the
  process keeps its peak memory until it exits, which is why only dedicated job processes get it (a
  LocalClient job with its own environment runs in a fresh worker that exits after the job).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

MALLOC_TUNING_ENV = "SCHOONER_MALLOC_TUNING"
"""Set to ``0`` to leave ``GLIBC_TUNABLES`` of started processes alone."""

HUGEPAGES_TUNABLES = ("glibc.malloc.hugetlb=1",)
XLA_TUNABLES = (
    "glibc.malloc.mmap_max=0",
    "glibc.malloc.arena_max=1",
    "glibc.malloc.trim_threshold=17179869184",
)


def _tunables(environ: Mapping[str, str] | None, wanted: tuple[str, ...]) -> dict[str, str]:
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or env.get(MALLOC_TUNING_ENV, "1") == "0":
        return {}
    current = env.get("GLIBC_TUNABLES", "")
    names = {part.split("=", 1)[0] for part in current.split(":") if part}
    if any(name.startswith("glibc.malloc.") for name in names):
        return {}  # the user tuned malloc already: an explicit choice wins
    return {"GLIBC_TUNABLES": ":".join([p for p in current.split(":") if p] + list(wanted))}


def worker_env_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables every started worker gets: ``GLIBC_TUNABLES`` plus ``glibc.malloc.hugetlb=1`` (Linux).

    Empty when not on Linux, when ``SCHOONER_MALLOC_TUNING=0``, or when ``GLIBC_TUNABLES`` already sets a
    ``glibc.malloc.*`` tunable; other tunables already there are kept.

    Example:
        >>> worker_env_defaults({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
        {}
    """
    return _tunables(environ, HUGEPAGES_TUNABLES)


def xla_process_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables for a dedicated process whose work is XLA on CPU: freed memory stays in glibc's heap.

    Give them to a job through ``ResourceConfig.env`` (``train_lm`` does); same conditions as
    :func:`worker_env_defaults`. See the module docstring for the measurements and the memory trade-off.
    """
    return _tunables(environ, XLA_TUNABLES)


def malloc_tuned(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started with huge pages or the XLA heap settings (see the module doc)."""
    env = os.environ if environ is None else environ
    parts = set(env.get("GLIBC_TUNABLES", "").split(":"))
    return "glibc.malloc.mmap_max=0" in parts or bool(
        parts & {"glibc.malloc.hugetlb=1", "glibc.malloc.hugetlb=2"}
    )
