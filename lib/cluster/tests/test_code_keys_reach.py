"""Step keys see edits to helpers however the step reaches them (issue 36): through a module-level dict, an
import inside the function, a method of a module-level instance, an `lru_cache`-wrapped function. Real files,
keys computed in fresh interpreters, as a user reruns an experiment after an edit."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

HELPERS = textwrap.dedent("""
    import functools


    def via_dict_impl(x):
        return x + 1


    HANDLERS = {"add": via_dict_impl}


    class Tokenizer:
        def encode(self, x):
            return [x, 1]


    TOKENIZER = Tokenizer()


    @functools.lru_cache(maxsize=None)
    def cached_table(n):
        return tuple(range(n))


    def imported_later(x):
        return x * 3
""")

EXPERIMENT = textwrap.dedent("""
    from helpers import HANDLERS, TOKENIZER, cached_table


    def uses_dict(config, out):
        return HANDLERS["add"](config)


    def uses_local_import(config, out):
        from helpers import imported_later

        return imported_later(config)


    def uses_module_import(config, out):
        import helpers

        return helpers.imported_later(config)


    def uses_instance(config, out):
        return TOKENIZER.encode(config)


    def uses_cached(config, out):
        return cached_table(config)
""")

KEYS = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import exp
    from schooner.cluster import step
    names = ["uses_dict", "uses_local_import", "uses_module_import", "uses_instance", "uses_cached"]
    print(json.dumps({n: step(n, getattr(exp, n), 1).key for n in names}))
""")

EDITS = {
    "uses_dict": ("return x + 1", "return x + 2"),
    "uses_instance": ("return [x, 1]", "return [x, 2]"),
    "uses_cached": ("tuple(range(n))", "tuple(range(n + 1))"),
    "imported": ("return x * 3", "return x * 4"),
}


def _keys(folder: Path) -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-c", KEYS, str(folder)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_an_edit_to_a_helper_reached_any_way_changes_only_the_keys_that_reach_it(tmp_path: Path) -> None:
    (tmp_path / "exp.py").write_text(EXPERIMENT)
    (tmp_path / "helpers.py").write_text(HELPERS)
    before = _keys(tmp_path)
    assert _keys(tmp_path) == before  # nothing edited: the same keys in a fresh interpreter
    for what, (old, new) in EDITS.items():
        (tmp_path / "helpers.py").write_text(HELPERS.replace(old, new))
        after = _keys(tmp_path)
        changed = {n for n in before if before[n] != after[n]}
        expected = {"uses_local_import", "uses_module_import"} if what == "imported" else {what}
        assert changed == expected, (what, changed)


EDIT_DURING_RUN = textwrap.dedent("""
    import sys
    sys.path.insert(0, sys.argv[1])
    import helpers
    from schooner.cluster import LocalClient, ResourceConfig, StepRunner, step


    def compute(config, out):
        return helpers.imported_later(config)


    h = step("compute", compute, 2, resources=ResourceConfig.with_cpu())
    h.key  # the key is computed from the helper as it is now; then the helper is edited
    text = open(sys.argv[1] + "/helpers.py").read()
    open(sys.argv[1] + "/helpers.py", "w").write(text.replace("return x * 3", "return x * 4"))
    client = LocalClient(max_workers=1)
    try:
        result = StepRunner(sys.argv[2], client=client).run([h], raise_on_failure=False)
    finally:
        client.shutdown()
    print("STATE", result[h].state, result[h].result)
    print("ERROR", result[h].error_line())
""")


def test_a_worker_does_not_run_code_edited_after_its_key_was_computed(tmp_path: Path) -> None:
    """A worker imports the helper files as they are when the step starts: edited since the key was
    computed, the step fails naming the file, rather than storing the new code's result under the old key
    (served as cached after the edit is reverted)."""
    (tmp_path / "helpers.py").write_text(HELPERS)
    script = tmp_path / "run.py"
    script.write_text(EDIT_DURING_RUN)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert "STATE failed None" in done.stdout, done.stdout + done.stderr
    assert "helpers.py changed" in done.stdout and "rerun" in done.stdout, done.stdout
