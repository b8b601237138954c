"""The Delphi suite's recipe (`experiments/scaling/delphi_suite.py`), in a module that declares no step, so
that other experiments (`recipe_compare.py`) use the same recipe without declaring the suite's sweep."""

from schooner.train.scaling import BatchRule, HorizonFamily, HorizonRecipe, HorizonRule

SEQ_LEN = 64

# The reference constants: the project's own learning-rate search (docs/scaling-delphi.md: width 64, 2
# layers, 1024 tokens per step, 614,400 tokens, eta0 picked 0.0177; the Adam group at the rule's 1/4 ratio).
RULE = HorizonRule(
    base_learning_rate=0.0177,
    base_adam_learning_rate=0.0044,
    base_batch_tokens=1024,
    base_horizon=614_400,
    base_width=64,
)
RECIPE = HorizonRecipe(
    family=HorizonFamily(vocab_size=1024, head_dim=8, min_width=8, width_step=8, max_width=512),
    horizon=RULE,
    batch=BatchRule(base_sequences=16, base_tokens=6e5, minimum=4, maximum=64),
    seq_len=SEQ_LEN,
    tokens_per_param=20.0,
    min_steps=50,
)
