"""The one backend switch of the model's kernels: ``LlamaConfig.kernels``.

Three code paths compute the same model:

- ``"xla"``, the plain path, for GPUs and TPUs: ``hax.dot`` products with ``preferred_element_type``
  (float32 logits from 16-bit operands), plain autodiff everywhere, and an output cross-entropy computed by
  chunks whose logits the backward recomputes (``jax.checkpoint``), so nothing of size [tokens, vocab] is
  held. On an NVIDIA GPU its attention is cuDNN flash attention (``"cudnn"``, ``_cudnn.py``: causal,
  grouped-query, documents through cuDNN's packed layout; the blocked path, with a log line, where cuDNN
  cannot take the shape) and its experts' grouped matmuls are the Pallas Triton kernel of ``_gmm.py``.
  Elsewhere (a CPU asked for ``"xla"``) attention is ``jax.nn.dot_product_attention``'s XLA path, which
  holds float32 scores [B, heads, T, T]: jax's ``implementation=None`` is XLA, not cuDNN (jax 0.10-0.11).
- ``"tpu"``, the ``"xla"`` path with jax's Pallas TPU kernels where XLA alone is slow or holds too much:
  splash attention (flash attention with block skipping: no [T, T] scores in HBM; ``_splash.py``) and, where
  ``MoEConfig.grouped_matmul="megablox"`` asks, the megablox grouped matmul for mixture-of-experts layers
  (``_moe.py``; ``jax.lax.ragged_dot`` by default, measured faster). On the CPU these kernels run through
  Pallas's interpreter (same math, slowly): that is how the CPU tests check them. On any other accelerator
  (a GPU) they are refused: the interpreter there would be silently slow.
- ``"cpu"``, tuned for XLA:CPU and measured there (see the model README): matrix products flattened to 2-D
  GEMMs with a hand-written 16-bit backward that keeps the transposed operand (XLA:CPU's fast bf16 kernels
  take only canonical [M, K] x [K, N] products), optimization barriers that stop XLA folding transposes back
  into products, float32 accumulation of 16-bit GEMMs, blocked causal attention in float32, and the fused
  output cross-entropy with a hand-written backward that keeps the softmax in the compute dtype.

``"auto"`` (the default) picks ``"cpu"`` on the CPU backend, ``"tpu"`` on TPUs and ``"xla"`` elsewhere. This
module is the only place that asks jax which backend it runs on; the choice is made once per trace, in
:meth:`Transformer.hidden_states`, and passed down explicitly. Each function takes ``backend`` (default: jax's
default backend) so the choices a GPU makes are testable on a CPU.
"""

from __future__ import annotations

KERNELS = ("auto", "cpu", "xla", "tpu")


def platform() -> str:
    """The default jax backend (``"cpu"``, ``"gpu"``, ``"tpu"``...)."""
    import jax

    return jax.default_backend()


def _backend(backend: str | None) -> str:
    return platform() if backend is None else backend


def resolve_kernels(kernels: str, *, backend: str | None = None) -> str:
    """``"cpu"``, ``"xla"`` or ``"tpu"``: ``kernels`` itself, or for ``"auto"`` the path of the backend.

    Raises:
        ValueError: an unknown value, or ``"tpu"`` on an accelerator that is not a TPU (its Pallas TPU kernels
            would run through the interpreter there).
    """
    if kernels not in KERNELS:
        raise ValueError(f"kernels must be one of {KERNELS}; got {kernels=!r}.")
    backend = _backend(backend)
    if kernels == "auto":
        return {"cpu": "cpu", "tpu": "tpu"}.get(backend, "xla")
    if kernels == "tpu":
        refuse_interpreter("LlamaConfig.kernels='tpu'", backend)
    return kernels


def refuse_interpreter(setting: str, backend: str | None = None) -> None:
    """Raise unless Pallas TPU kernels can run here: compiled on a TPU, interpreted on the CPU (tests).

    On another accelerator (a GPU) the interpreter would run every kernel as a slow loop of XLA ops, silently;
    the error names ``setting`` and the fix.
    """
    backend = _backend(backend)
    if backend not in ("tpu", "cpu"):
        raise ValueError(
            f"{setting} runs jax's Pallas TPU kernels, which on a {backend} backend would run through the "
            "Pallas interpreter (correct but very slow). Use kernels='auto' or 'xla' (and leave "
            "attention_implementation=None, grouped_matmul='auto') on this backend."
        )


def pallas_interpret(backend: str | None = None) -> bool:
    """Whether the Pallas TPU kernels of the ``"tpu"`` path run through the interpreter: False on a TPU, True
    on the CPU; refused (:func:`refuse_interpreter`) elsewhere."""
    backend = _backend(backend)
    refuse_interpreter(
        "a Pallas TPU kernel (kernels='tpu', attention 'splash' or grouped_matmul 'megablox')", backend
    )
    return backend != "tpu"


def triton_interpret(backend: str | None = None) -> bool:
    """Whether the Pallas Triton (GPU) kernels run through the interpreter: False on a GPU, True on the CPU
    (tests); refused on a TPU, where they cannot be compiled (use ``grouped_matmul='auto'`` there)."""
    backend = _backend(backend)
    if backend not in ("gpu", "cuda", "cpu"):
        raise ValueError(
            f"grouped_matmul='triton' is a Pallas Triton (GPU) kernel; on a {backend} backend it cannot be "
            "compiled. Use grouped_matmul='auto' (or 'ragged_dot')."
        )
    return backend == "cpu"


def gpu_compute_capability(backend: str | None = None) -> tuple[int, int] | None:
    """(major, minor) of the first GPU (``(9, 0)`` on an H100/H200), or None off an NVIDIA GPU."""
    if _backend(backend) not in ("gpu", "cuda"):
        return None
    import jax

    cap = getattr(jax.devices()[0], "compute_capability", None)
    if not cap:
        return None
    major, _, minor = str(cap).partition(".")
    return int(major), int(minor or 0)


def resolve_attention(implementation: str | None, kernels: str, *, backend: str | None = None) -> str | None:
    """The attention implementation a resolved ``kernels`` path uses: ``implementation`` when set, else
    ``"blocked"`` on the CPU path, ``"splash"`` on the TPU path, ``"cudnn"`` on the XLA path on a GPU and
    jax's XLA attention (None) on the XLA path elsewhere.

    Raises:
        ValueError: ``"splash"`` on an accelerator that is not a TPU (:func:`refuse_interpreter`).
    """
    backend = _backend(backend)
    if implementation == "splash":
        refuse_interpreter("attention_implementation='splash'", backend)
    if implementation is not None:
        return implementation
    if kernels == "xla" and backend in ("gpu", "cuda"):
        return "cudnn"
    return {"cpu": "blocked", "tpu": "splash"}.get(kernels)


def resolve_grouped_matmul(implementation: str, kernels: str, *, backend: str | None = None) -> str:
    """The experts' grouped matmul: ``implementation`` when set, else (``"auto"``) the Pallas Triton kernel
    (``"triton"``) on the XLA path on a GPU and ``jax.lax.ragged_dot`` elsewhere. ``"megablox"`` applies on
    the TPU path only (``ragged_dot`` on the others, as before)."""
    backend = _backend(backend)
    if implementation == "auto":
        return "triton" if kernels == "xla" and backend in ("gpu", "cuda") else "ragged_dot"
    if implementation == "megablox":
        return "megablox" if kernels == "tpu" else "ragged_dot"
    if implementation == "triton":
        triton_interpret(backend)
    return implementation
