"""An experiment whose one step writes into its output until the filesystem is full (OSError ENOSPC).

Knobs (environment): FILL_WHERE ("process": in the runner, the default; "cluster": through the client),
FILL_RESUMABLE ("1": a resumable step, whose partial output is kept for the next attempt), FILL_RETURN ("1":
on ENOSPC, the step gives back 16 KiB and returns normally: a disk left nearly full by a step that succeeds).
"""

import os

from schooner.cluster import ResourceConfig, StepRunner, step

WHERE = os.environ.get("FILL_WHERE", "process")


def fill(config: dict, out: str) -> str | None:
    chunk = b"x" * config["chunk"]
    path = os.path.join(out, "big.bin")
    try:
        with open(path, "wb") as f:
            while True:  # ends with OSError(ENOSPC) when the filesystem is full
                f.write(chunk)
                f.flush()
    except OSError:
        if os.environ.get("FILL_RETURN") != "1":
            raise
    with open(path, "r+b") as f:
        f.truncate(max(0, os.path.getsize(path) - 16384))
    return "filled"


big = step(
    "big",
    fill,
    {"chunk": 4096},
    resources=ResourceConfig.with_cpu() if WHERE == "cluster" else None,
    resumable=os.environ.get("FILL_RESUMABLE") == "1",
)

if __name__ == "__main__":
    StepRunner().run([big])
