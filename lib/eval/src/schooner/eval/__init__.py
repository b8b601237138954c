"""schooner.eval: loss and bits-per-byte on token caches (batch-invariant), greedy samples, evaluation steps.

Step builders live in `schooner.eval.steps` (`evaluate(...)`).
"""

from ._checkpoint import latest_checkpoint as latest_checkpoint
from ._checkpoint import list_checkpoints as list_checkpoints
from ._checkpoint import load_checkpoint as load_checkpoint
from ._generate import generate as generate
from ._generate import greedy_tokens as greedy_tokens
from ._lm_eval import evaluate_lm as evaluate_lm
from ._windows import TokenStream as TokenStream
from ._windows import WindowBatch as WindowBatch
from ._windows import iter_window_batches as iter_window_batches
from ._windows import num_windows as num_windows
