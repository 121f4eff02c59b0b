"""Count the block transfers a real Pallas TPU-interpret run performs.

Pallas' TPU interpret mode (``pltpu.InterpretParams``) runs a kernel on the
CPU with the same pipeline rule as the hardware: at each grid step it copies
an input block into its kernel buffer only when the block's window changed
since the previous step, and copies an output block back to HBM only when
the next step's window differs (or at the last step). :func:`record_traffic`
runs a function in that mode with

* a ``grid_point_recorder`` (the interpreter's own hook) logging the grid
  points in the order the interpreter visits them (it permutes "parallel"
  dimensions at random), and
* the interpreter's block copy functions wrapped to log every block copy-in
  and write-back with its window,

so the schedule model's predicted transfers can be checked against what the
interpreter actually did, step by step.

The wrapped functions are private to JAX (``jax._src.pallas.mosaic.interpret
.interpret_pallas_call.get`` / ``store``, jax 0.10); a JAX version that
renames them makes :func:`record_traffic` raise a clear error.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

import numpy as np


@dataclass(frozen=True, kw_only=True)
class Transfer:
    """One block copy the interpreter performed."""

    #: "input" (HBM -> kernel buffer) or "output" (kernel buffer -> HBM).
    role: str
    #: The kernel argument's name (as in the kernel signature).
    name: str
    block_indices: tuple[int, ...]
    grid_point: tuple[int, ...]
    #: In-bounds bytes of the copied window.
    nbytes: int


@dataclass(frozen=True, kw_only=True)
class ManualDma:
    """One async copy the kernel body started itself (executed by the interpreter's DMA engine)."""

    src_memory_space: str
    dst_memory_space: str
    nbytes: int

    @property
    def touches_hbm(self) -> bool:
        return "hbm" in (self.src_memory_space, self.dst_memory_space) or "any" in (
            self.src_memory_space, self.dst_memory_space)


@dataclass(kw_only=True)
class Recording:
    """What one interpret-mode run did."""

    grid_points: list[tuple[int, ...]] = field(default_factory=list)
    transfers: list[Transfer] = field(default_factory=list)
    manual_dmas: list[ManualDma] = field(default_factory=list)
    outputs: Any = None

    @property
    def manual_hbm_bytes(self) -> int:
        """Bytes the body's own DMAs moved to or from HBM."""
        return sum(d.nbytes for d in self.manual_dmas if d.touches_hbm)

    def count(self, role: str, name: str) -> tuple[int, int]:
        """(transfers, bytes) of one operand."""
        hits = [t for t in self.transfers if t.role == role and t.name == name]
        return len(hits), sum(t.nbytes for t in hits)


def _window_bytes(transforms: Any, itemsize: int, logical_shape: tuple[int, ...] | None = None) -> int:
    """In-bounds bytes of an NDIndexer window (ints: squeezed dims of size 1).

    The interpreter pads input arrays up to a whole number of blocks; bytes
    are counted against the array's logical shape (what exists in HBM).
    """
    from jax._src.state.indexing import NDIndexer, Slice

    total = 1
    for t in transforms:
        if not isinstance(t, NDIndexer):
            continue
        shape = logical_shape if logical_shape is not None and len(logical_shape) == len(t.shape) else t.shape
        for idx, dim in zip(t.indices, shape):
            if isinstance(idx, Slice):
                start, size = int(idx.start), int(idx.size)
                total *= max(0, min(size, int(dim) - start))
            else:
                total *= 1 if 0 <= int(idx) < int(dim) else 0
    return total * itemsize


def _interpreter_module() -> Any:
    try:
        from jax._src.pallas.mosaic.interpret import interpret_pallas_call as mod
    except ImportError as exc:  # pragma: no cover - depends on the JAX version
        raise RuntimeError("record_traffic needs jax's Pallas TPU interpreter (jax._src.pallas.mosaic.interpret)") from exc
    for attr in ("get", "store"):
        if not callable(getattr(mod, attr, None)):  # pragma: no cover
            raise RuntimeError(f"record_traffic: this JAX's TPU interpreter has no '{attr}' to instrument")
    return mod


@contextlib.contextmanager
def _instrumented(rec: Recording, shapes: dict[tuple[str, str], tuple[int, ...]]) -> Iterator[None]:
    import jax

    mod = _interpreter_module()
    orig_get, orig_store = mod.get, mod.store

    def get(*args: Any, input_name: Any = None, **kwargs: Any) -> Any:
        token, value = orig_get(*args, input_name=input_name, **kwargs)
        if input_name is not None:
            transforms = jax.tree.map(int, args[5])
            grid = tuple(int(x) for x in tuple(args[7])) if len(args) > 7 else ()
            rec.transfers.append(Transfer(
                role="input", name=str(input_name), block_indices=tuple(int(x) for x in tuple(args[6])),
                grid_point=grid, nbytes=_window_bytes(transforms, np.dtype(value.dtype).itemsize,
                                                      shapes.get(("input", str(input_name))))))
        return token, value

    def store(*args: Any, output_name: Any = None, **kwargs: Any) -> Any:
        token = orig_store(*args, output_name=output_name, **kwargs)
        if output_name is not None:
            transforms = jax.tree.map(int, args[5])
            val = np.asarray(args[6])
            grid = tuple(int(x) for x in tuple(args[8])) if len(args) > 8 else ()
            rec.transfers.append(Transfer(
                role="output", name=str(output_name), block_indices=tuple(int(x) for x in tuple(args[7])),
                grid_point=grid, nbytes=_window_bytes(transforms, val.dtype.itemsize,
                                                      shapes.get(("output", str(output_name))))))
        return token

    # The interpreter's DMA engine calls the undecorated functions through __wrapped__.
    get.__wrapped__ = getattr(orig_get, "__wrapped__", orig_get)  # type: ignore[attr-defined]
    store.__wrapped__ = getattr(orig_store, "__wrapped__", orig_store)  # type: ignore[attr-defined]
    orig_read = mod.DMA.execute_read
    names = getattr(mod, "TPU_MEMORY_SPACE_NAMES", {})

    def execute_read(self: Any) -> Any:
        out = orig_read(self)
        if self.data is not None:
            rec.manual_dmas.append(ManualDma(
                src_memory_space=str(names.get(int(self.src_memory_space), self.src_memory_space)),
                dst_memory_space=str(names.get(int(self.dst_memory_space), self.dst_memory_space)),
                nbytes=int(self.data_size)))
        return out

    mod.get, mod.store = get, store
    mod.DMA.execute_read = execute_read
    try:
        yield
    finally:
        mod.get, mod.store = orig_get, orig_store
        mod.DMA.execute_read = orig_read


def record_traffic(fn: Callable, *args: Any, **kwargs: Any) -> Recording:
    """Run ``fn(*args, **kwargs)`` in Pallas TPU interpret mode and log its grid order and block copies.

    Every pallas_call the function makes runs in interpret mode (the forced
    mode overrides a kernel's own ``interpret=``). Use it on functions with a
    single pallas_call: the log is not split per call. The process's jit
    caches are left alone: the forced interpret mode is part of every jit
    key, and its parameters hold this run's own grid-point recorder, so the
    run is traced afresh with the instrumented copy functions and no earlier
    or later call reuses its programs.
    """
    import jax
    from jax.experimental.pallas import tpu as pltpu

    from perfmodel.schedule.extract import find_pallas_calls, trace

    rec = Recording()
    calls = find_pallas_calls(trace(fn, *args, **kwargs), args)
    shapes = {(b.role, b.name): b.array_shape for c in calls for b in c.blocks}

    def on_grid_point(token: Any, grid_point: Any, core: Any) -> Any:
        rec.grid_points.append(tuple(int(x) for x in np.asarray(grid_point).reshape(-1)))
        return token

    params = pltpu.InterpretParams(grid_point_recorder=on_grid_point)
    with _instrumented(rec, shapes), pltpu.force_tpu_interpret_mode(params):
        out = fn(*args, **kwargs)
        rec.outputs = jax.block_until_ready(out)
    return rec
