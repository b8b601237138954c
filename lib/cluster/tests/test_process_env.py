"""glibc malloc settings of started processes (`worker_env_defaults`, `malloc_tuned`)."""

from __future__ import annotations

import sys

import pytest

from schooner.cluster import malloc_tuned, worker_env_defaults

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables are Linux-only")


@linux
def test_tunables_are_added_and_other_tunables_are_kept():
    assert worker_env_defaults({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    got = worker_env_defaults({"GLIBC_TUNABLES": "glibc.rtld.nns=4"})
    assert got == {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.hugetlb=1"}
    assert malloc_tuned(got)
    assert not malloc_tuned({"GLIBC_TUNABLES": "glibc.rtld.nns=4"})


@linux
@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},  # an explicit malloc choice wins
        {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.arena_max=2"},
        {"SCHOONER_MALLOC_TUNING": "0"},  # the opt-out
    ],
)
def test_explicit_settings_and_the_opt_out_are_respected(env):
    assert worker_env_defaults(env) == {}


def test_malloc_tuned_reads_the_values():
    assert not malloc_tuned({})
    assert not malloc_tuned({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert malloc_tuned({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"})
