"""A pytest-xdist scheduler for `--dist loadgroup` that survives a crashed worker (the suite's setting).

pytest-xdist 3.8.0 (the newest release) hangs for good when a worker dies under `loadgroup`: the crashed
worker's whole workload goes back on the queue, finished groups included, and the replacement is handed a
group whose tests are all done (an empty command) or a single test it never starts, because a worker runs a
test only once it knows the next one or is told to stop (pytest-xdist issues #1323, #1327, #1378; fixes
merged upstream after 3.8.0). One crashed test then turned a CI run into a 90-minute timeout with both
workers idle. This scheduler is xdist's own `LoadGroupScheduling` with those two places fixed:

- `remove_node` puts back only the groups that still have tests to run, and counts the test the worker died
  on as done (xdist has already reported it as failed; running it again would only crash the replacement);
- `_reschedule` never leaves a worker holding fewer than two tests while work remains, and stops a worker
  when the queue is empty, so its last test runs.

It also puts each test's `xdist_group` back into the node id a worker reports, which is how the scheduler
learns the groups: pytest 9.2 keeps node ids as a structured `NodeId` (`item._id`), and xdist 3.8.0 still
writes the old `item._nodeid`, which pytest no longer reads (pytest-xdist issue #1386, fix not released).
Without it every grouped test was scheduled on its own: the Ray tests ran on both workers, and each worker
started a Ray of its own (two ~25 s starts per run, and two Rays competing for 2 cores).

Installed through xdist's `pytest_xdist_make_scheduler` hook by the repository's conftest.py; any other
`--dist` mode is left to xdist.
"""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadGroupScheduling


class CrashSafeLoadGroupScheduling(LoadGroupScheduling):
    def remove_node(self, node: Any) -> str | None:
        workload = self.assigned_work.pop(node)
        if not self._pending_of(workload):
            return None
        crashitem = next(nodeid for unit in workload.values() for nodeid, done in unit.items() if not done)
        workload[self._split_scope(crashitem)][crashitem] = True
        for scope, unit in workload.items():
            if not all(unit.values()):
                self.workqueue[scope] = unit
        for other in self.assigned_work:
            self._reschedule(other)
        return crashitem

    def _reschedule(self, node: Any) -> None:
        if node.shutting_down:
            return
        if not self.workqueue:
            node.shutdown()
            return
        if self._pending_of(self.assigned_work[node]) > 2:
            return
        self._assign_work_unit(node)
        while self._pending_of(self.assigned_work[node]) < 2:
            if not self.workqueue:
                node.shutdown()
                return
            self._assign_work_unit(node)


def pytest_xdist_make_scheduler(config: Any, log: Any) -> CrashSafeLoadGroupScheduling | None:
    if config.getvalue("dist") == "loadgroup":
        return CrashSafeLoadGroupScheduling(config, log)
    return None


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: Any, items: list[Any]) -> None:
    """On a `--dist loadgroup` worker, after xdist's own hook: `<nodeid>@<group>` as xdist 3.8.0 means it."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = {
            str(m.args[0] if m.args else m.kwargs.get("name", "default"))
            for m in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if names and not item.nodeid.endswith(suffix) and hasattr(item, "_id"):
            from _pytest.nodeid import NodeId

            item._id = NodeId.parse(item.nodeid + suffix)
