"""The subcommands schooner-data adds to the `schooner` command (entry points `schooner.commands`).

Kept light to import: the `schooner` command loads this module to build its parser; the page's code is
imported when the command runs.
"""

from __future__ import annotations

import argparse


class _Browse:
    help = "a static HTML page of a record folder: samples, attributes, and what a filter dropped"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("path", help="a record folder (or one shard file)")
        parser.add_argument(
            "--out",
            default=None,
            metavar="FILE",
            help="default browse-<folder name>.html in the working directory",
        )
        parser.add_argument("--sample", type=int, default=25, help="records shown per section")

    @staticmethod
    def run(ns: argparse.Namespace) -> int:
        from .curation.browse import write_browse

        print(f"page written to {write_browse(ns.path, ns.out, sample=ns.sample)}")
        return 0


BROWSE = _Browse()
