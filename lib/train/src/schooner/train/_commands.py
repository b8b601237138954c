"""The subcommands schooner-train adds to the `schooner` command (entry points `schooner.commands`).

Kept light to import: the `schooner` command loads this module to build its parser; the export's code is
imported when the command runs.
"""

from __future__ import annotations

import argparse
import json
import os


def tokenizer_sources(run: str) -> tuple[str, ...]:
    """Where a run's tokenizer can be found, from its `run.json` (the run folder's, or the one above a
    checkpoint folder): its `tokenizer`, then its training caches."""
    for folder in (run, os.path.dirname(os.path.normpath(run))):
        path = os.path.join(folder, "run.json")
        if os.path.exists(path):
            with open(path) as f:
                config = json.load(f).get("config", {})
            inputs = [pair[0] for pair in config.get("datasets") or []]  # TrainerConfig
            inputs += list(config.get("data", {}).get("components") or {})  # a run of schooner-train 0.x
            found = [config.get("tokenizer"), *inputs]
            return tuple(str(x) for x in found if x)
    return ()


class _ExportHf:
    help = "write a training run's checkpoint (or a checkpoint folder) as a Hugging Face model folder"

    @staticmethod
    def add_arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("run", help="a train_lm/sft/dpo run folder, or one checkpoint folder")
        parser.add_argument("out", help="the folder to write (config.json, weights, tokenizer files)")
        parser.add_argument(
            "--step", type=int, default=None, help="the checkpoint's step (default: the latest)"
        )
        parser.add_argument(
            "--tokenizer",
            default=None,
            help="tokenizer folder or file (default: the run's own, from run.json)",
        )
        parser.add_argument(
            "--no-tokenizer",
            action="store_true",
            help="export the weights alone when no tokenizer is known (config.json then names no "
            "bos/eos/pad token ids and the folder has no tokenizer files)",
        )
        parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
        parser.add_argument(
            "--chat-template",
            default=None,
            help="chat template written into tokenizer_config.json: schooner or chatml (default: the "
            "tokenizer's own, else the one the run's chat data used)",
        )

    @staticmethod
    def run(ns: argparse.Namespace) -> int:
        from schooner.cluster import ConfigError
        from schooner.model import find_checkpoint

        from ._export import ExportHfConfig, _run_export_hf, _tokenizer_folder

        config = ExportHfConfig(
            run=ns.run, step=ns.step, tokenizer=ns.tokenizer, tokenizer_sources=tokenizer_sources(ns.run),
            dtype=ns.dtype, chat_template=ns.chat_template,
        )  # fmt: skip
        # Bad input is found before anything is written, and reported as a CLI error (exit 2, no traceback).
        try:
            find_checkpoint(os.fspath(ns.run), ns.step, who="export-hf: ")
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(str(e)) from None
        if ns.tokenizer is not None and not os.path.exists(ns.tokenizer):
            raise ConfigError(f"export-hf: --tokenizer {ns.tokenizer!r} does not exist")
        if ns.tokenizer is not None and ns.no_tokenizer:
            raise ConfigError("export-hf: pass --tokenizer or --no-tokenizer, not both")
        if _tokenizer_folder(config) is None and not ns.no_tokenizer:
            raise ConfigError(
                f"export-hf: no tokenizer found for {ns.run!r} (no run.json naming one next to it): pass "
                "--tokenizer FOLDER_OR_FILE (its token ids go into config.json and its files next to the "
                "weights), or --no-tokenizer to export the weights alone"
            )
        record = _run_export_hf(config, ns.out)
        if record["tokenizer"] is None:
            dropped = _drop_null_token_ids(ns.out)
            print(
                f"exported without a tokenizer (--no-tokenizer): no tokenizer files, and config.json names no "
                f"{'/'.join(dropped) or 'special token'} ids; add the tokenizer's files before using the folder"
            )
        print(
            f"{record['checkpoint']} (step {record['step']}) written to {ns.out} in the Hugging Face layout"
        )
        return 0


def _drop_null_token_ids(out: str) -> list[str]:
    """Remove the `*_token_id: null` entries of a tokenizer-less export's config files (absent, not null:
    transformers then takes its own defaults); returns the names removed from config.json."""
    from schooner.cluster import storage

    dropped: list[str] = []
    for name in ("config.json", "generation_config.json"):
        path = os.path.join(out, name)
        if not os.path.exists(path):
            continue
        with open(path) as f:
            data = json.load(f)
        nulls = [k for k, v in data.items() if k.endswith("_token_id") and v is None]
        if not nulls:
            continue
        for k in nulls:
            del data[k]
        storage.write_json(path, data, indent=2, sort_keys=False)
        if name == "config.json":
            dropped = [k.removesuffix("_token_id") for k in nulls]
    return dropped


EXPORT_HF = _ExportHf()
