"""Subcommands from other packages (`schooner.commands` entry points): loaded into the `schooner` command,
run with their own arguments; a broken one is skipped with a warning, never breaking the others."""

from __future__ import annotations

import argparse
import subprocess
import sys
from importlib.metadata import EntryPoint

import pytest

from schooner.cluster.cli import _plugins, main


class Hello:
    help = "say hello"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("who")
        parser.add_argument("--times", type=int, default=1)

    @staticmethod
    def run(ns: argparse.Namespace) -> int:
        print(" ".join([f"hello {ns.who}"] * ns.times))
        return 7


HELLO = Hello()


def test_plugin_commands_run_and_broken_ones_are_skipped(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "schooner_test_plugins", sys.modules[__name__])
    eps = [
        EntryPoint("hello", "schooner_test_plugins:HELLO", _plugins.GROUP),
        EntryPoint("broken", "schooner_test_plugins:NOT_THERE", _plugins.GROUP),
        EntryPoint("status", "schooner_test_plugins:HELLO", _plugins.GROUP),  # cannot shadow a built-in
    ]
    monkeypatch.setattr(_plugins, "entry_points", lambda group: [e for e in eps if e.group == group])
    assert main(["hello", "world", "--times", "2"]) == 7
    assert "hello world hello world" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])  # loads every plugin: the broken one is named, the others listed
    out = capsys.readouterr()
    assert "ignoring command 'broken'" in out.err and "say hello" in out.out


def test_only_the_plugin_a_command_needs_is_loaded(monkeypatch, capsys, tmp_path) -> None:
    """Loading a plugin imports its package (schooner-train's imports jax, seconds): a built-in command loads
    none, a plugin's command only its own; help and unknown commands load them all, to list them."""
    monkeypatch.setitem(sys.modules, "schooner_test_plugins", sys.modules[__name__])
    eps = [
        EntryPoint("hello", "schooner_test_plugins:HELLO", _plugins.GROUP),
        EntryPoint("broken", "schooner_test_plugins:NOT_THERE", _plugins.GROUP),  # warns when loaded
    ]
    monkeypatch.setattr(_plugins, "entry_points", lambda group: [e for e in eps if e.group == group])
    prefix = tmp_path / "out"
    prefix.mkdir()
    assert main(["status", "--prefix", str(prefix)]) == 0
    assert main(["hello", "you"]) == 7
    assert "ignoring" not in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["hallo"])  # a typo: the error lists every command
    out = capsys.readouterr()
    assert "ignoring command 'broken'" in out.err and "'hello'" in out.err


def test_a_built_in_command_does_not_import_the_stages(tmp_path) -> None:
    code = (
        "import sys\nfrom schooner.cluster.cli import main\n"
        f"main(['status', '--prefix', {str(tmp_path)!r}])\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['schooner', 'train'], ['schooner', 'data'])))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout
