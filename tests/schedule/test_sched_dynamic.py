"""Kernels perfmodel did not write, with run-time grids: JAX's megablox grouped matmul (gmm), whose grid's
middle dimension is the number of active (group, row-tile) pairs computed from the group sizes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas.ops.tpu.megablox import gmm

from perfmodel.errors import InputError
from perfmodel.schedule.analyze import analyze, analyze_call
from perfmodel.schedule.extract import find_pallas_calls, trace
from perfmodel.schedule.recorder import record_traffic

M, K, N, TILE = 512, 256, 256, 128


def _gmm(lhs, rhs, sizes):
    return gmm(lhs, rhs, sizes, tiling=(TILE, TILE, TILE))


@pytest.mark.parametrize("sizes, active", [
    # 4 groups of 128 rows: one row tile each -> 4 active tiles.
    ([128, 128, 128, 128], 4),
    # 100 | 200 | 12 | 200 rows over row tiles [0,128) [128,256) [256,384) [384,512): group 0 [0,100) holds rows
    # of tile 0; group 1 [100,300) of tiles 0-2; group 2 [300,312) of tile 2; group 3 [312,512) of tiles 2-3.
    # gmm visits a tile once per group it holds rows of: 1 + 3 + 1 + 2 = 7.
    ([100, 200, 12, 200], 7),
])
def test_gmm_grid_is_evaluated_from_the_group_sizes(v5e, sizes, active):
    lhs = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((len(sizes), K, N), jnp.bfloat16)
    [kern] = analyze(_gmm, lhs, rhs, np.array(sizes, np.int32), chip=v5e).kernels
    assert kern.grid == (N // TILE, active, K // TILE)


def test_gmm_grid_needs_the_group_sizes_as_values(v5e):
    lhs = jax.ShapeDtypeStruct((M, K), jnp.bfloat16)
    rhs = jax.ShapeDtypeStruct((4, K, N), jnp.bfloat16)
    with pytest.raises(InputError, match="grid size is computed at run time from arguments given only as shapes"):
        analyze(_gmm, lhs, rhs, jax.ShapeDtypeStruct((4,), jnp.int32), chip=v5e)


@pytest.mark.parametrize("sizes", [[128, 128, 128, 128], [100, 200, 12, 200]])
def test_gmm_transfers_equal_the_interpreter_run(v5e, sizes):
    rng = np.random.default_rng(0)
    lhs = jnp.asarray(rng.standard_normal((M, K)), jnp.bfloat16)
    rhs = jnp.asarray(rng.standard_normal((len(sizes), K, N)), jnp.bfloat16)
    group_sizes = jnp.asarray(sizes, jnp.int32)
    rec = record_traffic(_gmm, lhs, rhs, group_sizes)
    [call] = find_pallas_calls(trace(_gmm, lhs, rhs, group_sizes), (lhs, rhs, group_sizes))
    kern = analyze_call(call, v5e, order=np.array(rec.grid_points))
    assert kern.steps == len(rec.grid_points)
    for o in kern.operands:
        if o.pipelined:
            assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name), o.name
