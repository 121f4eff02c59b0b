"""Helpers shared by the bundled Pallas TPU kernels."""

from __future__ import annotations

import importlib
import inspect
from typing import Any, Callable, Sequence


def interpret_params(interpret: bool) -> Any:
    """What to pass as ``pallas_call(interpret=...)``.

    ``True`` selects the TPU interpret mode (``pltpu.InterpretParams()``), which
    runs scalar prefetch, semaphores and DMAs on the CPU; ``False`` compiles
    with Mosaic for a real TPU.
    """
    if not interpret:
        return False
    from jax.experimental.pallas import tpu as pltpu

    return pltpu.InterpretParams()


def with_ref_names(kernel: Callable[..., Any], names: Sequence[str]) -> Callable[..., Any]:
    """``kernel`` (which takes its refs positionally, e.g. as ``*refs``) under a signature naming each ref.

    Pallas records a kernel's parameter names in its jaxpr, and profiles,
    ``perfmodel analyze`` / ``tune`` and the interpret-mode traffic recorder
    show them: "w_ref" instead of "refs[1]". ``names`` must list every
    operand of the call in order (scalar prefetch, inputs, outputs, scratch).
    """

    def named_kernel(*refs: Any) -> Any:
        if len(refs) != len(names):
            raise TypeError(f"{kernel_name}: got {len(refs)} refs for {len(names)} names ({', '.join(names)})")
        return kernel(*refs)

    kernel_name = getattr(kernel, "__name__", None) or getattr(getattr(kernel, "func", None), "__name__", "kernel")
    named_kernel.__name__ = named_kernel.__qualname__ = kernel_name
    named_kernel.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_ONLY) for n in names]
    )
    return named_kernel


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` that imports each name from its submodule on first use.

    Lets ``kernels.<name>.blocks`` (block-size tables, no jax) import without
    pulling in the jax-heavy kernel module.
    """

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module '{package}' has no attribute '{name}'")

    return __getattr__


def check_paged_kv_cache(k_pages: Any, v_pages: Any, *, q_heads: int, head_dim: int) -> tuple[int, int]:
    """Validate a head-major paged K/V cache against the queries; returns (kv_heads, page_size).

    Layout ``[kv_heads, num_pages, page_size, head_dim]`` (shared by paged and ragged
    paged attention). Raises ValueError naming ``k_pages`` / ``v_pages``.
    """
    if k_pages.ndim != 4:
        raise ValueError(
            f"k_pages: expected rank 4 [kv_heads, num_pages, page_size, head_dim], got shape {k_pages.shape}"
        )
    if v_pages.shape != k_pages.shape:
        raise ValueError(f"v_pages: shape {v_pages.shape} must equal k_pages' shape {k_pages.shape}")
    if v_pages.dtype != k_pages.dtype:
        raise ValueError(f"v_pages: dtype {v_pages.dtype} must equal k_pages' dtype {k_pages.dtype}")
    kv_heads, _, page_size, kv_head_dim = k_pages.shape
    if kv_head_dim != head_dim:
        raise ValueError(f"k_pages: head_dim {kv_head_dim} does not match q's head_dim {head_dim}")
    if q_heads % kv_heads:
        raise ValueError(
            f"k_pages: kv_heads={kv_heads} does not divide q_heads={q_heads}; "
            "each kv head must serve a whole group of q heads"
        )
    return kv_heads, page_size
