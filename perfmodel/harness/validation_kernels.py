"""Pallas TPU kernels that reproduce published measurements perfmodel validates against.

The JAX Pallas TPU matmul guide times two variants of its tiled matmul on TPU v5e besides the plain one
(which is ``jax.experimental.pallas.ops.tpu.matmul``): the right-hand side stored transposed, ``[N, K]``,
contracted on its last dimension in the kernel, and a ReLU applied to the f32 accumulator before the last
K step writes the output. :func:`tiled_matmul` is that kernel family: grid ``(M/bm, N/bn, K/bk)`` with K
innermost and "arbitrary", an f32 ``[bm, bn]`` VMEM accumulator zeroed on the first K step and stored (cast
to the input dtype) on the last. Only shapes that the blocks divide are accepted.
"""

from __future__ import annotations

from typing import Any


def tiled_matmul(x: Any, y: Any, *, bm: int = 512, bk: int = 1024, bn: int = 1024, transpose_rhs: bool = False,
                 activation: str = "none", interpret: bool = False) -> Any:
    """``act(x @ y)`` (``y`` is ``[K, N]``) or ``act(x @ y.T)`` with ``transpose_rhs`` (``y`` is ``[N, K]``)."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    m, k = x.shape
    n = y.shape[0] if transpose_rhs else y.shape[1]
    if (y.shape[1] if transpose_rhs else y.shape[0]) != k:
        raise ValueError(f"y: shape {y.shape} does not contract with x {x.shape} (transpose_rhs={transpose_rhs})")
    for name, dim, block in (("bm", m, bm), ("bk", k, bk), ("bn", n, bn)):
        if dim % block:
            raise ValueError(f"{name}: {block} does not divide {dim}; pick a divisor")
    if activation not in ("none", "relu"):
        raise ValueError(f"activation: '{activation}' is not one of none, relu")
    nk = k // bk
    rhs_dims = ((1,), (1,)) if transpose_rhs else ((1,), (0,))

    def kernel(x_ref, y_ref, o_ref, acc_ref):  # x_ref [bm, bk]; y_ref [bn, bk] or [bk, bn]; o_ref [bm, bn]
        kk = pl.program_id(2)

        @pl.when(kk == 0)
        def _zero():
            acc_ref[...] = jnp.zeros_like(acc_ref)

        acc_ref[...] += jax.lax.dot_general(x_ref[...], y_ref[...], (rhs_dims, ((), ())),
                                            preferred_element_type=jnp.float32)  # [bm, bn]

        @pl.when(kk == nk - 1)
        def _store():
            acc = acc_ref[...]
            if activation == "relu":
                acc = jnp.maximum(acc, 0.0)
            o_ref[...] = acc.astype(o_ref.dtype)

    y_spec = (pl.BlockSpec((bn, bk), lambda i, j, kk: (j, kk)) if transpose_rhs
              else pl.BlockSpec((bk, bn), lambda i, j, kk: (kk, j)))
    return pl.pallas_call(
        kernel,
        grid=(m // bm, n // bn, nk),
        in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)), y_spec],
        out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
        out_shape=jax.ShapeDtypeStruct((m, n), x.dtype),
        scratch_shapes=[pltpu.VMEM((bm, bn), jnp.float32)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        name="tiled_matmul",
        interpret=interpret,
    )(x, y)


def tiled_matmul_reference(x: Any, y: Any, *, transpose_rhs: bool = False, activation: str = "none", **_: Any) -> Any:
    import jax.numpy as jnp

    out = jnp.dot(x, y.T if transpose_rhs else y, preferred_element_type=jnp.float32)
    if activation == "relu":
        out = jnp.maximum(out, 0.0)
    return out.astype(x.dtype)


