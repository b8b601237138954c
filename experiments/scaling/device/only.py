"""Run only the named steps of the Delphi suite (and what they need), e.g. fitted runs a cut-off call left
unfinished: `python3 .tpu/only.py scaling/delphi/1.00e+13-w32 ...` (run.sh passes them). Names, not the
runner's `--only RE`: these names hold `.` and `+`, which a regular expression reads otherwise."""

import sys

from experiments.scaling import delphi_suite as suite
from schooner.cluster import StepRunner

want = set(sys.argv[1:])
del sys.argv[1:]  # StepRunner.main reads the command line
handles = [r.train for r in suite.runs if r.train.name in want]
if len(handles) != len(want):
    missing = sorted(want - {h.name for h in handles})
    raise SystemExit(f"only.py: no such run in the suite at these budgets: {missing}")
StepRunner().main(handles)
