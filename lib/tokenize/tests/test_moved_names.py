"""Names that moved or went: the old import path works for one release, with a DeprecationWarning."""

from __future__ import annotations

import pytest

import schooner.tokenize
from schooner.tokenize import steps, train_bpe


def test_the_train_tokenizer_function_alias_warns_and_is_train_bpe() -> None:
    with pytest.warns(DeprecationWarning, match=r"call schooner\.tokenize\.train_bpe"):
        from schooner.tokenize import train_tokenizer
    assert train_tokenizer is train_bpe
    assert steps.train_tokenizer is not train_bpe  # the one meaning left: the step builder


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        schooner.tokenize.nothing_here  # noqa: B018
