"""Environment the cluster layer gives the processes it starts (LocalClient workers, Ray workers).

Transparent huge pages for large allocations. XLA's CPU runtime allocates each execution's temporary buffers
afresh; glibc serves allocations over its mmap threshold (at most 32 MiB) with new mappings, so every page of
them faults on first touch, step after step. On the train benchmark's tiny Llama (2 cores) that was about
560,000 minor faults and 1.2 s of kernel time per 3.1 s step. With ``glibc.malloc.hugetlb=1`` glibc asks
for transparent huge pages on those mappings (``madvise``; the kernel's THP mode ``madvise`` honours it):
about 10,000 faults and a 2.5 s step. glibc reads the tunable once, when the process starts, so it has to
be in the environment of the process that runs the work; that is why it is set here and not by the trainer.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping

HUGEPAGES_ENV = "SCHOONER_HUGEPAGES"
"""Set to ``0`` to keep the environment of started processes as it is."""

_TUNABLE = "glibc.malloc.hugetlb"


def worker_env_defaults(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Variables to add to the environment of a process the cluster layer starts.

    ``GLIBC_TUNABLES`` gains ``glibc.malloc.hugetlb=1`` (other tunables already there are kept) on Linux,
    unless ``SCHOONER_HUGEPAGES=0`` or the tunable is already set (an explicit choice wins). Empty elsewhere.

    Example:
        >>> worker_env_defaults({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
        {}
    """
    env = os.environ if environ is None else environ
    if not sys.platform.startswith("linux") or env.get(HUGEPAGES_ENV, "1") == "0":
        return {}
    current = env.get("GLIBC_TUNABLES", "")
    if any(part.split("=", 1)[0] == _TUNABLE for part in current.split(":") if part):
        return {}
    return {"GLIBC_TUNABLES": f"{current}:{_TUNABLE}=1" if current else f"{_TUNABLE}=1"}


def hugepages_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether this process was started with ``glibc.malloc.hugetlb`` set to 1 or 2 (see the module doc)."""
    env = os.environ if environ is None else environ
    for part in env.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = part.partition("=")
        if name == _TUNABLE:
            return value in ("1", "2")
    return False
