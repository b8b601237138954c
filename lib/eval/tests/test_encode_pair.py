"""The context/continuation split against lm-evaluation-harness's own code (`TemplateLM.loglikelihood`, which
calls `TemplateLM._encode_pair`), with the same tokenizer: contexts that end in newlines, tabs and spaces, and
pairs with no delimiter at all (`target_delimiter: ""`)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from schooner.eval import encode_pair
from schooner.tokenize import train_bpe

pytest.importorskip("lm_eval")

CODE = [
    "def add(a, b):\n    return a + b\n",
    "class Point:\n\tdef __init__(self, x):\n\t\tself.x = x\n",
    "for i in range(10):\n    if i % 2:\n        print(i)\n    else:\n        continue\n",
    "Question: What is the capital of France?\nAnswer: Paris\n\n",
    "items = [1, 2, 3]\r\nfor item in items:\r\n    total += item\r\n",
]

# (context, continuation) as a task's prompt and `target_delimiter + choice` give them
PAIRS = [
    ("def add(a, b):\n", "    return a + b"),  # code next-line: the context ends in a newline
    ("def add(a, b):\n    ", "return a + b"),  # ... in a newline and the indentation
    ("class Point:\n\tdef __init__(self, x):\n\t\t", "self.x = x"),  # tabs
    ("class Point:\n", "\tdef __init__(self, x):"),
    ("for i in range(10):\n    if i % 2:\n", "        print(i)"),
    ("items = [1, 2, 3]\r\n", "for item in items:"),  # CRLF
    ("Question: What is the capital of France?\nAnswer:", " Paris"),  # the usual " " delimiter
    ("Question: What is the capital of France?\nAnswer: ", "Paris"),  # the space on the context's side
    ("Question: What is the capital of France?\nAnswer:", "Paris"),  # target_delimiter: ""
    ("Question: What is the", "capital"),  # no delimiter, mid-word boundary: BPE merges across it
    ("x = 1  \n\t \n", "y = 2"),  # mixed trailing whitespace
    ("Question: \n", "\n"),  # a whitespace-only continuation
    ("", "Paris"),  # empty context: the prefix token
]


@pytest.fixture(scope="module")
def tok():
    return train_bpe(CODE * 4, vocab_size=330)


@pytest.fixture(scope="module")
def harness_lm(tok):
    """lm-eval's own request path (`TemplateLM.loglikelihood` -> `_encode_pair`) with Schooner's tokenizer;
    `_loglikelihood_tokens` records the token requests it is handed instead of scoring them."""
    from lm_eval.api.model import TemplateLM

    class Recorder(TemplateLM):
        def __init__(self, tokenizer):
            super().__init__()
            self.tok = tokenizer

        @property
        def eot_token_id(self):
            return self.tok.eos_id

        @property
        def prefix_token_id(self):  # as lm-eval's `hf` backend: BOS, else EOS
            return self.tok.bos_id if self.tok.bos_id is not None else self.tok.eos_id

        def tok_encode(self, string, add_special_tokens=None, **kwargs):
            return self.tok.encode(string)

        def _loglikelihood_tokens(self, requests, **kwargs):
            self.seen = [(tuple(ctx), tuple(cont)) for _, ctx, cont in requests]
            return [(0.0, False)] * len(requests)

        def loglikelihood_rolling(self, requests, disable_tqdm=False):
            raise NotImplementedError

        def generate_until(self, requests, disable_tqdm=False):
            raise NotImplementedError

    return Recorder(tok)


def _harness_split(lm, context: str, continuation: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    from lm_eval.api.instance import Instance

    lm.loglikelihood([Instance("loglikelihood", {}, (context, continuation), 0)], disable_tqdm=True)
    (split,) = lm.seen
    return split


@pytest.mark.parametrize(("context", "continuation"), PAIRS)
def test_split_equals_lm_eval(tok, harness_lm, context, continuation):
    want = _harness_split(harness_lm, context, continuation)
    got = encode_pair(tok, context, continuation)
    assert (got.context, got.continuation) == want


def test_all_trailing_whitespace_moves_to_the_continuation(tok):
    # "\n" + the indentation is one pre-token of a byte-level BPE: it is scored with the next line
    r = encode_pair(tok, "def add(a, b):\n    ", "return a + b")
    assert tok.decode(r.context) == "def add(a, b):"
    assert tok.decode(r.continuation) == "\n    return a + b"


def test_the_continuation_is_cut_from_the_whole_string(tok):
    # no delimiter: "the" + "capital" would merge if BPE knows it; the continuation is what follows the
    # context's own tokens in the encoding of the whole string
    r = encode_pair(tok, "Question: What is the", "capital")
    whole = tok.encode("Question: What is the" + "capital")
    assert list(r.context) == tok.encode("Question: What is the")
    assert list(r.continuation) == whole[len(r.context) :]


TEXT = st.text(alphabet=st.sampled_from(list("ab de:()=\n\t\r xyz1")), max_size=24)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(context=TEXT, continuation=TEXT)
def test_split_equals_lm_eval_on_random_text(tok, harness_lm, context, continuation):
    # a whitespace-only context is degenerate in lm-eval (no context token at all); Schooner starts it from
    # the prefix token as it does an empty one
    assume(context.strip() or (context == "" and continuation))
    want = _harness_split(harness_lm, context, continuation)
    assume(want[1])  # lm-eval scores an empty continuation as 0; Schooner refuses it (tested below)
    got = encode_pair(tok, context, continuation)
    assert (got.context, got.continuation) == want


def test_a_continuation_with_no_token_of_its_own_is_an_error(tok):
    with pytest.raises(ValueError, match="no token of its own"):
        encode_pair(tok, "def add(a, b):", "")
