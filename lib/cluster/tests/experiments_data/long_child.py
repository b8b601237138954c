"""An in-process step that starts a child process writing a line every 0.1 s into CHILD_LOG, then waits for
it (the step never ends by itself). For the tests of SIGTERM and of kill -9 of the driver (issue 36)."""

import os
import subprocess
import sys
import time

from schooner.cluster import StepRunner, step

TICK = "import sys, time\nwhile True:\n    open(sys.argv[1], 'a').write('tick\\n')\n    time.sleep(0.1)\n"


def starts_a_child(config: dict, out: str) -> None:
    child = subprocess.Popen([sys.executable, "-c", TICK, os.environ["CHILD_LOG"]])
    with open(os.environ["CHILD_PID"], "w") as f:
        f.write(str(child.pid))
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    StepRunner().run([step("waits", starts_a_child, {})])
