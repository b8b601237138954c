"""lm-evaluation-harness's command line with the `schooner` model registered (extra `[harness]`).

lm-eval (0.4.x) finds a model name only in its own table of built-in models or in the registry filled when a
module that registers one is imported; it has no plugin or entry-point lookup, so a bare
`lm_eval --model schooner` cannot see Schooner's model. This command imports `schooner.eval.harness` (which
registers `schooner`) and then runs lm-eval's own command line, with the same arguments:

    schooner-lm-eval --model schooner --model_args checkpoint=/runs/nano,tokenizer=/tok \\
        --tasks my_task --include_path tasks/ --output_path results/
    python -m schooner.eval.lm_eval_cli run --model schooner ...   # the same, without the console script

Every other lm-eval subcommand (`ls tasks`, `validate`) works as under `lm_eval`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> None:
    """Register the `schooner` model, then run lm-eval's command line on `argv` (default: `sys.argv[1:]`)."""
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError as e:
        raise SystemExit(
            f"schooner-lm-eval needs lm-evaluation-harness ({e}); install it with "
            "`pip install 'schooner-eval[harness]'`"
        ) from None
    from . import harness  # noqa: F401  (registers the model `schooner`)

    if argv is not None:
        sys.argv = [sys.argv[0], *argv]  # lm-eval's parser reads sys.argv itself
    cli_evaluate()


if __name__ == "__main__":
    main()
