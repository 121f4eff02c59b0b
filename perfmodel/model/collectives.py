"""Collectives over ICI for tensor parallelism: all-gather, reduce-scatter, all-reduce.

Sizes: ``bytes_per_chip`` is what each chip holds *before* the collective
(all-gather: its shard; reduce-scatter and all-reduce: the whole array to
reduce), or give ``shape`` (per chip) and ``dtype`` instead.

Bandwidth-optimal ring algorithms: all-gather and reduce-scatter each send
(N-1)/N of the full array from every chip; all-reduce is the two in a row.
Topologies:

* ``"ring"``: one torus axis with wraparound; the data is split and sent both
  ways, driving 2 links per chip;
* ``"line"``: one axis without wraparound: 1 link's bandwidth (twice the ring time);
* ``"torus"``: the N chips span every axis of the chip's torus, all links busy
  (``ici_bw_bytes_per_s_per_chip``).

Each ring step costs a fixed latency (:data:`ICI_STEP_LATENCY_S`, an
assumption) that enters expected / no-overlap times, never the floor.
"""

from __future__ import annotations

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost
from perfmodel.model.dtypes import DTYPES, parse_dtype
from perfmodel.model.shapes import choice, fval, sizes

TOPOLOGIES = ("ring", "line", "torus")
#: Links one chip drives at once per topology (0: all of them).
LINKS = {"ring": 2, "line": 1, "torus": 0}
#: Synchronisation + hop latency of one ring step (assumption: ~1 us per step on TPU ICI).
ICI_STEP_LATENCY_S = 1e-6


def _torus_dims(chip: object | None) -> int:
    topo = getattr(getattr(chip, "interconnect", None), "topology", "") or ""
    return 3 if topo.startswith("3d") else 2 if topo.startswith("2d") else 1


def _size(bytes_per_chip: Num | None, shape: tuple | list | None, dtype: str) -> tuple[np.ndarray, float]:
    item = DTYPES[parse_dtype(dtype, "`dtype`")].itemsize_bytes
    if (bytes_per_chip is None) == (shape is None):
        raise InputError("give exactly one of `bytes_per_chip` and `shape`")
    if shape is not None:
        dims = [sizes("shape", d) for d in shape]
        if not dims:
            raise InputError("`shape`: give at least one dimension, e.g. 8192,4096")
        return 1.0 * np.prod(np.broadcast_arrays(*dims), axis=0) * item, item
    return 1.0 * sizes("bytes_per_chip", bytes_per_chip), item


def _steps(n: np.ndarray, topology: str, chip: object | None) -> np.ndarray:
    if topology == "torus":
        dims = _torus_dims(chip)
        side = np.ceil(n ** (1.0 / dims))
        return dims * (side - 1)
    return n - 1


def _collective(*, name: str, send_fraction_of: np.ndarray, n: np.ndarray, reduce_elems: np.ndarray,
                topology: str, chip: object | None, rounds: int, local_read: np.ndarray) -> OpCost:
    sent = send_fraction_of
    links = LINKS[topology]
    notes = [f"{topology}: " + ("all links" if links == 0 else f"{links} link(s)") + " per chip",
             f"ring step latency {ICI_STEP_LATENCY_S * 1e6:g} us (assumption) in expected time only"]
    return OpCost(
        name=name,
        vpu_ops=fval(reduce_elems),
        hbm_read_bytes=fval(sent + local_read),
        hbm_write_bytes=fval(sent),
        ici_bytes=fval(sent),
        ici_links=links,
        fixed_s=fval(rounds * _steps(n, topology, chip) * ICI_STEP_LATENCY_S),
        notes=tuple(notes),
        metrics={"chips": fval(n), "steps": fval(rounds * _steps(n, topology, chip))},
    )


def all_gather(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
               num_chips: Num, topology: str = "ring", chip: object | None = None) -> OpCost:
    """Every chip ends with all N shards: sends and receives (N-1) shards."""
    shard, _ = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    return _collective(name="all-gather", send_fraction_of=(n - 1) * shard, n=n, reduce_elems=np.zeros(()),
                       topology=topology, chip=chip, rounds=1, local_read=np.zeros(()))


def reduce_scatter(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
                   num_chips: Num, topology: str = "ring", chip: object | None = None) -> OpCost:
    """Each chip ends with 1/N of the sum: sends (N-1)/N of the array, adds what it receives."""
    full, item = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    moved = full * (n - 1) / n
    return _collective(name="reduce-scatter", send_fraction_of=moved, n=n, reduce_elems=moved / item,
                       topology=topology, chip=chip, rounds=1, local_read=moved)


def all_reduce(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
               num_chips: Num, topology: str = "ring", chip: object | None = None) -> OpCost:
    """Reduce-scatter then all-gather: sends 2 (N-1)/N of the array."""
    full, item = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    moved = full * (n - 1) / n
    return _collective(name="all-reduce", send_fraction_of=2 * moved, n=n, reduce_elems=moved / item,
                       topology=topology, chip=chip, rounds=2, local_read=moved)


COLLECTIVES = {"all-gather": all_gather, "reduce-scatter": reduce_scatter, "all-reduce": all_reduce}
