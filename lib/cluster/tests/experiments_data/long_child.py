"""An in-process step that starts a child process writing a line every 0.1 s into CHILD_LOG, then waits for
it (the step never ends by itself). For the tests of SIGTERM and of kill -9 of the driver (issue 36).

With CHILD_GATE set, the step first writes CHILD_GATE.waiting and starts the child only once CHILD_GATE exists
(a test stops the orphan guard in between)."""

import os
import subprocess
import sys
import time

from schooner.cluster import StepRunner, step

TICK = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('tick\\n')\n    time.sleep(0.1)\n"


def starts_a_child(config: dict, out: str) -> None:
    gate = os.environ.get("CHILD_GATE")
    if gate:
        open(gate + ".waiting", "w").close()
        while not os.path.exists(gate):
            time.sleep(0.02)
    child = subprocess.Popen([sys.executable, "-c", TICK, os.environ["CHILD_LOG"]])
    with open(os.environ["CHILD_PID"], "w") as f:
        f.write(str(child.pid))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    StepRunner().run([step("waits", starts_a_child, {})])
