"""Taking a step's lease before it runs, or learning that another runner decided the step meanwhile.

While another runner holds the lease, this one waits (saying whom for); when that runner publishes the step,
it is done here too ("cached"), and when it fails, the step fails here with `ConcurrentRunFailed`. A
`--force`d step runs again over its published output, unless this runner waited for another that just
published it.
"""

from __future__ import annotations

import time
import uuid
from typing import TYPE_CHECKING

from schooner.cluster.records import META_DIR, StepState, step_status
from schooner.cluster.storage import storage_for

from ._lease import Lease
from ._lower import Step
from ._results import StepOutcome
from ._step import join_path

if TYPE_CHECKING:
    from ._progress import Progress


def take_lease(
    step: Step, out: str, *, run_id: str, ttl: float, forced: bool, progress: Progress
) -> tuple[Lease | None, StepOutcome | None]:
    """Take the lease, or return the outcome decided by another runner (done or failed)."""
    storage = storage_for(out)
    lease = Lease(
        storage,
        out,
        owner=f"{run_id}-{uuid.uuid4().hex[:8]}",
        run_id=run_id,
        ttl=ttl,
    )
    waited_for = None
    delay = 0.05
    first = True
    while True:
        # The plan has just read the status; later rounds (after waiting) read it again.
        st = None if first else step_status(out, storage=storage)
        if st is not None and st.state is StepState.SUCCESS and (not forced or waited_for is not None):
            note = f"finished by run {st.owner.split('-')[0]}" if waited_for else ""
            return None, StepOutcome(step.name, step.key, out, "cached", note=note)
        if (
            waited_for is not None
            and st is not None
            and st.state is StepState.FAILED
            and st.owner == waited_for.owner
        ):
            return None, StepOutcome(
                step.name,
                step.key,
                out,
                "failed",
                error_type="ConcurrentRunFailed",
                error=f"failed in concurrent run {waited_for.run_id}: {st.error}",
            )
        if first:
            storage.makedirs(join_path(out, META_DIR))  # also makes `out`
            first = False
        acquired, holder = lease.try_acquire()
        if acquired:
            st = step_status(out, storage=storage)  # finished while we were acquiring?
            if st is not None and st.state is StepState.SUCCESS and (not forced or waited_for is not None):
                lease.release()
                continue
            if lease.took_over:
                progress.took_over(step)
            return lease, None
        if holder is not None and (waited_for is None or holder.owner != waited_for.owner):
            waited_for = holder
            progress.waiting(step, holder.describe())
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
