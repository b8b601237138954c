"""schooner.cluster: resources, clients (local and Ray) and the step runner."""

from ._client import Client as Client
from ._client import JobCancelledError as JobCancelledError
from ._client import JobError as JobError
from ._client import JobHandle as JobHandle
from ._client import JobStatus as JobStatus
from ._client import ResourcesUnavailableError as ResourcesUnavailableError
from ._client import WorkerDiedError as WorkerDiedError
from ._current import current_client as current_client
from ._current import using_client as using_client
from ._local import LocalClient as LocalClient
from ._local import LocalJobHandle as LocalJobHandle
from ._resources import ResourceConfig as ResourceConfig
from ._secrets import is_secret_name as is_secret_name
from ._secrets import redact_env as redact_env
