"""Links and absolute paths that a step writes into its own attempt folder still resolve once the attempt is
published (issue 36: they dangled after the folder was renamed)."""

from __future__ import annotations

import io
import os
from pathlib import Path

from rich.console import Console

from schooner.cluster import StepRunner, step


def writes_links(config: dict, out: str) -> None:
    os.makedirs(os.path.join(out, "ckpt", "step-2"))
    Path(out, "ckpt", "step-2", "weights.bin").write_bytes(b"w2")
    os.symlink(os.path.join(out, "ckpt", "step-2"), os.path.join(out, "ckpt", "latest"))  # absolute
    os.symlink(os.path.join(out, "ckpt"), os.path.join(out, "checkpoints"))
    os.symlink("/etc/hostname", os.path.join(out, "outside"))  # not into the attempt: left as it is
    Path(out, "manifest.txt").write_text(os.path.join(out, "ckpt", "step-2", "weights.bin"))


def _run(prefix: Path, **kw) -> None:
    assert StepRunner(prefix=str(prefix), console=Console(file=io.StringIO())).run([H], **kw).ok


H = step("links", writes_links, {})


def test_links_and_absolute_paths_into_the_attempt_resolve_after_publication(tmp_path: Path) -> None:
    _run(tmp_path)
    out = Path(H.output_path(str(tmp_path)))
    assert (out / "ckpt" / "latest" / "weights.bin").read_bytes() == b"w2"
    assert (out / "checkpoints" / "step-2" / "weights.bin").read_bytes() == b"w2"
    assert not os.path.isabs(os.readlink(out / "ckpt" / "latest"))  # relative: moving the prefix keeps it
    assert os.readlink(out / "outside") == "/etc/hostname"
    assert Path(Path(out / "manifest.txt").read_text()).read_bytes() == b"w2"
    # A forced rerun replaces the output; the new attempt's paths resolve, and no stale link piles up.
    _run(tmp_path, force=["links"])
    assert Path(Path(out / "manifest.txt").read_text()).read_bytes() == b"w2"
    assert (out / "ckpt" / "latest" / "weights.bin").read_bytes() == b"w2"
    assert len([p for p in tmp_path.iterdir() if ".attempt-" in p.name]) == 1
