"""Tokenizer files laid out like Llama 3's and Qwen 2's, built locally (nothing can be downloaded).

The vocabulary is trained here with HF's byte-level BPE trainer on the split pattern of each family, then
written the way those files are: ranks as ids, merges listing every split of every token into two tokens
(sorted by the rank of the token they make, as the tiktoken-to-HF conversion writes them), special tokens
as added tokens after the vocabulary, and each family's pre-tokenizer, normalizer and post-processor.
"""

from __future__ import annotations

import json

import tokenizers
from tokenizers import models, pre_tokenizers, trainers

from schooner.tokenize import Tokenizer
from schooner.tokenize._byte_alphabet import byte_decoder
from schooner.tokenize._fast import PATTERNS


def _trained_ranks(texts: list[str], pattern: str, vocab_size: int) -> dict[str, int]:
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(tokenizers.Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])  # fmt: skip
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    hf.train_from_iterator(texts, trainer=trainer)
    return json.loads(hf.to_str())["model"]["vocab"]


def _all_split_merges(vocab: dict[str, int]) -> list[list[str]]:
    merges = []
    for token, rank in vocab.items():
        local = [
            (token[:k], token[k:], rank)
            for k in range(1, len(token))
            if token[:k] in vocab and token[k:] in vocab
        ]
        merges += sorted(local, key=lambda m: (vocab[m[0]], vocab[m[1]]))
    return [[a, b] for a, b, _ in sorted(merges, key=lambda m: m[2])]


def _added(first_id: int, names: list[str], special: bool = True) -> list[dict]:
    return [
        {"id": first_id + i, "content": n, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": special}
        for i, n in enumerate(names)
    ]  # fmt: skip


def llama3_like(texts: list[str], vocab_size: int = 1200, reserved: int = 20) -> Tokenizer:
    """A tokenizer.json in Llama 3's layout: Split(Llama 3 regex) + ByteLevel, ignore_merges, BOS added by
    a TemplateProcessing post-processor, `<|begin_of_text|>`... and reserved special tokens."""
    vocab = _trained_ranks(texts, PATTERNS["llama3"], vocab_size)
    names = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    names += [f"<|reserved_special_token_{i}|>" for i in range(reserved)]
    n = len(vocab)
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": _added(n, names),
        "normalizer": None,
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERNS["llama3"]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]},
        "post_processor": {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing",
             "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                      {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n], "tokens": ["<|begin_of_text|>"]}}},
        ]},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": True,
                  "vocab": vocab, "merges": _all_split_merges(vocab)},
    }  # fmt: skip
    return Tokenizer(
        tokenizers.Tokenizer.from_str(json.dumps(spec)),
        bos_token="<|begin_of_text|>",
        eos_token="<|end_of_text|>",
        source="<llama3-like>",
    )


def qwen2_like(texts: list[str], vocab_size: int = 1200) -> Tokenizer:
    """A tokenizer.json in Qwen 2's layout: NFC normalizer, Split(Qwen 2 regex: one digit a token) +
    ByteLevel, ChatML special tokens and non-special added tokens (`<tool_call>`, as Qwen 2.5 has)."""
    vocab = _trained_ranks(texts, PATTERNS["qwen2"], vocab_size)
    n = len(vocab)
    added = _added(n, ["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    added += _added(n + 3, ["<tool_call>", "</tool_call>", "<|fim_prefix|>"], special=False)
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": PATTERNS["qwen2"]}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        ]},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": _all_split_merges(vocab)},
    }  # fmt: skip
    return Tokenizer(
        tokenizers.Tokenizer.from_str(json.dumps(spec)),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        chat_template="chatml",
        source="<qwen2-like>",
    )


assert byte_decoder  # the byte alphabet the vocabularies are written in
