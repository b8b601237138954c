"""glibc malloc settings of training jobs (`malloc_env`, `malloc_tuned`)."""

from __future__ import annotations

import sys

import pytest

from schooner.train import malloc_env, malloc_tuned

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc tunables are Linux-only")


@linux
def test_tunables_are_added_and_other_tunables_are_kept():
    assert malloc_env({}, base={}) == {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"}
    got = malloc_env({}, base={"GLIBC_TUNABLES": "glibc.rtld.nns=4"})
    assert got == {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.hugetlb=1"}
    # The job's own GLIBC_TUNABLES replace the inherited ones.
    got = malloc_env({"GLIBC_TUNABLES": "glibc.rtld.nns=2"}, base={"GLIBC_TUNABLES": "glibc.rtld.nns=4"})
    assert got == {"GLIBC_TUNABLES": "glibc.rtld.nns=2:glibc.malloc.hugetlb=1"}
    assert malloc_tuned(got)
    assert not malloc_tuned({"GLIBC_TUNABLES": "glibc.rtld.nns=4"})


@linux
@pytest.mark.parametrize(
    ("env", "base"),
    [
        ({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}, {}),  # an explicit malloc choice wins
        ({}, {"GLIBC_TUNABLES": "glibc.rtld.nns=4:glibc.malloc.arena_max=2"}),
        ({}, {"SCHOONER_MALLOC_TUNING": "0"}),  # the opt-out, where the experiment is built
        ({"SCHOONER_MALLOC_TUNING": "0"}, {}),  # or in the job's own environment
    ],
)
def test_explicit_settings_and_the_opt_out_are_respected(env, base):
    assert malloc_env(env, base=base) == {}


def test_malloc_tuned_reads_the_values():
    assert not malloc_tuned({})
    assert not malloc_tuned({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"})
    assert malloc_tuned({"GLIBC_TUNABLES": "glibc.malloc.hugetlb=2"})


def test_nothing_outside_linux(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert malloc_env({}, base={}) == {}
