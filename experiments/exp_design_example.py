"""The experiment of DESIGN.md ("The experiment a user writes"), exactly as written there.

    uv run schooner run experiments/exp_design_example.py

Tokenizes the embedded Python documentation with the shared default tokenizer and trains a nano Llama on it
for 200 steps. The tutorial (`experiments/tutorials/train_tiny_model.py`) is the fuller, faster version of
this, with a two-source mixture, an evaluation step and a report.
"""

from experiments.models import llama_nano
from experiments.tokenizer_defs import default_tokenizer
from schooner.cluster import ResourceConfig, StepRunner, lower
from schooner.tokenize.steps import tokenized
from schooner.train import AdamConfig
from schooner.train.steps import train_lm

# A lazy handle: nothing is read or tokenized yet.
docs = tokenized(name="tokenized/python-docs", source="python-docs", tokenizer=default_tokenizer)

# Depends on `docs`; runs after it. Resources are runtime-only: they do not change the step's identity.
model = train_lm(
    name="checkpoints/nano-python-docs",
    model=llama_nano,
    optimizer=AdamConfig(learning_rate=6e-4, weight_decay=0.1),
    datasets={docs: 1.0},
    batch_size=8,
    seq_len=256,
    num_train_steps=200,
    resources=ResourceConfig.with_cpu(),
)

if __name__ == "__main__":
    StepRunner().main([lower(model)])
