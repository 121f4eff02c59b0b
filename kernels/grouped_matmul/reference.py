"""Pure-jnp reference of the grouped matmul kernel (f32 math throughout)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp


def grouped_matmul_reference(lhs: jax.Array, rhs: jax.Array, group_sizes: jax.Array, *,
                             rhs_scale: jax.Array | None = None, out_dtype: Any = None) -> jax.Array:
    """``out[r] = lhs[r] @ (rhs[g] * rhs_scale[g])`` for each row r of group g (groups own consecutive rows in
    order, ``group_sizes[g]`` each); rows past the groups are zero. f32 math, cast to out_dtype (default lhs's)."""
    out_dtype = lhs.dtype if out_dtype is None else out_dtype
    ends = jnp.cumsum(group_sizes.astype(jnp.int32))
    row_group = jnp.searchsorted(ends, jnp.arange(lhs.shape[0], dtype=jnp.int32), side="right")
    w = rhs.astype(jnp.float32)
    if rhs_scale is not None:
        w = w * rhs_scale.astype(jnp.float32)[:, None, :]
    x = lhs.astype(jnp.float32)
    out = jnp.zeros((lhs.shape[0], rhs.shape[2]), jnp.float32)
    for g in range(rhs.shape[0]):  # every row through every group's weights, kept where the row is the group's
        y = jnp.dot(x, w[g], precision=jax.lax.Precision.HIGHEST)
        out = jnp.where((row_group == g)[:, None], y, out)
    return out.astype(out_dtype)
