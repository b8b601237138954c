"""schooner.eval: loss and bits-per-byte on token caches, log-likelihood tasks and suites, generation, steps.

Every score here is batch-invariant: the same numbers for any batch size, request order and padding.
Step builders live in `schooner.eval.steps` (`evaluate(...)`, `task_texts(...)`); the lm-evaluation-harness
adapter in `schooner.eval.harness` (imported only when used).
"""

from ._bpb import evaluate_lm as evaluate_lm
from ._bundled import BundledTasks as BundledTasks
from ._bundled import bundled_suite as bundled_suite
from ._checkpoint import find_checkpoint as find_checkpoint
from ._checkpoint import list_checkpoints as list_checkpoints
from ._checkpoint import load_checkpoint as load_checkpoint
from ._generate import generate as generate
from ._generate import greedy_tokens as greedy_tokens
from ._kv_generate import SamplingConfig as SamplingConfig
from ._kv_generate import generate_texts as generate_texts
from ._kv_generate import generate_tokens as generate_tokens
from ._layouts import LAYOUTS as LAYOUTS
from ._loglikelihood import Request as Request
from ._loglikelihood import Score as Score
from ._loglikelihood import encode_pair as encode_pair
from ._loglikelihood import rolling_requests as rolling_requests
from ._loglikelihood import score_requests as score_requests
from ._loglikelihood import score_rolling as score_rolling
from ._tasks import Example as Example
from ._tasks import example_requests as example_requests
from ._tasks import score_examples as score_examples
from ._taskspec import CORE_TASKS as CORE_TASKS
from ._taskspec import Suite as Suite
from ._taskspec import Task as Task
from ._taskspec import core_suite as core_suite
from ._taskspec import evaluate_suite as evaluate_suite
from ._taskspec import evaluate_task as evaluate_task
from ._taskspec import load_examples as load_examples


def __getattr__(name: str) -> object:
    # `schooner.train.latest_checkpoint` returns `(step, path) | None`; this package's finder returns the path
    # and raises, so one word named two things. The old name stays for one release (0.1.x), warning.
    if name == "latest_checkpoint":
        import warnings

        warnings.warn(
            "schooner.eval.latest_checkpoint is renamed find_checkpoint (the same function, "
            "schooner.model.find_checkpoint: a path, raising when there is none) and will be removed in the "
            "next release; schooner.train.latest_checkpoint is another function ((step, path) or None)",
            DeprecationWarning,
            stacklevel=2,
        )
        return find_checkpoint
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
