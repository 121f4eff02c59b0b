"""Memory ops: a copy (or any one-pass elementwise op over an array) and a row gather (embedding lookup,
``jnp.take`` along axis 0).

Work model
----------
* copy: reads and writes the array once (one VPU op per element for an elementwise body); one XLA op.
* gather: ``rows`` rows of ``row_bytes`` each are read from the table and written out, plus one int32
  index per row. A row gather is bound by rows per second, not bytes: each row is one descriptor the
  core issues, so on a TPU every row costs ``gather_row_cycles`` core cycles
  (``perfmodel/data/calibration/efficiency.yaml``, fitted on a published TPU 7x ``jnp.take``), spread
  over the chip's TensorCores. That cost is added to the expected time (a fixed part, ``op``), never to
  the floor. On a GPU rows are read in whole 32-byte sectors and no per-row issue cost is modelled.
"""

from __future__ import annotations

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost
from perfmodel.model.dtypes import DTYPES, INDEX_BYTES, parse_dtype
from perfmodel.model.shapes import fval, round_up, sizes

#: GPU DRAM access granularity (one sector).
GPU_SECTOR_BYTES = 32


def _array_bytes(bytes_: Num | None, elements: Num | None, dtype: str, what: str) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, elements) from exactly one of a byte count or an element count with a dtype."""
    if (bytes_ is None) == (elements is None):
        raise InputError(f"give exactly one of `{what}_bytes` and `{what}_elements` (with `dtype`)",
                         fields=(f"{what}_bytes", f"{what}_elements"))
    item = DTYPES[parse_dtype(dtype, "`dtype`")].itemsize_bytes
    if bytes_ is not None:
        b = np.asarray(bytes_, dtype=float)
        if np.any(b <= 0):
            raise InputError(f"`{what}_bytes` must be positive, got {bytes_}", fields=(f"{what}_bytes",))
        return b, b / item
    e = 1.0 * sizes(f"{what}_elements", elements)
    return e * item, e


def copy(*, array_bytes: Num | None = None, array_elements: Num | None = None, dtype: str = "bf16",
         elementwise: bool = False, out_dtype: str | None = None, chip: object | None = None) -> OpCost:
    """Copy an array of ``array_bytes`` (or ``array_elements`` of ``dtype``) from HBM to HBM in one XLA op;
    ``elementwise`` counts one VPU op per element (``x + 1``); ``out_dtype`` (with ``array_elements``): the
    copy converts, writing each element in that dtype (``x.astype(out_dtype)``)."""
    nbytes, elems = _array_bytes(array_bytes, array_elements, dtype, "array")
    written, notes = nbytes, ("one pass: every byte read once and written once",)
    if out_dtype is not None:
        if array_elements is None:
            raise InputError("`out_dtype` converts elements: give `array_elements` instead of `array_bytes`",
                             fields=("out_dtype", "array_elements", "array_bytes"))
        written = elems * DTYPES[parse_dtype(out_dtype, "`out_dtype`")].itemsize_bytes
        notes = (f"one pass: every element read as {dtype} and written as {out_dtype}",)
    return OpCost(name="copy", vpu_ops=fval(elems if elementwise or out_dtype is not None else 0.0),
                  hbm_read_bytes=fval(nbytes), hbm_write_bytes=fval(written), launches=1, notes=notes)


def gather_row_seconds(chip: object | None) -> float:
    """Issue cost of one gathered row on chip: its fitted cycles per row / (clock x cores); 0 without a fit."""
    from perfmodel.model.efficiency import gather_row_cycles

    if chip is None or getattr(chip, "kind", None) != "tpu":
        return 0.0
    cycles = gather_row_cycles(chip)
    if not cycles or not chip.compute.clock_hz:
        return 0.0
    return cycles / (chip.compute.clock_hz * chip.cores.cores_per_chip)


def gather(*, rows: Num, row_bytes: Num | None = None, row_elements: Num | None = None, dtype: str = "bf16",
           chip: object | None = None) -> OpCost:
    """Gather ``rows`` rows of ``row_bytes`` (or ``row_elements`` of ``dtype``) from a table by int32 index."""
    r = 1.0 * sizes("rows", rows)
    nbytes, _ = _array_bytes(row_bytes, row_elements, dtype, "row")
    read_row = nbytes
    notes = ["one int32 index per row"]
    if chip is not None and getattr(chip, "kind", None) == "gpu":
        read_row = round_up(np.ceil(nbytes), GPU_SECTOR_BYTES)
        notes.append(f"GPU: each row read in whole {GPU_SECTOR_BYTES}-byte sectors")
    per_row = gather_row_seconds(chip)
    if per_row:
        notes.append(f"bound by rows per second: {per_row * 1e9:.2f} ns of issue per row on this chip "
                     "(added to expected, not the floor)")
    return OpCost(name="gather", hbm_read_bytes=fval(r * (read_row + INDEX_BYTES)), hbm_write_bytes=fval(r * nbytes),
                  fixed_s=fval(r * per_row), launches=1, notes=tuple(notes),
                  metrics={"rows": fval(r), "row_issue_s": fval(r * per_row)})
