"""schooner.cluster: resources and clients (local and Ray), and the step runner.

Parts, each importing only the ones before it: `schooner.cluster.storage` (local paths and fsspec URLs,
atomic writes, JSON) and `schooner.cluster.records` (the on-disk records of a step: metrics, status,
history, experiment records), which every package uses; resources and clients here (`ResourceConfig`,
`Client`, `LocalClient`, `RayClient`); the step runner, the writing side, in `schooner.cluster.runner`
(`step`, `StepRunner`, ...; its public names are exported here too); the read side in
`schooner.cluster.views` (status, explain, report, compare; `write_report` is exported here too); and the
`schooner` command in `schooner.cluster.cli`, which this face never imports.
"""

from . import records as records
from . import storage as storage
from ._client import Client as Client
from ._client import JobCancelledError as JobCancelledError
from ._client import JobError as JobError
from ._client import JobHandle as JobHandle
from ._client import JobStatus as JobStatus
from ._client import ResourcesUnavailableError as ResourcesUnavailableError
from ._client import WorkerDiedError as WorkerDiedError
from ._current import current_client as current_client
from ._current import using_client as using_client
from ._fingerprint import Unfingerprintable as Unfingerprintable
from ._fingerprint import code_fingerprint as code_fingerprint
from ._fingerprint import fingerprint_token as fingerprint_token
from ._gang import GangInfo as GangInfo
from ._gang import current_gang as current_gang
from ._local import LocalClient as LocalClient
from ._local import LocalJobHandle as LocalJobHandle
from ._local_ray import LocalNode as LocalNode
from ._local_ray import LocalRayCluster as LocalRayCluster
from ._ray import RayClient as RayClient
from ._ray import RayJobHandle as RayJobHandle
from ._resources import ResourceConfig as ResourceConfig
from ._secrets import Secret as Secret
from ._secrets import is_secret_name as is_secret_name
from ._secrets import redact_env as redact_env
from ._secrets import secret_field as secret_field
from .runner import ConfigError as ConfigError
from .runner import InputFiles as InputFiles
from .runner import InputPath as InputPath
from .runner import ResultWarning as ResultWarning
from .runner import RunInterrupted as RunInterrupted
from .runner import RunResult as RunResult
from .runner import Step as Step
from .runner import StepDef as StepDef
from .runner import StepFailedError as StepFailedError
from .runner import StepHandle as StepHandle
from .runner import StepOutcome as StepOutcome
from .runner import StepRunner as StepRunner
from .runner import added_field as added_field
from .runner import lower as lower
from .runner import resolve_prefix as resolve_prefix
from .runner import runtime_field as runtime_field
from .runner import step as step
from .runner._publish import published_path as published_path
from .runner._publish import published_paths as published_paths
from .storage import atomic_open as atomic_open
from .storage import atomic_write as atomic_write
from .storage import is_temp_name as is_temp_name
from .storage import unique_tag as unique_tag
from .views import write_report as write_report


def _publish() -> None:
    """Name the public classes by their public module, so tracebacks and reprs say
    `schooner.cluster.ResourcesUnavailableError`, not `schooner.cluster._client.ResourcesUnavailableError`
    (pickling by reference follows: `schooner.cluster` exports each of them)."""
    for value in list(globals().values()):
        if isinstance(value, type) and value.__module__.startswith(f"{__name__}."):
            value.__module__ = __name__


_publish()
