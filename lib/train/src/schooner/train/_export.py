"""Writing one checkpoint of a training run in the Hugging Face layout: the work of the `hf_export` step
(`schooner.train.steps.hf_export`) and of the `schooner export-hf` command.

Output folder: `config.json`, `generation_config.json`, `model.safetensors` (or shards with an index),
the tokenizer's files (`tokenizer_config.json` with a Jinja `chat_template` for `apply_chat_template`), and
`export.json` (which checkpoint, which step, the tokenizer's fingerprint, the chat template).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any

from schooner.cluster import storage

VERSION = "export-hf-v1"
_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class ExportHfConfig:
    """What the `hf_export` step exports (inputs are resolved to their folders when it runs)."""

    run: Any
    """The `train_lm` step (or a run folder / checkpoint folder path)."""
    step: int | None = None
    """The checkpoint's step; None: the latest complete checkpoint."""
    tokenizer: Any = None
    """Tokenizer folder/file or step to copy (None: the run's own tokenizer, found from `tokenizer_sources`)."""
    tokenizer_sources: tuple = ()
    """Where the run's tokenizer can be found: its `tokenizer` and its datasets, in order."""
    dtype: str = "float32"
    """Tensor dtype of the export: "float32" or "bfloat16"."""
    max_shard_bytes: int = 5 * 10**9
    """Largest safetensors file; larger models are sharded with an index (as HF does)."""
    chat_template: str | None = None
    """Schooner chat template to write as `chat_template` ("schooner", "chatml"); None: the tokenizer
    folder's own if it has one, else the one the run's chat data was rendered with, else the tokenizer's
    (`resolve_template`) when it has that template's tokens."""

    def __post_init__(self) -> None:
        from schooner.tokenize import CHAT_TEMPLATES

        if self.chat_template is not None and self.chat_template not in CHAT_TEMPLATES:
            raise ValueError(
                f"export_hf: chat_template must be one of {sorted(CHAT_TEMPLATES)} or None, "
                f"got chat_template={self.chat_template!r}"
            )
        if self.dtype not in _DTYPES:
            raise ValueError(f"export_hf: dtype must be one of {_DTYPES}, got dtype={self.dtype!r}")
        if self.step is not None and (
            isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1
        ):
            raise ValueError(
                f"export_hf: step must be a positive int or None (the latest), got step={self.step!r}"
            )
        if not isinstance(self.max_shard_bytes, int) or self.max_shard_bytes < 1:
            raise ValueError(
                f"export_hf: max_shard_bytes must be a positive int, got {self.max_shard_bytes!r}"
            )


def _tokenizer_folder(config: ExportHfConfig) -> str | None:
    from ._evaluate import find_tokenizer_file

    if config.tokenizer is not None:
        return os.fspath(config.tokenizer)
    for source in config.tokenizer_sources:
        path = os.fspath(source)
        if os.path.isfile(path) or os.path.exists(os.path.join(path, "tokenizer.json")):
            return path
        for sub in ("", "train"):
            found = find_tokenizer_file(os.path.join(path, sub) if sub else path)
            if found:
                return found
    return None


def _recorded_chat_template(sources: tuple) -> dict | None:
    """The chat template (as `asdict`) the first chat/preference cache among `sources` was rendered with."""
    for source in sources:
        path = os.fspath(source)
        for manifest in (os.path.join(path, "manifest.json"), os.path.join(path, "train", "manifest.json")):
            if os.path.isfile(manifest):
                with open(manifest) as f:
                    template = json.load(f).get("chat_template")
                if template:
                    return template
    return None


def write_chat_template(folder: str, tok: Any, config: ExportHfConfig) -> str | None:
    """Give `folder`'s `tokenizer_config.json` a Jinja `chat_template` (see `ExportHfConfig.chat_template`);
    return the Schooner template's name, "tokenizer's own" when the file already had one, or None."""
    from schooner.tokenize import jinja_chat_template, resolve_template

    path = os.path.join(folder, "tokenizer_config.json")
    if not os.path.exists(path):  # a bare tokenizer.json was shipped: write the config Schooner would
        tok.save(folder)
    with open(path) as f:
        cfg = json.load(f)
    if config.chat_template is None and isinstance(cfg.get("chat_template"), str | list):
        return "tokenizer's own"
    wanted = config.chat_template or _recorded_chat_template(config.tokenizer_sources)
    try:
        template = resolve_template(tok, wanted)
    except ValueError:
        if wanted is not None:
            raise
        return None  # the tokenizer lacks the default template's tokens: a base model without chat format
    cfg |= {"chat_template": jinja_chat_template(template), "schooner_chat_template": template.name}
    storage.write_json(path, cfg, indent=2, sort_keys=False)
    return template.name


def end_of_turn_id(tok: Any, template: Any) -> int | None:
    """The id of the special token that closes a turn in `template` (the first of its footer's tokens that
    is one of the template's special tokens: `<|end_of_turn|>`, `<|im_end|>`), or None if it has none."""
    from schooner.tokenize import resolve_template

    template = resolve_template(tok, template)
    special = {tok.token_to_id(t) for t in template.required_tokens} - {None}
    footer = tok.encode(template.footer, parse_special=True)
    return next((int(i) for i in footer if i in special), None)


def _stop_on_end_of_turn(folder: str, tok: Any, config: ExportHfConfig) -> list[int] | None:
    """For a model trained on a chat template (the run's chat or preference caches recorded one, or the
    export names one), make `generation_config.json`'s `eos_token_id` the list [EOS, end-of-turn], as
    Llama-3-Instruct does, so `generate` stops at the end of the answer; return that list (None: untouched).

    A base model's export keeps the tokenizer's EOS alone: it was never taught to close a turn."""
    template = config.chat_template or _recorded_chat_template(config.tokenizer_sources)
    if template is None:
        return None
    eot = end_of_turn_id(tok, template)
    if eot is None:
        return None
    stop = [i for i in (tok.eos_id, eot) if i is not None]
    stop = list(dict.fromkeys(stop))  # a template whose footer is the EOS itself: one id
    path = os.path.join(folder, "generation_config.json")
    with open(path) as f:
        gen = json.load(f)
    gen["eos_token_id"] = stop if len(stop) > 1 else stop[0]
    storage.write_json(path, gen, indent=2, sort_keys=False)
    return stop


def _run_export_hf(config: ExportHfConfig, output_path: str) -> dict[str, Any]:
    from schooner.model import CHECKPOINT_MARKER, find_checkpoint, load_model
    from schooner.model import export_hf as write_hf
    from schooner.tokenize import load_tokenizer

    from ._checkpoint import read_marker

    folder = find_checkpoint(os.fspath(config.run), config.step, who="export_hf: ")
    model, model_config = load_model(folder)
    tok_path = _tokenizer_folder(config)
    ids: dict[str, int | None] = {}
    files: list[str] | None = None
    fingerprint = None
    if tok_path is not None:
        tok = load_tokenizer(tok_path)
        ids = {"bos_token_id": tok.bos_id, "eos_token_id": tok.eos_id, "pad_token_id": tok.pad_id}
        fingerprint = tok.fingerprint
        tok_dir = tok_path if os.path.isdir(tok_path) else os.path.dirname(tok_path)
        files = [os.path.join(tok_dir, n) for n in ("tokenizer.json", "tokenizer_config.json")]
        files = [f for f in files if os.path.exists(f)]
    os.makedirs(output_path, exist_ok=True)
    write_hf(
        model,
        model_config,
        output_path,
        tokenizer_files=files,
        dtype=config.dtype,
        max_shard_bytes=config.max_shard_bytes,
        **{k: v for k, v in ids.items() if v is not None},
    )
    chat = write_chat_template(output_path, tok, config) if tok_path is not None else None
    stop_ids = _stop_on_end_of_turn(output_path, tok, config) if tok_path is not None else None
    has_marker = storage.exists(storage.join(folder, CHECKPOINT_MARKER))  # none in a save_model folder
    record = {
        "checkpoint": folder,
        "step": read_marker(folder)["step"] if has_marker else None,
        "tokenizer": tok_path,
        "tokenizer_fingerprint": fingerprint,
        "dtype": config.dtype,
        "chat_template": chat,
        "eos_token_ids": stop_ids if stop_ids is not None else ids.get("eos_token_id"),
    }
    storage.write_json(os.path.join(output_path, "export.json"), record, indent=2, sort_keys=False)
    return record
