"""schooner.cluster.runner: experiments as graphs of cached, versioned steps.

Handles (`step`, `StepHandle`, `InputPath`) and their keys, lowering a graph (`lower`), running it
(`StepRunner`) with leases, status files and records (written through `schooner.cluster.records`). The
writing side only: reading the records back (status, explain, report, compare) is `schooner.cluster.views`,
and command-line flags and exit statuses are `schooner.cluster.cli`'s. The names users write are also
exported by `schooner.cluster`.
"""

from ._files import InputFiles as InputFiles
from ._lower import Step as Step
from ._lower import lower as lower
from ._results import ResultWarning as ResultWarning
from ._results import RunInterrupted as RunInterrupted
from ._results import RunResult as RunResult
from ._results import StepFailedError as StepFailedError
from ._results import StepOutcome as StepOutcome
from ._runner import StepRunner as StepRunner
from ._runner import resolve_prefix as resolve_prefix
from ._step import InputPath as InputPath
from ._step import StepDef as StepDef
from ._step import StepHandle as StepHandle
from ._step import step as step
from ._version import ConfigError as ConfigError
from ._version import added_field as added_field
from ._version import runtime_field as runtime_field
