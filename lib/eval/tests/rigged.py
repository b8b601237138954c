"""Models rigged to generate a chosen token sequence, for tests of where generation stops."""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np


def chain_model(model, following: dict[int, int], default: int):
    """`model` (untied embeddings) rigged so that its greedy next token depends on the current token alone:
    `following[t]`, else `default`. Its layers are zeroed (the last hidden state is the token's embedding) and the embeddings are
    one-hot over a class per key of `following` plus one for every other token."""
    dim, vocab = model.config.hidden_dim, model.config.vocab_size
    embed = np.zeros((vocab, dim), np.float32)
    head = np.zeros((vocab, dim), np.float32)
    embed[:, len(following)] = 1.0
    head[default, len(following)] = 10.0
    for c, (token, nxt) in enumerate(following.items()):
        embed[token] = 0.0
        embed[token, c] = 1.0
        head[nxt, c] = 10.0
    rigged = eqx.tree_at(lambda m: m.layers, model, jax.tree.map(jnp.zeros_like, model.layers))
    return eqx.tree_at(
        lambda m: (m.embed.array, m.lm_head.array), rigged, (jnp.asarray(embed), jnp.asarray(head))
    )
