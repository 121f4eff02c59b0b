"""Small kernels whose DMA sizes and loop bounds are read from an SMEM input at run time (for the schedule
tests and the `perfmodel analyze --loop-trips` CLI test, which imports them as MODULE:FUNCTION)."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _smem_sized(loop: bool):
    """A grid-less kernel that reads n from an SMEM input (its whole array) and either copies its first n
    rows of x with one DMA (``loop=False``) or copies 8 rows n times in a fori_loop (``loop=True``)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(n_ref, x_hbm, o_ref, buf, sem):
        n = n_ref[0]
        if loop:
            def step(i, c):
                copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, 8)], buf.at[pl.ds(0, 8)], sem)
                copy.start()
                copy.wait()
                return c
            jax.lax.fori_loop(0, n, step, 0)
        else:
            copy = pltpu.make_async_copy(x_hbm.at[pl.ds(0, n)], buf.at[pl.ds(0, n)], sem)
            copy.start()
            copy.wait()
        o_ref[...] = buf[...]

    def fn(n, x):
        return pl.pallas_call(kernel, out_shape=jax.ShapeDtypeStruct((64, 128), jnp.float32),
                              in_specs=[pl.BlockSpec(memory_space=pltpu.SMEM), pl.BlockSpec(memory_space=pl.ANY)],
                              out_specs=pl.BlockSpec((64, 128), lambda: (0, 0)),
                              scratch_shapes=[pltpu.VMEM((64, 128), jnp.float32), pltpu.SemaphoreType.DMA])(n, x)

    fn.__name__ = "smem_loop_copy" if loop else "smem_sized_copy"
    return fn



smem_sized_copy = _smem_sized(loop=False)
smem_loop_copy = _smem_sized(loop=True)


def tail_copy(x):
    """Grid of 3 steps over x (40 x 128 f32); step i copies rows [16 i, 16 i + size) with one DMA whose size
    min(40 - 16 i, 16) is computed from the program id and marked with pl.multiple_of (as tokamax's kernels
    mark their tail blocks)."""
    from jax.experimental import pallas as pl
    from jax.experimental.pallas import tpu as pltpu

    def kernel(x_hbm, o_ref, buf, sem):
        i = pl.program_id(0)
        size = pl.multiple_of(jnp.minimum(40 - 16 * i, 16), 8)
        copy = pltpu.make_async_copy(x_hbm.at[pl.ds(16 * i, size)], buf.at[pl.ds(0, size)], sem)
        copy.start()
        copy.wait()
        o_ref[...] = buf[...]

    return pl.pallas_call(kernel, grid=(3,), out_shape=jax.ShapeDtypeStruct((48, 128), jnp.float32),
                          in_specs=[pl.BlockSpec(memory_space=pl.ANY)],
                          out_specs=pl.BlockSpec((16, 128), lambda i: (i, 0)),
                          scratch_shapes=[pltpu.VMEM((16, 128), jnp.float32), pltpu.SemaphoreType.DMA])(x)
