"""schooner.tokenize: tokenizers, the tensorstore token cache, mixtures, shuffling, packing and the loader.

`import schooner.tokenize` stays light: jax is imported only when the loader places arrays on devices.
"""

import warnings as _warnings
from typing import Any as _Any

from ._build import build_cache as build_cache
from ._build import write_cache as write_cache
from ._cache import KINDS as KINDS
from ._cache import CacheError as CacheError
from ._cache import TokenCache as TokenCache
from ._cache import TokenizerMismatchError as TokenizerMismatchError
from ._chat import RenderedChat as RenderedChat
from ._chat import pack_chats as pack_chats
from ._chat import render_chat as render_chat
from ._chat import resolve_template as resolve_template
from ._documents import chat_record as chat_record
from ._documents import preference_record as preference_record
from ._encode import split_of as split_of
from ._loader import DataLoader as DataLoader
from ._mixture import MixtureDataset as MixtureDataset
from ._mixture import MixtureError as MixtureError
from ._mixture import largest_remainder as largest_remainder
from ._packing import AllMaskedError as AllMaskedError
from ._packing import PackedSequences as PackedSequences
from ._permute import Permutation as Permutation
from ._permute import derive_key as derive_key
from ._preferences import PreferenceDataset as PreferenceDataset
from ._sequences import TokenSequences as TokenSequences
from ._sequences import segment_ids_from_eos as segment_ids_from_eos
from ._templates import CHAT_TEMPLATES as CHAT_TEMPLATES
from ._templates import CHATML as CHATML
from ._templates import SCHOONER_CHAT as SCHOONER_CHAT
from ._templates import ChatTemplate as ChatTemplate
from ._templates import jinja_chat_template as jinja_chat_template
from ._text_bytes import scored_text_bytes as scored_text_bytes
from ._tokenizer import Tokenizer as Tokenizer
from ._tokenizer import load_tokenizer as load_tokenizer
from ._train import BOS_TOKEN as BOS_TOKEN
from ._train import CHAT_TOKENS as CHAT_TOKENS
from ._train import DEFAULT_SPECIAL_TOKENS as DEFAULT_SPECIAL_TOKENS
from ._train import EOS_TOKEN as EOS_TOKEN
from ._train import PAD_TOKEN as PAD_TOKEN
from ._train import BPEConfig as BPEConfig
from ._train import train_bpe as train_bpe


def __getattr__(name: str) -> _Any:
    # one name, one meaning: `train_tokenizer` is the step builder in `schooner.tokenize.steps`
    if name == "train_tokenizer":
        _warnings.warn(
            "schooner.tokenize.train_tokenizer is train_bpe under another name and will be removed in the next "
            "release; call schooner.tokenize.train_bpe (the step is schooner.tokenize.steps.train_tokenizer)",
            DeprecationWarning,
            stacklevel=2,
        )
        return train_bpe
    raise AttributeError(f"module 'schooner.tokenize' has no attribute {name!r}")
