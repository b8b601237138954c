"""schooner.eval: loss and bits-per-byte on token caches (batch-invariant), greedy samples, evaluation steps.

Step builders live in `schooner.eval.steps` (`evaluate(...)`).
"""

from schooner.model import TokenStream as TokenStream
from schooner.model import WindowBatch as WindowBatch
from schooner.model import iter_window_batches as iter_window_batches
from schooner.model import num_windows as num_windows

from ._checkpoint import latest_checkpoint as latest_checkpoint
from ._checkpoint import list_checkpoints as list_checkpoints
from ._checkpoint import load_checkpoint as load_checkpoint
from ._generate import generate as generate
from ._generate import greedy_tokens as greedy_tokens
from ._lm_eval import evaluate_lm as evaluate_lm
