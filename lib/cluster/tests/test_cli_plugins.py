"""Subcommands from other packages (`schooner.commands` entry points): loaded into the `schooner` command,
run with their own arguments; a broken one is skipped with a warning, never breaking the others."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import EntryPoint

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
    out = capsys.readouterr()
    assert "hello world hello world" in out.out
    assert "ignoring command 'broken'" in out.err
