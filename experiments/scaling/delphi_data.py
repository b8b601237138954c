"""The Delphi suite's data: the installed packages' source and docs, a tokenizer, token caches, and a
multiple-choice task from files no run trains on (steps shared by `delphi_suite.py` and its test)."""

import os

from experiments.scaling.cloze import cloze_task
from experiments.scaling.site_packages import current_installed, site_packages_records
from schooner.tokenize.steps import tokenized, train_tokenizer

VOCAB = 1024
TRAIN_BYTES = int(float(os.environ.get("SCHOONER_DELPHI_TRAIN_BYTES", "120e6")))
"""Text collected for training (the rest of site-packages is held out for the task)."""

INSTALLED = os.environ.get("SCHOONER_DELPHI_INSTALLED") or current_installed()
"""The installed distributions the text comes from (part of the data steps' keys). Default: this interpreter's.
On a lent machine with other packages, `experiments/scaling/device/run.sh` sets it to the packed steps' digest
(those steps are built here and never rebuilt there: their step functions refuse another environment)."""

corpus = site_packages_records("data/site-packages", max_bytes=TRAIN_BYTES, installed=INSTALLED)
tokenizer = train_tokenizer(
    "tokenizers/site-packages-bpe-1k", paths=[corpus], vocab_size=VOCAB, max_chars=8_000_000
)
tokens = tokenized(
    "tokenized/site-packages-bpe1k", paths=[corpus], tokenizer=tokenizer, validation_fraction=0.005
)
DATA = {tokens: 1.0}
cloze = cloze_task(
    "tasks/site-packages-cloze",
    skip_bytes=TRAIN_BYTES,
    documents=int(os.environ.get("SCHOONER_DELPHI_DOCS", "150")),
    installed=INSTALLED,
)
