"""Schooner's experiments: one declarative file each, plus the models and tokenizers they share.

`experiments.tokenizers` was renamed `experiments.tokenizer_defs`: a file named `tokenizers.py` here shadowed
Hugging Face's `tokenizers` whenever a script in this folder ran. The old name still imports for one release,
with a DeprecationWarning, from a module object registered below (no file, so nothing is shadowed).
"""

import sys
import types
import warnings


class _Renamed(types.ModuleType):
    """`experiments.tokenizers`: each name read warns and comes from `experiments.tokenizer_defs`."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        warnings.warn(
            "experiments.tokenizers was renamed experiments.tokenizer_defs (a module named `tokenizers` "
            f"shadowed Hugging Face's); write `from experiments.tokenizer_defs import {name}`. "
            "The old name goes in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        from experiments import tokenizer_defs

        return getattr(tokenizer_defs, name)


tokenizers = sys.modules.setdefault(__name__ + ".tokenizers", _Renamed(__name__ + ".tokenizers"))
