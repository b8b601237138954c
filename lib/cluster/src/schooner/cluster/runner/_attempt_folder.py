"""Before a step's function runs: its output folder, its attempt's folder, and the paths it reads.

The output folder must hold only this step's own files (publishing replaces it whole); the attempt gets a
folder of its own (see `_publish`), a resumable step adopting the one an earlier attempt left; every
`handle / "sub"` input must exist, so a typo fails before the step runs.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from schooner.cluster.records import META_DIR, read_step_record
from schooner.cluster.storage import is_plain_path, list_folder, storage_for

from ._lower import Step
from ._publish import prepare_attempt
from ._step import join_path

if TYPE_CHECKING:
    from ._progress import Progress


class ForeignOutputError(RuntimeError):
    """A step's output folder holds files that no attempt of this step wrote."""


class MissingInputError(FileNotFoundError):
    """A `handle / "sub/path"` input names a path its step did not write."""


def check_own_folder(step: Step, out: str, *, forced: bool, progress: Progress) -> None:
    """Refuse a folder holding files this step did not write.

    Publishing an attempt replaces the whole output folder (and deletes the version it replaces): that
    must never delete data that is not the step's own (an `override_output_path` pointing at a user's
    folder).
    """
    storage = storage_for(out)
    others = [e for e in list_folder(out) if e != META_DIR]
    if not others:
        return
    rec = read_step_record(out, storage=storage)
    if rec is None or rec.get("key") != step.key:
        shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
        raise ForeignOutputError(
            f"step {step.name!r}: its output folder {out} holds files it did not write ({shown}); "
            "the runner empties a step's folder before each attempt, so it will not run there: "
            "remove those files or give the step another override_output_path"
        )
    if forced:
        progress.note(
            step,
            f"--force: reruns from an empty folder; the {len(others)} entries of {out} stay readable until "
            "the new output replaces them whole",
        )


def attempt_folder(
    step: Step, out: str, owner: str, previous: dict, *, forced: bool, progress: Progress
) -> str:
    """This attempt's own folder (see `_publish`); a resumable step adopts the one a dead attempt left.

    A resumable step whose partial output sits in the output folder itself (written before attempt
    folders existed) gets it moved into its attempt folder.
    """
    resume = step.handle.resumable and not forced
    attempt, adopted = prepare_attempt(out, owner, adopt=previous.get("attempt_path"), resume=resume)
    if adopted:
        progress.note(step, f"resumes the partial output of an earlier attempt ({adopted})")
    elif resume and previous.get("state") != "SUCCESS" and is_plain_path(out):
        legacy = [e for e in list_folder(out) if e != META_DIR]
        for name in legacy:
            os.rename(os.path.join(out, name), os.path.join(attempt, name))
        if legacy:
            progress.note(step, f"resumes the partial output left in {out}")
    return attempt


def check_input_paths(step: Step, paths: dict[str, str], prefix: str) -> None:
    """Every `handle / "sub"` input must exist once its step is done: catch typos before running."""
    for field_path, ref in step.handle.input_paths():
        if not ref.path:
            continue
        base = paths.get(ref.step.key) or ref.step.output_path(prefix)
        path = join_path(base, ref.path)
        if not storage_for(path).exists(path):
            raise MissingInputError(
                f"step {step.name!r}: config field {field_path!r} names {path}, which step "
                f"{ref.step.name!r} did not write; check the sub path {ref.path!r} in `handle / {ref.path!r}`"
            )
