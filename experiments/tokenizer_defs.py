"""The tokenizers experiments share, as steps (trained once, cached under the prefix like any other step).

`default_tokenizer` is a 2048-token byte-level BPE trained on Schooner's embedded corpus: the Python
standard library's documentation (prose, about 2 million characters, all used) followed by its source code
(the first 4 million of about 10 million characters), so it knows both English and Python. A small
vocabulary suits the tiny models trained on a CPU (less of their compute goes to the output layer). Pass
the handle wherever a tokenizer is expected (`tokenized(..., tokenizer=default_tokenizer)`,
`evaluate(..., tokenizer=default_tokenizer)`); a step using it runs after it, and its output folder holds
`tokenizer.json` (`schooner.tokenize.load_tokenizer(folder)`).

(This module was `experiments/tokenizers.py`, which shadowed Hugging Face's `tokenizers` whenever a script
in experiments/ ran; `experiments.tokenizers` still imports, with a DeprecationWarning, for one release.)
"""

from schooner.data.steps import source_records
from schooner.tokenize.steps import train_tokenizer

python_docs_records = source_records("python-docs")
"""The embedded prose corpus (Python's documentation) as a record folder."""
python_code_records = source_records("python-code")
"""The embedded code corpus (Python's standard library source) as a record folder."""

default_tokenizer = train_tokenizer(
    "tokenizers/python-bpe-2k",
    paths=[python_docs_records, python_code_records],
    vocab_size=2048,
    max_chars=6_000_000,
)
