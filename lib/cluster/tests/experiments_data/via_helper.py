"""An experiment that runs its steps through a helper module's `StepRunner().run` call."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from chain import report  # noqa: E402
from helper_runner import run_all  # noqa: E402

if __name__ == "__main__":
    run_all([report])
