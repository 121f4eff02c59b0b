"""A deliberately illegal Pallas TPU kernel for the compile tests: its VMEM scratch (256 MiB) exceeds every
TPU's VMEM, so Mosaic rejects it; the body is one tiny copy, so the rejection comes fast."""

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu


def _copy(x_ref, o_ref, big_ref):  # x_ref, o_ref: [8, 128] f32; big_ref: [8192, 8192] f32 (unused)
    o_ref[...] = x_ref[...]


def oversized(x):
    return pl.pallas_call(
        _copy,
        out_shape=jax.ShapeDtypeStruct(x.shape, x.dtype),
        scratch_shapes=[pltpu.VMEM((8192, 8192), jnp.float32)],
    )(x)
