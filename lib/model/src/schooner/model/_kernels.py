"""The one backend switch of the model's kernels: ``LlamaConfig.kernels``.

Three code paths compute the same model:

- ``"xla"``, the plain path, for GPUs and TPUs: ``hax.dot`` products with ``preferred_element_type``
  (float32 logits from 16-bit operands), plain autodiff everywhere, ``jax.nn.dot_product_attention``
  (cuDNN flash attention on NVIDIA when it applies), and an output cross-entropy computed by chunks whose
  logits the backward recomputes (``jax.checkpoint``), so nothing of size [tokens, vocab] is held.
- ``"tpu"``, the ``"xla"`` path with jax's Pallas TPU kernels where XLA alone is slow or holds too much:
  splash attention (flash attention with block skipping: no [T, T] scores in HBM; ``_splash.py``) and, where
  ``MoEConfig.grouped_matmul="megablox"`` asks, the megablox grouped matmul for mixture-of-experts layers
  (``_moe.py``; ``jax.lax.ragged_dot`` by default, measured faster). Off a TPU these kernels run through
  Pallas's interpreter (same math, slowly): that is how the CPU tests check them.
- ``"cpu"``, tuned for XLA:CPU and measured there (see the model README): matrix products flattened to 2-D
  GEMMs with a hand-written 16-bit backward that keeps the transposed operand (XLA:CPU's fast bf16 kernels
  take only canonical [M, K] x [K, N] products), optimization barriers that stop XLA folding transposes back
  into products, float32 accumulation of 16-bit GEMMs, blocked causal attention in float32, and the fused
  output cross-entropy with a hand-written backward that keeps the softmax in the compute dtype.

``"auto"`` (the default) picks ``"cpu"`` on the CPU backend, ``"tpu"`` on TPUs and ``"xla"`` elsewhere. This module is the only
place that asks jax which backend it runs on; the choice is made once per trace, in
:meth:`Transformer.hidden_states`, and passed down explicitly.
"""

from __future__ import annotations

KERNELS = ("auto", "cpu", "xla", "tpu")


def platform() -> str:
    """The default jax backend (``"cpu"``, ``"gpu"``, ``"tpu"``...)."""
    import jax

    return jax.default_backend()


def resolve_kernels(kernels: str) -> str:
    """``"cpu"``, ``"xla"`` or ``"tpu"``: ``kernels`` itself, or for ``"auto"`` the path of the default
    backend."""
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}; got {kernels=!r}.")
    if kernels == "auto":
        return {"cpu": "cpu", "tpu": "tpu"}.get(platform(), "xla")
    return kernels


def pallas_interpret() -> bool:
    """Whether the Pallas TPU kernels of the ``"tpu"`` path run through the interpreter (not on a TPU)."""
    return platform() != "tpu"


def resolve_attention(implementation: str | None, kernels: str) -> str | None:
    """The attention implementation a resolved ``kernels`` path uses: ``implementation`` when set, else
    ``"blocked"`` on the CPU path, ``"splash"`` on the TPU path, and jax's choice (None) on the XLA path."""
    if implementation is not None:
        return implementation
    return {"cpu": "blocked", "tpu": "splash"}.get(kernels)
