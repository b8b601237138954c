"""Building many handles of one function reads its bytecode once per process (the rerun of a 300-step
experiment spent most of its time disassembling the same function 300 times), while a key still sees every
change: a global rebound to another function, a helper edited on disk and imported afresh, a closure value.
"""

from __future__ import annotations

import dis
import importlib
import sys
import textwrap
import time

import pytest

from schooner.cluster import code_fingerprint


def _helper(x):
    return x + 1


def _other_helper(x):
    return x - 1


HELPER = _helper


def _step_fn(config, output_path):
    import json  # an import inside the function: followed for user modules, named for libraries

    return json.dumps(HELPER(config))


@pytest.fixture
def count_disassembly(monkeypatch):
    calls = [0]
    real = dis.get_instructions

    def counting(*args, **kwargs):
        calls[0] += 1
        return real(*args, **kwargs)

    monkeypatch.setattr(dis, "get_instructions", counting)
    return calls


def test_a_function_is_disassembled_once_per_process(count_disassembly):
    first = code_fingerprint(_step_fn)
    before = count_disassembly[0]
    for _ in range(50):
        assert code_fingerprint(_step_fn) == first
    assert count_disassembly[0] == before, (
        f"{count_disassembly[0] - before} disassemblies for 50 fingerprints of unchanged code"
    )


def test_a_global_rebound_at_run_time_still_changes_the_key(monkeypatch):
    before = code_fingerprint(_step_fn)
    monkeypatch.setitem(globals(), "HELPER", _other_helper)
    assert code_fingerprint(_step_fn) != before
    monkeypatch.setitem(globals(), "HELPER", _helper)
    assert code_fingerprint(_step_fn) == before


def test_a_closure_value_still_changes_the_key():
    def make(n):
        def fn(config, output_path):
            return config + n

        return fn

    assert code_fingerprint(make(1)) != code_fingerprint(make(2))
    assert code_fingerprint(make(1)) == code_fingerprint(make(1))


def test_a_helper_edited_on_disk_and_imported_afresh_changes_the_key(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    path = tmp_path / "cache_helpers_mod.py"
    path.write_text(
        textwrap.dedent("""
        def helper(x):
            return x * 2

        def fn(config, output_path):
            return helper(config)
    """)
    )
    mod = importlib.import_module("cache_helpers_mod")
    before = code_fingerprint(mod.fn)
    time.sleep(0.01)
    path.write_text(path.read_text().replace("x * 2", "x * 3"))
    mod = importlib.reload(mod)
    try:
        assert code_fingerprint(mod.fn) != before
    finally:
        sys.modules.pop("cache_helpers_mod", None)
