"""A SentencePiece-style tokenizer for the bits-per-byte tests (test_bpb.py, test_harness.py)."""

from __future__ import annotations

JAPANESE = "日本語のテキストです。"
"""33 bytes of text that the tokenizer encodes as `▁`, `<unk>`: its byte table counts 1 byte."""


def sentencepiece_style_tokenizer():
    """A Unigram tokenizer with `▁` word prefixes and an `<unk>` for what it never saw (as Llama 2 or T5
    without byte fallback): Japanese text encodes as `▁`, `<unk>`."""
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from schooner.tokenize import Tokenizer

    hf = tokenizers.Tokenizer(models.Unigram())
    hf.pre_tokenizer = pre_tokenizers.Metaspace()
    hf.decoder = decoders.Metaspace()
    english = ["The quick brown fox jumps over the lazy dog.", "A lazy dog sleeps all day in the sun."]
    trainer = trainers.UnigramTrainer(
        vocab_size=120, unk_token="<unk>", special_tokens=["<unk>", "<s>", "</s>"]
    )
    hf.train_from_iterator(english * 20, trainer)
    return Tokenizer(hf, bos_token="<s>", eos_token="</s>")
