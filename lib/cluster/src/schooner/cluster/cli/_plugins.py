"""Subcommands of the `schooner` command that other packages provide, found through entry points.

A package declares, in its pyproject, `[project.entry-points."schooner.commands"] NAME = "module:OBJECT"`,
where OBJECT has `help: str`, `add_arguments(parser) -> None` and `run(namespace) -> int` (the exit status).
The module named must stay light to import (the `schooner` command loads it to build its parser); heavy
imports belong inside `run`. The cluster package never imports the stages: `schooner browse` (a record
folder's page) comes from schooner-data this way.
"""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import entry_points
from typing import Any

GROUP = "schooner.commands"


def add_plugin_parsers(sub: argparse._SubParsersAction, command: str | None = None) -> dict[str, Any]:
    """A subparser per installed plugin command; `{name: plugin}`. A plugin that fails to load is skipped
    with a one-line warning (the other commands still work).

    `command` (the command line's first word) limits the loading to what it needs: none for a built-in
    command, only that plugin for a plugin's name, all of them otherwise (`--help`, a typo). Loading a
    plugin imports its package (schooner-train's imports jax: seconds before `schooner run` could start)."""
    found: dict[str, Any] = {}
    if command in sub.choices:
        return found
    eps = sorted(entry_points(group=GROUP), key=lambda e: e.name)
    if any(ep.name == command for ep in eps):
        eps = [ep for ep in eps if ep.name == command]
    for ep in eps:
        if ep.name in sub.choices:
            continue  # the built-in commands win
        try:
            plugin = ep.load()
            parser = sub.add_parser(ep.name, help=plugin.help)
            plugin.add_arguments(parser)
        except Exception as e:  # noqa: BLE001 - one broken plugin must not break the command
            print(f"schooner: ignoring command {ep.name!r} from {ep.value}: {e}", file=sys.stderr)
            continue
        found[ep.name] = plugin
    return found
