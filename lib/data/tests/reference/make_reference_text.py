"""Regenerate `schooner/data/curation/_reference_text.json`: what datatrove's quality filters split English
text with, so the rules of `schooner.data.curation` count words, sentences and punctuation as they do:

- the rules of spaCy's blank English tokenizer (prefix, suffix, infix and URL patterns, special cases) and
  the sentence-final characters of its sentencizer (`datatrove.utils.text.split_into_words` and
  `split_into_sentences` run `spacy.blank("en")` with a sentencizer for English);
- datatrove's `PUNCTUATION_SET` (a Gopher word made only of these is a symbol) and `TERMINAL_PUNCTUATION`
  (FineWeb's line endings).

Run with a Python that has datatrove and spaCy, outside the project:

    python3 -m venv /tmp/dt && /tmp/dt/bin/pip install datatrove spacy nltk
    /tmp/dt/bin/python lib/data/tests/reference/make_reference_text.py

spaCy is MIT-licensed (c) Explosion AI; datatrove is Apache-2.0 (c) Hugging Face.
"""

from __future__ import annotations

import json
import pathlib
from importlib.metadata import version

import spacy
from datatrove.utils.text import PUNCTUATION_SET, TERMINAL_PUNCTUATION
from spacy.attrs import ORTH
from spacy.pipeline import Sentencizer

OUT = pathlib.Path(__file__).resolve().parents[2] / "src/schooner/data/curation/_reference_text.json"


def main() -> None:
    tok = spacy.blank("en").tokenizer
    assert tok.token_match is None, "the port assumes English has no token_match"
    data = {
        "source": f"spaCy {spacy.__version__} blank('en') tokenizer and sentencizer (MIT, Explosion AI); "
        f"datatrove {version('datatrove')} utils.text (Apache-2.0, Hugging Face)",
        "prefix": tok.prefix_search.__self__.pattern,
        "suffix": tok.suffix_search.__self__.pattern,
        "infix": tok.infix_finditer.__self__.pattern,
        "url": tok.url_match.__self__.pattern,
        "specials": {orth: [t[ORTH] for t in parts] for orth, parts in sorted(tok.rules.items())},
        "sentence_ends": sorted(Sentencizer.default_punct_chars),
        "punctuation": "".join(sorted(PUNCTUATION_SET)),
        "terminal_punctuation": "".join(sorted(TERMINAL_PUNCTUATION)),
    }
    OUT.write_text(json.dumps(data, ensure_ascii=True, indent=0, sort_keys=True) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
