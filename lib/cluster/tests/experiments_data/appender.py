"""An experiment whose one step appends rows to a file, slowly: the workload that exposes partial output.

Knobs (environment): APP_ROWS (rows to write, default 20), APP_DELAY (seconds per row, default 0.1),
APP_WHERE ("process": in the runner; "cluster": through the client, the default), APP_CHILD (a file: the
step starts a child process that appends a line to it every 0.1 s until killed, and writes its pid to
`<file>.pid`), APP_TAG (a word written before every row, so a test can tell attempts apart).
"""

import os
import subprocess
import sys
import time
from dataclasses import dataclass

from schooner.cluster import ResourceConfig, StepRunner, step

ROWS = int(os.environ.get("APP_ROWS", "20"))
DELAY = float(os.environ.get("APP_DELAY", "0.1"))
WHERE = os.environ.get("APP_WHERE", "cluster")
CHILD = os.environ.get("APP_CHILD")
TAG = os.environ.get("APP_TAG", "")

# A child that, like most tools, dies quietly on SIGINT (Python's default would print a traceback).
_CHILD_CODE = (
    "import signal,sys,time\nsignal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "while True:\n    open(sys.argv[1],'a').write('x\\n'); time.sleep(0.1)\n"
)


@dataclass(frozen=True)
class RowsConfig:
    rows: int


def append_rows(config: RowsConfig, out: str) -> dict:
    if CHILD:
        child = subprocess.Popen([sys.executable, "-c", _CHILD_CODE, CHILD])
        with open(CHILD + ".pid", "w") as f:
            f.write(str(child.pid))
    path = os.path.join(out, "rows.txt")
    for i in range(config.rows):
        with open(path, "a") as f:
            f.write(f"{TAG} row {i}\n".lstrip())
        time.sleep(DELAY)
    with open(path) as f:
        return {"rows": sum(1 for _ in f)}


rows = step(
    "rows",
    append_rows,
    RowsConfig(rows=ROWS),
    resources=ResourceConfig.with_cpu() if WHERE == "cluster" else None,
)

if __name__ == "__main__":
    StepRunner().run([rows])
