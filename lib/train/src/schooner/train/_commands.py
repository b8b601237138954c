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
            found = [config.get("tokenizer"), *(config.get("data", {}).get("components") or {})]
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
        parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
        parser.add_argument(
            "--chat-template",
            default=None,
            help="chat template written into tokenizer_config.json: schooner or chatml (default: the "
            "tokenizer's own, else the one the run's chat data used)",
        )

    @staticmethod
    def run(ns: argparse.Namespace) -> int:
        from ._export import ExportHfConfig, _run_export_hf

        config = ExportHfConfig(
            run=ns.run, step=ns.step, tokenizer=ns.tokenizer, tokenizer_sources=tokenizer_sources(ns.run),
            dtype=ns.dtype, chat_template=ns.chat_template,
        )  # fmt: skip
        record = _run_export_hf(config, ns.out)
        if record["tokenizer"] is None:
            print("no tokenizer found for the run: config.json has no token ids (pass --tokenizer)")
        print(
            f"{record['checkpoint']} (step {record['step']}) written to {ns.out} in the Hugging Face layout"
        )
        return 0


EXPORT_HF = _ExportHf()
