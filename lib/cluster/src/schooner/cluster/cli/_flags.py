"""The run flags, shared by `schooner run EXP.py` and `StepRunner().main([...])` (`python EXP.py ...`)."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence

from schooner.cluster.runner._options import RunOptions


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The flags shared by `schooner run` and `python exp.py` (their names: `RUN_FLAGS`)."""
    parser.add_argument(
        "--dry-run", action="store_true", help="print the plan (what runs, what is cached); write nothing"
    )
    parser.add_argument(
        "--force",
        action="append",
        default=[],
        metavar="RE",
        help="rerun steps whose name matches RE even if done (repeatable)",
    )
    parser.add_argument(
        "--only",
        action="append",
        default=[],
        metavar="RE",
        help="run only steps whose name matches RE, and the steps they need (repeatable)",
    )
    parser.add_argument(
        "--prefix",
        default=None,
        help="where outputs go (default: $SCHOONER_PREFIX, else "
        "./schooner-output); a local path or an fsspec URL",
    )
    parser.add_argument(
        "--max-concurrent", type=int, default=None, metavar="N", help="run at most N steps at once"
    )
    parser.add_argument(
        "--cluster",
        default=None,
        metavar="SPEC",
        help="'local', 'ray' or a Ray address (sets SCHOONER_CLUSTER for this run); Ray is started or "
        "connected only when a step will run on it",
    )
    parser.add_argument(
        "--shared-prefix",
        action="store_true",
        help="the (local-looking) prefix is shared by every node of the cluster, e.g. an NFS mount",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="print no plan, progress or job output (by default every step's output is streamed)",
    )


def options_from_args(ns: argparse.Namespace) -> RunOptions:
    if ns.max_concurrent is not None and ns.max_concurrent < 1:
        raise SystemExit(f"--max-concurrent must be >= 1, got {ns.max_concurrent}")
    return RunOptions(
        prefix=ns.prefix,
        dry_run=ns.dry_run,
        force=tuple(ns.force),
        only=tuple(ns.only),
        max_concurrent=ns.max_concurrent,
        cluster=ns.cluster,
        quiet=ns.quiet,
        shared_prefix=ns.shared_prefix,
    )


def options_from_argv(argv: Sequence[str]) -> RunOptions | None:
    """Our flags from a script's argv (unknown flags are left to the script); None when there are none."""
    if os.environ.get("SCHOONER_NO_ARGV"):
        return None
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)  # `--pre` is not `--prefix`
    add_run_flags(parser)
    ns, _ = parser.parse_known_args(list(argv))
    opts = options_from_args(ns)
    return opts if opts != RunOptions() else None
