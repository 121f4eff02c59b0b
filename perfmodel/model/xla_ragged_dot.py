"""XLA's own TPU kernel for ``jax.lax.ragged_dot`` (a row-ragged lhs against per-group weights): the tiles it
picks and the work they imply.

XLA lowers ``ragged_dot_general`` with a ragged lhs and grouped rhs to two Mosaic kernels: ``ragged-dot-metadata``
(which tile of rows belongs to which group) and ``ragged-dot-none``, a Pallas-style kernel whose grid is (column
tiles, row-tile visits, contraction tiles) and whose blocks are lhs [tile_m, tile_k], rhs [1, tile_k, tile_n] and
out [tile_m, tile_n] (the ``ragged_dot_tiling`` attribute of the compiled HLO, and the kernel's window bounds).
A row tile that holds rows of several groups is visited once per group (:func:`perfmodel.model.gemm.tile_visits`),
each visit a full tile_m x tile_k x tile_n matmul; every column tile reads all of lhs again.

How the tiles are picked (read off libtpu 0.0.42.1's deviceless compiles of 58 shapes on v4, v5e, v5p, v6e and
7x: the 38 row-ragged tokamax shapes of the calibration subset and 20 probes, f32 and bf16 results; no timing
is involved):

* ``tile_m`` = the MXU edge (128 or 256), or the rows rounded up to 8 when fewer;
* ``tile_n`` = the widest multiple of the MXU edge (at most N rounded up to it) whose double-buffered lhs, rhs
  and out blocks plus two f32 temporaries per output element (the matmul result and the masked merge) stay
  under the chip's default scoped VMEM limit less :data:`VMEM_RESERVE_BYTES`;
* ``tile_k`` = K, or where not even one MXU-edge column tile fits, the longest multiple of the MXU edge that
  does (K then takes several grid steps, the last one padded).
"""

from __future__ import annotations

from dataclasses import dataclass

#: VMEM the kernel's tiles leave free below the chip's default scoped limit: the same 8 MiB on all five chips
#: compiled (v4, v5e, v5p: 16 MiB limits, 8 MiB of tiles; v6e, 7x: 32 MiB, 24 MiB); the tiles' bytes stay
#: strictly below the difference (e.g. 7x, K = 256, f32 out: 4608 columns use 23.0 MiB, 4864 would use 24 MiB).
VMEM_RESERVE_BYTES = 8 * 2**20
#: f32 temporaries per output element besides the double-buffered out block (the matmul result, the merge).
TEMP_BYTES_PER_OUT_ELEMENT = 8


@dataclass(frozen=True, kw_only=True)
class XlaRaggedDotTiling:
    """The tiles of XLA's ragged-dot kernel for one call, and its grid."""

    tile_m: int
    tile_k: int
    tile_n: int
    #: Column tiles (the grid's first dimension) and contraction tiles (its last).
    n_tiles: int
    k_tiles: int


def _tile_bytes(tm: int, tk: int, tn: int, lhs_b: int, rhs_b: int, out_b: int) -> int:
    return 2 * tm * tk * lhs_b + 2 * tk * tn * rhs_b + tm * tn * (2 * out_b + TEMP_BYTES_PER_OUT_ELEMENT)


def xla_ragged_dot_tiling(chip: object, *, m: int, k: int, n: int, lhs_itemsize: int, rhs_itemsize: int,
                          out_itemsize: int) -> XlaRaggedDotTiling | None:
    """The tiles XLA picks on ``chip`` for lhs [m, k] x rhs [G, k, n] with out [m, n]; None for a chip without
    a default scoped VMEM limit (GPUs, TPU v2/v3: no such kernel known)."""
    cores = getattr(chip, "cores", None)
    memory = getattr(chip, "memory", None)
    limit = getattr(memory, "vmem_default_scoped_limit_bytes_per_core", None)
    edge = getattr(cores, "mxu_dim", None)
    if getattr(chip, "kind", None) != "tpu" or not limit or not edge:
        return None
    budget = int(limit) - VMEM_RESERVE_BYTES
    edge = int(edge)
    tm = min(edge, -(-m // 8) * 8)
    n_cap = -(-n // edge) * edge
    sizes = (lhs_itemsize, rhs_itemsize, out_itemsize)
    if _tile_bytes(tm, k, edge, *sizes) < budget:
        tk = k
        tn = edge
        while tn + edge <= n_cap and _tile_bytes(tm, k, tn + edge, *sizes) < budget:
            tn += edge
    else:
        tn = edge
        tk = edge
        while _tile_bytes(tm, tk + edge, tn, *sizes) < budget:
            tk += edge
    return XlaRaggedDotTiling(tile_m=tm, tile_k=tk, tile_n=tn, n_tiles=-(-n // tn), k_tiles=-(-k // tk))
