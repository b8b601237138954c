"""Steps that print their secrets through every door (issue 36): split writes, `sys.stdout.buffer`, a logging
handler made before the run, a child process, `repr`; a 5-character secret; a failing step naming them.
Run as `python prints_secrets.py PREFIX` with T_LONG, T_SHORT and T_QUOTED in the environment."""

import logging
import os
import subprocess
import sys
from dataclasses import dataclass

from schooner.cluster import Secret, StepRunner, step

LONG = os.environ["T_LONG"]
SHORT = os.environ["T_SHORT"]
QUOTED = os.environ["T_QUOTED"]
log = logging.getLogger("exp")
h = logging.StreamHandler(sys.stderr)
log.addHandler(h)
log.setLevel(logging.INFO)


@dataclass(frozen=True)
class C:
    long: Secret
    short: Secret
    quoted: Secret


def talk(c: C, out: str):
    s = c.long.get()
    sys.stdout.write(s[:5])
    sys.stdout.flush()
    sys.stdout.write(s[5:] + "\n")
    sys.stdout.buffer.write(("buf " + s + "\n").encode())
    sys.stdout.flush()
    log.info("logged %s", s)
    subprocess.run(["echo", "child " + s], check=True)
    print("short", c.short.get())
    print("repr", repr(c.quoted.get()))
    return {"short": c.short.get(), "quoted": repr(c.quoted.get())}


def fails(c: C, out: str):
    raise RuntimeError(f"bad {c.short.get()} {c.quoted.get()!r}")


cfg = C(Secret(LONG), Secret(SHORT), Secret(QUOTED))
steps = [step("talk", talk, cfg), step("fails", fails, cfg)]
r = StepRunner(sys.argv[1]).run(steps, raise_on_failure=False, max_concurrent=1)  # lines stay whole
print("ok" if not r.ok else "unexpected")
