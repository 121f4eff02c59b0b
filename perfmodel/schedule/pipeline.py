"""Pallas TPU pipeline simulation over the whole grid, vectorized.

Pallas' TPU pipeline keeps two buffers per blocked operand. At each grid step
it fetches an input's block only if the block index differs from the
previous step's (the first step of a core always fetches), and writes an
output's block back only when the next step's index differs (or the core's
last step is reached). While step t computes, the DMA engine brings in step
t+1's changed inputs and writes back step t-1's finished outputs.

All functions take the block indices of every step at once (``(n, ndim)``
arrays, in traversal order) and a :class:`Segments` describing which steps
each TensorCore runs, and return numpy arrays; no Python loop over steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass(frozen=True, kw_only=True)
class Segments:
    """The traversal split into per-core sequences (contiguous runs of steps)."""

    #: True at the first step of each core's sequence.
    starts: np.ndarray
    #: True at the last step of each core's sequence.
    ends: np.ndarray
    #: Core id of each step.
    core: np.ndarray
    cores: int



def leading_parallel(semantics: Sequence[str]) -> int:
    """How many leading grid dimensions are "parallel" (what a megacore chip splits over its TensorCores)."""
    count = 0
    for s in semantics:
        if "parallel" not in s:
            break
        count += 1
    return count

def split_over_cores(grid: Sequence[int], semantics: Sequence[str], cores: int) -> Segments:
    """Steps per core when the leading "parallel" dimensions are split over ``cores``.

    As in Pallas' TPU interpreter (and Mosaic on megacore chips), the
    parallel dimensions form a prefix of the grid; the points of that
    sub-grid are divided into ``cores`` contiguous chunks (rounded up), each
    followed by all of the remaining "arbitrary" dimensions.
    """
    grid = tuple(int(g) for g in grid)
    n = int(np.prod(grid)) if grid else 1
    parallel = leading_parallel(semantics)
    outer = int(np.prod(grid[:parallel])) if parallel else 1
    if cores <= 1 or outer <= 1:
        return single_segment(n)
    inner = n // outer
    per_core = -(-outer // cores)
    core = (np.arange(n) // inner) // per_core
    starts = np.zeros(n, dtype=bool)
    starts[0] = True
    starts[1:] = core[1:] != core[:-1]
    ends = np.zeros(n, dtype=bool)
    ends[-1] = True
    ends[:-1] = core[1:] != core[:-1]
    return Segments(starts=starts, ends=ends, core=core, cores=int(core.max()) + 1)


@dataclass(frozen=True, kw_only=True)
class Traversal:
    """The steps the model evaluates, standing for the whole traversal.

    A grid whose leading dimensions only pick *which* blocks a step works on (the body never reads their
    program ids, and every operand's block index either equals each of them or ignores all of them) repeats
    one *period* (the steps of the remaining dimensions) per leading index: every period of a TensorCore's
    sequence other than its first and last moves the same bytes and does the same work at the same steps.
    Such a traversal is evaluated on each core's first, one middle and last period; ``mult`` says how many
    steps of the full traversal each evaluated step stands for.
    """

    #: ``(n, ndim)`` grid points of the evaluated steps, in traversal order.
    points: np.ndarray
    seg: Segments
    #: Full-traversal steps each evaluated step stands for (None: the traversal is complete).
    mult: np.ndarray | None = None
    #: Evaluated period of each step (None: the traversal is complete).
    period: np.ndarray | None = None
    #: Steps of the full traversal.
    steps: int

    def total(self, x: "np.ndarray | float") -> float:
        """Sum over the full traversal of a per-step value (an ``(n,)`` array or a scalar per step)."""
        n = self.points.shape[0]
        arr = np.broadcast_to(np.asarray(x, dtype=float), (n,))
        return float(np.sum(arr if self.mult is None else arr * self.mult))

    def count(self, mask: np.ndarray) -> int:
        """Steps of the full traversal where ``mask`` (per evaluated step) holds."""
        return int(np.count_nonzero(mask)) if self.mult is None else int(np.sum(self.mult[mask]))


def full_traversal(points: np.ndarray, seg: Segments) -> Traversal:
    return Traversal(points=points, seg=seg, steps=int(points.shape[0]))


#: A periodic traversal is evaluated on its representative periods only when they are at most this share
#: of its steps.
PERIODIC_MAX_SHARE = 0.5


def periodic_traversal(grid: Sequence[int], semantics: Sequence[str], cores: int, leading: int) -> Traversal | None:
    """The representative periods of a traversal whose first ``leading`` grid dimensions are periodic (see
    :class:`Traversal`), split over ``cores`` as :func:`split_over_cores` does; None when that saves little
    or a core's share would end inside a period."""
    from perfmodel.schedule.indexmaps import grid_points

    grid = tuple(int(g) for g in grid)
    n = int(np.prod(grid)) if grid else 1
    if leading <= 0 or n == 0:
        return None
    periods = int(np.prod(grid[:leading]))
    period = n // periods
    parallel = leading_parallel(semantics)
    outer = int(np.prod(grid[:parallel])) if parallel else 1
    if cores <= 1 or outer <= 1:
        per_core = periods
    else:
        chunk = -(-outer // cores) * (n // outer)  # steps per core
        if chunk % period:
            return None
        per_core = chunk // period
    reps: list[tuple[int, int, int]] = []  # (period, multiplicity, core)
    for core, k0 in enumerate(range(0, periods, per_core)):
        k1 = min(k0 + per_core, periods)
        if k1 - k0 <= 3:
            reps += [(k, 1, core) for k in range(k0, k1)]
        else:
            reps += [(k0, 1, core), (k0 + 1, k1 - k0 - 2, core), (k1 - 1, 1, core)]
    m = len(reps) * period
    if m > PERIODIC_MAX_SHARE * n:
        return None
    inner = grid_points(grid[leading:]) if leading < len(grid) else np.zeros((1, 0), dtype=np.int32)
    outer_idx = np.stack(np.unravel_index(np.array([k for k, _, _ in reps]), grid[:leading]), axis=1).astype(np.int32)
    points = np.concatenate([np.concatenate([np.broadcast_to(o, (period, leading)), inner], axis=1)
                             for o in outer_idx])
    core = np.repeat(np.array([c for _, _, c in reps], dtype=np.int64), period)
    starts = np.zeros(m, dtype=bool)
    ends = np.zeros(m, dtype=bool)
    starts[0] = True
    starts[1:] = core[1:] != core[:-1]
    ends[-1] = True
    ends[:-1] = core[1:] != core[:-1]
    return Traversal(points=points, seg=Segments(starts=starts, ends=ends, core=core, cores=int(core.max()) + 1),
                     mult=np.repeat(np.array([w for _, w, _ in reps], dtype=np.int64), period),
                     period=np.repeat(np.arange(len(reps), dtype=np.int64), period), steps=n)


def single_segment(n: int) -> Segments:
    starts = np.zeros(n, dtype=bool)
    ends = np.zeros(n, dtype=bool)
    if n:
        starts[0] = True
        ends[-1] = True
    return Segments(starts=starts, ends=ends, core=np.zeros(n, dtype=np.int64), cores=1)


Columns = Sequence[np.ndarray]


def as_columns(indices: "np.ndarray | Columns") -> list[np.ndarray]:
    """Block indices as one ``(n,)`` array per dimension (a 2-D ``(n, ndim)`` array is split)."""
    if isinstance(indices, np.ndarray):
        return [indices[:, d] for d in range(indices.shape[1])]
    return list(indices)


def _is_constant(col: np.ndarray) -> bool:
    """A column broadcast from one value (an index map returning a literal)."""
    return col.ndim == 1 and (col.shape[0] <= 1 or col.strides[0] == 0)


def window_bytes(cols: Columns, block_shape: Sequence[int], block_kinds: Sequence[str], array_shape: Sequence[int],
                 itemsize_bytes: int, n: int) -> np.ndarray:
    """In-bounds bytes of each step's window (partial edge blocks move only their valid part).

    A window starts at block index x block size for blocked dimensions and at
    the index itself for squeezed / element (and, approximately,
    bounded-slice / indirect) ones. Only dimensions where a window can
    overhang the array are computed per step; the rest contribute their full
    block size.
    """
    full = 1
    partial = []
    for col, b, kind, dim in zip(cols, block_shape, block_kinds, array_shape):
        scale = b if kind == "blocked" else 1
        lo, hi = (int(col[0]), int(col[0])) if _is_constant(col) else (int(col.min()), int(col.max()))
        if n and (lo < 0 or hi * scale + b > dim):
            partial.append((col, scale, b, dim))
        else:
            full *= int(b)
    out = np.full(n, full * itemsize_bytes, dtype=np.int64)
    for col, scale, b, dim in partial:
        out *= np.clip(np.minimum(b, dim - col.astype(np.int64) * scale), 0, None)
    return out


def window_keys(cols: Columns, n: int) -> tuple[np.ndarray, int]:
    """One int64 per step identifying its window, and the size of the key space."""
    key = np.zeros(n, dtype=np.int64)
    space = 1
    for col in cols:
        if _is_constant(col):
            continue  # contributes nothing to telling windows apart
        c = col.astype(np.int64, copy=False)
        if int(c.min()) < 0:
            c = np.clip(c, 0, None)
        radix = int(c.max()) + 1
        if space > 1:
            key *= radix
        key += c
        space *= radix
    return key, space


def changed_from_previous(keys: np.ndarray, seg: Segments) -> np.ndarray:
    """True where the window differs from the previous step's, or a core's sequence begins."""
    out = np.ones(keys.shape[0], dtype=bool)
    np.not_equal(keys[1:], keys[:-1], out=out[1:])
    return out | seg.starts


def changes_next(keys: np.ndarray, seg: Segments) -> np.ndarray:
    """True where the next step's window differs, or a core's sequence ends (write-back points)."""
    out = np.ones(keys.shape[0], dtype=bool)
    np.not_equal(keys[1:], keys[:-1], out=out[:-1])
    return out | seg.ends


#: Key spaces up to this size use a dense scatter instead of a sort to find distinct windows.
DENSE_KEY_SPACE = 1 << 26


def distinct_window_bytes(keys: np.ndarray, space: int, moved: np.ndarray, nbytes: np.ndarray) -> int:
    """Bytes of the distinct windows among the steps that moved one: each byte once."""
    k = keys[moved]
    if k.shape[0] == 0:
        return 0
    b = nbytes[moved]
    if space <= DENSE_KEY_SPACE:
        per_key = np.zeros(space, dtype=np.int64)
        per_key[k] = b
        return int(per_key.sum())
    _, first = np.unique(k, return_index=True)
    return int(b[first].sum())


@dataclass(frozen=True, kw_only=True)
class BlockTraffic:
    """Per-step traffic of one operand."""

    #: Bytes moved at each step (fetch for inputs, write-back for outputs), 0 where nothing moves.
    step_bytes: np.ndarray
    transfers: int
    total_bytes: int
    ideal_bytes: int


def simulate_block(indices: "np.ndarray | Columns", *, role: str, block_shape: Sequence[int],
                   block_kinds: Sequence[str], array_shape: Sequence[int], itemsize_bytes: int,
                   seg: Segments, traversal: Traversal | None = None, per_period: bool = False) -> BlockTraffic:
    """Fetches (inputs) or write-backs (outputs) of one pipelined operand over the traversal.

    ``indices``: the block indices at every step, as ``(n, ndim)`` or one ``(n,)`` column per dimension.
    ``traversal``: when it evaluates representative periods only, the totals stand for the full traversal;
    ``per_period``: the operand's windows differ from period to period (its block index follows the
    periodic dimensions), else every period uses the same windows.
    """
    n = seg.starts.shape[0]
    cols = [np.broadcast_to(np.asarray(c), (n,)) for c in as_columns(indices)]
    nbytes = window_bytes(cols, block_shape, block_kinds, array_shape, itemsize_bytes, n)
    keys, space = window_keys(cols, n)
    moved = changed_from_previous(keys, seg) if role == "input" else changes_next(keys, seg)
    step_bytes = np.where(moved, nbytes, 0)
    if traversal is None or traversal.mult is None:
        return BlockTraffic(
            step_bytes=step_bytes,
            transfers=int(np.count_nonzero(moved)),
            total_bytes=int(step_bytes.sum()),
            ideal_bytes=distinct_window_bytes(keys, space, moved, nbytes),
        )
    if per_period:
        ideal = 0
        for p in range(int(traversal.period[-1]) + 1):
            sel = traversal.period == p
            ideal += int(traversal.mult[sel][0]) * distinct_window_bytes(keys[sel], space, moved[sel], nbytes[sel])
    else:
        ideal = distinct_window_bytes(keys, space, moved, nbytes)
    return BlockTraffic(
        step_bytes=step_bytes,
        transfers=traversal.count(moved),
        total_bytes=int(np.sum(step_bytes * traversal.mult)),
        ideal_bytes=ideal,
    )


@dataclass(frozen=True, kw_only=True)
class DmaSchedule:
    """When the pipeline's DMAs happen relative to the compute steps."""

    #: Bytes in flight while step t computes: step t+1's fetches + step t-1's write-backs.
    overlapped_bytes: np.ndarray
    #: Per core: fetches before its first step (not overlapped).
    prologue_bytes: np.ndarray
    #: Per core: write-backs after its last step (not overlapped).
    epilogue_bytes: np.ndarray


def dma_schedule(fetch_bytes: np.ndarray, writeback_bytes: np.ndarray, seg: Segments) -> DmaSchedule:
    """Place fetches one step early and write-backs one step late, within each core's sequence."""
    n = fetch_bytes.shape[0]
    over = np.zeros(n, dtype=np.float64)
    if n > 1:
        over[:-1] += np.where(seg.starts[1:], 0, fetch_bytes[1:])
        over[1:] += np.where(seg.starts[1:], 0, writeback_bytes[:-1])
    prologue = np.bincount(seg.core[seg.starts], weights=fetch_bytes[seg.starts], minlength=seg.cores)
    epilogue = np.bincount(seg.core[seg.ends], weights=writeback_bytes[seg.ends], minlength=seg.cores)
    return DmaSchedule(overlapped_bytes=over, prologue_bytes=prologue, epilogue_bytes=epilogue)
