"""The environment defaults of started processes (`schooner.cluster.worker_env_defaults`)."""

from __future__ import annotations

import sys

import pytest

from schooner.cluster import hugepages_enabled, worker_env_defaults

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables are Linux-only")


@linux
def test_hugetlb_is_added_and_other_tunables_are_kept():
    assert worker_env_defaults({}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    got = worker_env_defaults({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
    assert got == {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1"}
    assert hugepages_enabled(got) and not hugepages_enabled({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})


@linux
@pytest.mark.parametrize(
    "env",
    [
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"},  # an explicit choice wins
        {"GLIBC_TUNABLES": "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=2"},
        {"SCHOONER_HUGEPAGES": "0"},  # the opt-out
    ],
)
def test_explicit_settings_and_the_opt_out_are_respected(env):
    assert worker_env_defaults(env) == {}


def test_hugepages_enabled_reads_the_tunable_value():
    assert not hugepages_enabled({})
    assert not hugepages_enabled({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert hugepages_enabled({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"})
