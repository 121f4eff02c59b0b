"""Collectives for tensor parallelism: all-gather, reduce-scatter, all-reduce, from the chip's topology.

Sizes: ``bytes_per_chip`` is what each chip holds *before* the collective
(all-gather: its shard; reduce-scatter and all-reduce: the whole array to
reduce), or give ``shape`` (per chip) and ``dtype`` instead.

Bandwidth-optimal algorithms: all-gather and reduce-scatter each move
(N-1)/N of the full array into / out of every chip; all-reduce is the two in
a row. What bounds the time is the bandwidth a chip can use at once, which
``topology="auto"`` (the default) derives from the chip spec's
``interconnect.topology``:

* ``2d-torus`` / ``3d-torus`` (TPU ICI): the N chips of the group take the
  most compact block of the torus (prime factors dealt to the shortest axis:
  4 -> 2x2, 8 -> 2x2x2 on a 3-D torus or 2x4 on a 2-D one, 64 -> 4x4x4). Each
  axis the group spans adds links: 2 (both directions of a ring) when the axis
  has wraparound, which a slice axis has when its length is a multiple of the
  spec's ``interconnect.torus_wraparound_multiple_chips`` (v4/v5p/7x: 4, a
  cube edge; v5e/v6e: 16, only the full pod), else 1 (a line: the end links
  carry all but one shard one way, half a ring's rate). Axes run at once (the
  array is split over them), so the links add up: the scaling book's
  ``T = V / (W_axis x axes)``;
* ``switch`` (NVLink + NVSwitch): every GPU reaches the switch with all its
  links, so a ring runs at the GPU's whole NVLink bandwidth;
* ``fully-connected`` (AMD Infinity Fabric mesh): a GPU has one link to each
  peer, so a group of N uses N-1 links at once (one direct step);
* more chips than one slice (``slice_chips``, default the spec's
  ``interconnect.max_chips_per_pod``: a TPU pod, an 8-GPU NVLink node) go
  hierarchical: within each slice over ICI, between slices over DCN at
  ``interconnect.dcn_bw_bytes_per_s_per_chip`` (all-reduce: reduce-scatter in
  the slice, all-reduce of 1/slice of the array across slices, all-gather in
  the slice).

``topology`` may instead name a layout outright: ``"ring"`` (one torus axis
with wraparound: 2 links), ``"line"`` (1 link) or ``"torus"`` (all links).

Each step costs a fixed latency (:data:`ICI_STEP_LATENCY_S`,
:data:`DCN_STEP_LATENCY_S`, assumptions) that enters expected / no-overlap
times, never the floor. The roofline core has one interconnect unit ("ici"):
the DCN part of a hierarchical collective is a part of the cost whose link
count is the DCN bandwidth in units of one ICI link, so its time is its bytes
over the DCN bandwidth and both parts add.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from perfmodel.errors import InputError
from perfmodel.model.core import Num, OpCost, combine
from perfmodel.model.dtypes import DTYPES, parse_dtype
from perfmodel.model.shapes import choice, fval, sizes

TOPOLOGIES = ("auto", "ring", "line", "torus")
#: Links one chip drives at once for a topology named outright (0: all of them).
LINKS = {"ring": 2, "line": 1, "torus": 0}
#: Chip-spec ``interconnect.topology`` values the ``auto`` model knows.
SPEC_TOPOLOGIES = ("2d-torus", "3d-torus", "switch", "fully-connected")
#: Synchronisation + hop latency of one ICI / NVLink step (assumption: ~1 us per step).
ICI_STEP_LATENCY_S = 1e-6
#: One step between slices over the data-centre network (assumption: ~10 us, NIC + switch round trip).
DCN_STEP_LATENCY_S = 1e-5


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How a group of ``chips`` runs a collective on a chip: links, steps, slices."""

    chips: int
    #: ICI links each chip drives at once (0: all of the chip's links).
    links: float
    #: Latency steps of one reduce-scatter or all-gather round inside a slice.
    steps: int
    #: Chips per slice in the group and slices (DCN between them); slices = 1 without DCN.
    slice_chips: int
    slices: int
    #: One line: the layout, for the op's notes.
    text: str


def torus_block(chips: int, dims: int) -> tuple[int, ...]:
    """Most compact block of ``chips`` on a ``dims``-D torus, shortest axis first.

    Prime factors, largest first, each multiplying the currently shortest axis:
    ``torus_block(8, 3) == (2, 2, 2)``, ``torus_block(8, 2) == (2, 4)``, ``torus_block(32, 3) == (2, 4, 4)``.
    """
    factors, n, p = [], chips, 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    axes = [1] * dims
    for f in sorted(factors, reverse=True):
        axes[axes.index(min(axes))] *= f
    return tuple(sorted(axes))


def _spec_topology(chip: object) -> str:
    topo = chip.interconnect.topology  # type: ignore[attr-defined]
    if topo not in SPEC_TOPOLOGIES:
        raise InputError(f"{chip.name}: its spec's interconnect.topology '{topo}' is not one the collective "  # type: ignore[attr-defined]
                         f"model knows ({', '.join(SPEC_TOPOLOGIES)}); pass `topology` ring, line or torus")
    return topo


def _slice_plan(n: int, topo: str, chip: object) -> tuple[float, int, str]:
    """(links, steps, text) of n chips inside one slice of a chip whose spec topology is ``topo``."""
    ic = chip.interconnect  # type: ignore[attr-defined]
    if n == 1:
        return 0.0, 0, "one chip: nothing moves"
    if topo == "switch":
        return 0.0, n - 1, f"switch: ring of {n} at the GPU's whole link bandwidth ({ic.ici_links_per_chip} links)"
    if topo == "fully-connected":
        peers = n - 1
        if ic.ici_links_per_chip is not None and peers > ic.ici_links_per_chip:
            raise InputError(f"`num_chips` {n}: {chip.name}'s fully-connected mesh links each chip to "  # type: ignore[attr-defined]
                             f"{ic.ici_links_per_chip} peers; use at most {ic.ici_links_per_chip + 1}")
        return float(peers), 1, f"fully-connected: {peers} direct link(s) to the group's peers, one step"
    dims = 3 if topo == "3d-torus" else 2
    block = torus_block(n, dims)
    wrap_every = ic.torus_wraparound_multiple_chips
    links, axes = 0, []
    for side in block:
        if side == 1:
            continue
        wrap = wrap_every is not None and side % wrap_every == 0
        links += 2 if wrap else 1
        axes.append(f"{side} ({'ring' if wrap else 'line'})")
    steps = sum(side - 1 for side in block)
    shape = "x".join(str(s) for s in block)
    text = f"{topo}: group of {n} as {shape}, axes {', '.join(axes)}: {links} link(s) per chip"
    return float(links), steps, text


def _plan(n: int, topology: str, chip: object, slice_chips: int | None) -> Plan:
    if topology != "auto":
        links = LINKS[topology]
        if topology == "torus":
            ic = getattr(chip, "interconnect", None)
            topo = getattr(ic, "topology", "") or ""
            dims = 3 if topo.startswith("3d") else 2 if topo.startswith("2d") else 1
            side = int(np.ceil(n ** (1.0 / dims) - 1e-9))
            steps = dims * (side - 1)
        else:
            steps = n - 1
        text = f"{topology}: " + ("all links" if links == 0 else f"{links} link(s)") + " per chip"
        return Plan(chips=n, links=float(links), steps=steps, slice_chips=n, slices=1, text=text)
    topo = _spec_topology(chip)
    ic = chip.interconnect  # type: ignore[attr-defined]
    per_slice = slice_chips or ic.max_chips_per_pod or n
    inner = min(n, per_slice)
    if n % inner:
        raise InputError(f"`num_chips` {n} does not split into whole slices of {inner} chips; use a multiple of "
                         f"{inner} or set `slice_chips`")
    slices = n // inner
    links, steps, text = _slice_plan(inner, topo, chip)
    if slices > 1:
        if not ic.dcn_bw_bytes_per_s_per_chip:
            raise InputError(f"`num_chips` {n} spans {slices} slices of {inner} chips, and {chip.name} has no DCN "  # type: ignore[attr-defined]
                             f"bandwidth in its spec (interconnect.dcn_bw_bytes_per_s_per_chip); use at most {inner}")
        text += f"; {slices} slices over DCN"
    return Plan(chips=n, links=links, steps=steps, slice_chips=inner, slices=slices, text=text)


def plan(num_chips: int, *, topology: str = "auto", chip: object | None = None,
         slice_chips: int | None = None) -> Plan:
    """The layout a group of ``num_chips`` uses on ``chip`` (see the module docstring)."""
    choice("topology", topology, TOPOLOGIES)
    if topology == "auto" and chip is None:
        raise InputError("`topology` auto needs a chip; give `chip` or name the topology (ring, line, torus)")
    return _plan(int(num_chips), topology, chip, None if slice_chips is None else int(slice_chips))


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


def _plans(n: np.ndarray, topology: str, chip: object | None, slice_chips: Num | None) -> dict[str, np.ndarray]:
    """Plan fields as arrays shaped like n (one plan per distinct group size)."""
    slice_arr = None if slice_chips is None else sizes("slice_chips", slice_chips)
    n, s = (n, None) if slice_arr is None else np.broadcast_arrays(n, slice_arr)
    memo: dict[tuple[int, int | None], Plan] = {}  # one plan per distinct (group, slice) size
    flat = []
    for i, v in enumerate(np.asarray(n).flat):
        key = (int(v), None if s is None else int(s.flat[i]))
        if key not in memo:
            memo[key] = plan(key[0], topology=topology, chip=chip, slice_chips=key[1])
        flat.append(memo[key])
    shape = np.shape(n)
    out = {f: np.array([getattr(p, f) for p in flat], dtype=float).reshape(shape)
           for f in ("links", "steps", "slice_chips", "slices")}
    out["texts"] = tuple(dict.fromkeys(p.text for p in flat))  # type: ignore[assignment]
    return out


def _collective(*, name: str, kind: str, size: np.ndarray, item: float, n: np.ndarray, topology: str,
                chip: object | None, slice_chips: Num | None) -> OpCost:
    """``size``: the shard (all-gather) or the full array (reduce-scatter, all-reduce), bytes per chip."""
    p = _plans(n, topology, chip, slice_chips)
    inner, outer = p["slice_chips"], p["slices"]
    rounds = 2 if kind == "all-reduce" else 1
    if kind == "all-gather":  # across slices first (the shard), then inside the slice (slices x shard)
        ici, dcn = (inner - 1) * outer * size, (outer - 1) * size
        reduced = np.zeros(np.shape(ici))
    else:  # reduce-scatter inside the slice, then across slices on 1/inner of the array (all-reduce: twice)
        ici = rounds * (inner - 1) / inner * size
        dcn = rounds * (outer - 1) / outer * size / inner
        reduced = (n - 1) / n * size / item
    notes = list(p["texts"]) + [f"step latency {ICI_STEP_LATENCY_S * 1e6:g} us per ICI step"
                                + (f", {DCN_STEP_LATENCY_S * 1e6:g} us per DCN step" if np.any(outer > 1) else "")
                                + " (assumptions), in expected time only"]
    steps = rounds * (p["steps"] + (outer - 1))
    fixed = rounds * (p["steps"] * ICI_STEP_LATENCY_S + (outer - 1) * DCN_STEP_LATENCY_S)
    local = 0.0 if kind == "all-gather" else ici / rounds + dcn / rounds  # the chip's own part it adds to
    sent = ici + dcn
    metrics = {"chips": fval(n), "steps": fval(steps), "links": fval(p["links"]), "slices": fval(outer)}
    ici_cost = OpCost(name=name, vpu_ops=fval(reduced), hbm_read_bytes=fval(sent + local), hbm_write_bytes=fval(sent),
                      ici_bytes=fval(ici), ici_links=fval(p["links"]), fixed_s=fval(fixed), notes=tuple(notes),
                      metrics=metrics)
    if not np.any(outer > 1):
        return ici_cost
    ic = chip.interconnect  # type: ignore[union-attr]
    per_link = ic.ici_bw_bytes_per_s_per_link
    if not per_link:
        raise InputError(f"{chip.name} has no ICI link bandwidth in its spec; collectives cannot be modelled on it")  # type: ignore[union-attr]
    dcn_links = ic.dcn_bw_bytes_per_s_per_chip / per_link
    dcn_cost = OpCost(name=f"{name} (DCN)", ici_bytes=fval(dcn), ici_links=dcn_links,
                      notes=(f"between slices over DCN at {ic.dcn_bw_bytes_per_s_per_chip:.3g} B/s per chip",))
    whole = combine(name, [dataclasses.replace(ici_cost, name=f"{name} (ICI)"), dcn_cost], notes=tuple(notes))
    return dataclasses.replace(whole, metrics=metrics)


def all_gather(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
               num_chips: Num, topology: str = "auto", chip: object | None = None,
               slice_chips: Num | None = None) -> OpCost:
    """Every chip ends with all N shards: receives (N-1) shards."""
    shard, item = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    return _collective(name="all-gather", kind="all-gather", size=shard, item=item, n=n, topology=topology,
                       chip=chip, slice_chips=slice_chips)


def reduce_scatter(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
                   num_chips: Num, topology: str = "auto", chip: object | None = None,
                   slice_chips: Num | None = None) -> OpCost:
    """Each chip ends with 1/N of the sum: sends (N-1)/N of the array, adds what it receives."""
    full, item = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    return _collective(name="reduce-scatter", kind="reduce-scatter", size=full, item=item, n=n, topology=topology,
                       chip=chip, slice_chips=slice_chips)


def all_reduce(*, bytes_per_chip: Num | None = None, shape: tuple | list | None = None, dtype: str = "bf16",
               num_chips: Num, topology: str = "auto", chip: object | None = None,
               slice_chips: Num | None = None) -> OpCost:
    """Reduce-scatter then all-gather: sends 2 (N-1)/N of the array."""
    full, item = _size(bytes_per_chip, shape, dtype)
    n = sizes("num_chips", num_chips)
    choice("topology", topology, TOPOLOGIES)
    return _collective(name="all-reduce", kind="all-reduce", size=full, item=item, n=n, topology=topology,
                       chip=chip, slice_chips=slice_chips)


COLLECTIVES = {"all-gather": all_gather, "reduce-scatter": reduce_scatter, "all-reduce": all_reduce}
