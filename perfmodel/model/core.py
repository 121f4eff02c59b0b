"""The roofline core: work counts (OpCost) and their evaluation on a chip (Roofline).

An op model (gemm, attention, ...) returns an :class:`OpCost`: how much work
each unit of the chip does and how many bytes move at each level. Every field
may be a Python number or a numpy array (a batch of shapes evaluated at once).
:func:`evaluate` turns it into times per unit on a :class:`ChipSpec` and the
three bounds:

* ``floor_s``: max of the per-unit times (perfect overlap; the roofline bound);
* ``expected_s``: the slowest unit at its achievable rate (see
  :data:`ACHIEVABLE`: what a good kernel sustains) plus fixed costs;
* ``no_overlap_s``: the ceiling: every unit at its achievable rate, one after
  another (nothing overlaps), plus fixed costs.

So ``floor_s <= expected_s <= no_overlap_s`` for every op.

No jax import here; :func:`to_cost_estimate` imports Pallas lazily.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from perfmodel.hw.spec import ChipSpec

Num = Union[float, int, np.ndarray]

#: Units in the order they are reported; each maps to an OpCost work field.
UNITS: tuple[str, ...] = ("mxu", "vpu", "eup", "xlu", "hbm", "ici")
#: Work that runs alone, on the critical path (fixed parts of the expected time): serial VPU ops, serial HBM bytes.
SERIAL_UNITS: tuple[str, ...] = ("serial_vpu", "serial_hbm")

#: Human names of the bound each unit implies.
BOUND_NAMES: dict[str, str] = {
    "mxu": "MXU-bound",
    "vpu": "VPU-bound",
    "eup": "EUP-bound",
    "xlu": "XLU-bound",
    "hbm": "HBM-bound",
    "ici": "ICI-bound",
    #: Nothing to do (e.g. a collective over one chip): every unit time is zero.
    "none": "no work",
}


@dataclass(frozen=True, kw_only=True)
class OpCost:
    """Work and traffic of one op (or a batch of shapes of it).

    ``mxu_flops`` is what the matrix unit executes, padding to the MXU tile
    included; ``useful_flops`` is the algorithmic count (2*M*N*K for a GEMM).
    ``mxu_dtype`` names the operand dtype whose peak rate applies. Vector work
    (``vpu_ops``) counts f32-equivalent elementwise operations, including
    dtype conversions; ``eup_ops`` counts transcendentals (exp, rsqrt, ...); ``xlu_ops`` counts vregs pushed
    through the TPU's cross-lane units (transposes that turn lanes into sublanes for a row sum, lane broadcasts of
    a per-row value).
    """

    name: str
    mxu_flops: Num = 0
    useful_flops: Num = 0
    mxu_dtype: str = "bf16"
    vpu_ops: Num = 0
    eup_ops: Num = 0
    xlu_ops: Num = 0
    hbm_read_bytes: Num = 0
    hbm_write_bytes: Num = 0
    ici_bytes: Num = 0
    #: Part of vpu_ops spent on padding to the (8, 128) vreg tile (included in vpu_ops).
    vpu_padding_ops: Num = 0
    #: Fixed latencies the op model knows (grid-step overhead, ICI hops): added to expected and
    #: no-overlap times, never to the floor. Launches are counted by ``launches`` instead.
    fixed_s: Num = 0
    #: Device launches the op makes (XLA ops, pallas_calls, GPU kernels). Each costs the chip's launch
    #: overhead of ``launch_kind`` plus two exposed DMA latencies (first fetch, last write-back) when the op
    #: touches HBM; expected and no-overlap only. 0: the caller counts launches itself.
    launches: Num = 0
    #: "xla" (an XLA op / fusion) or "pallas" (a pallas_call); both are one kernel launch on a GPU.
    launch_kind: str = "xla"
    #: Part of vpu_ops on the critical path (dequantizing weights or KV between their DMA and the MXU):
    #: their time adds to the slowest unit's in expected and no-overlap times instead of overlapping.
    serial_vpu_ops: Num = 0
    #: Part of the HBM bytes (included in hbm_read/write_bytes) moved while nothing else runs (an output an
    #: XLA op writes after its compute, not under it): their time adds to the slowest unit's in expected and
    #: no-overlap times instead of overlapping.
    serial_hbm_bytes: Num = 0
    #: Multiplier (<= 1) on the MXU's achievable share for this shape: contraction ramp x GPU waves
    #: (perfmodel.model.efficiency.mxu_factor); expected and no-overlap only.
    mxu_efficiency: Num = 1.0
    #: ICI links the op drives at once (0: all of the chip's links, i.e. ici_bw_bytes_per_s_per_chip).
    ici_links: Num = 0
    #: Peak VMEM working set per core (footprint, not traffic; not part of any time).
    vmem_bytes: Num = 0
    notes: tuple[str, ...] = ()
    #: Op-specific figures for reports (e.g. "masked_tile_share", "kv_pages"); numbers or arrays.
    metrics: dict[str, Num] = dataclasses.field(default_factory=dict)
    #: Sub-ops this cost is the sum of (e.g. the prefill and decode parts of a ragged batch).
    parts: tuple["OpCost", ...] = ()
    #: The parts are kernels that run one after another (the passes of an unfused op), each bound by its own
    #: slowest unit: floor and expected time are the sums of the parts' own. False: the parts' work overlaps
    #: (one kernel, or kernels whose units the model lets overlap), so each unit's time is summed first.
    parts_in_sequence: bool = False

    @property
    def hbm_bytes(self) -> Num:
        return self.hbm_read_bytes + self.hbm_write_bytes

    @property
    def padding_waste(self) -> Num:
        """Share of issued MXU FLOPs that are padding (0 when nothing is issued)."""
        issued = np.asarray(self.mxu_flops, dtype=float)
        useful = np.asarray(self.useful_flops, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            waste = np.where(issued > 0, 1.0 - useful / np.where(issued > 0, issued, 1.0), 0.0)
        return waste if waste.ndim else float(waste)

    @property
    def vpu_padding_waste(self) -> Num:
        """Share of VPU ops that are padding to the vreg tile."""
        ops = np.asarray(self.vpu_ops, dtype=float)
        pad = np.asarray(self.vpu_padding_ops, dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            waste = np.where(ops > 0, pad / np.where(ops > 0, ops, 1.0), 0.0)
        return waste if waste.ndim else float(waste)


#: Fraction of each unit's peak a well-written kernel sustains, and where that
#: figure comes from: the default wherever perfmodel/data/calibration/efficiency.yaml
#: has no fitted share for the chip and dtype (perfmodel.model.efficiency; the schedule
#: model's grid timing uses these defaults). Used only for ``expected_s``; the floor uses 100%.
ACHIEVABLE: dict[str, tuple[float, str]] = {
    "mxu": (0.92, "XLA bf16 8192^3 matmul on TPU v5e reaches 92.3% of 197 TFLOP/s (JAX Pallas TPU matmul guide)"),
    "hbm": (0.85, "typical sustained share of peak HBM bandwidth for streaming kernels (assumption; not yet "
                  "calibrated against measurements)"),
    "vpu": (0.80, "assumption: VPU code rarely sustains full issue rate"),
    "eup": (0.80, "assumption, as for the VPU"),
    "xlu": (0.80, "assumption, as for the VPU and EUP (not fitted: no timing a fit may use is XLU-bound)"),
    "ici": (0.80, "assumption: collectives reach ~80% of link bandwidth"),
}


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """An OpCost evaluated on one chip. Array fields broadcast like the cost's."""

    cost: OpCost
    chip: str
    #: Seconds per unit at peak rate (mxu, vpu, eup, xlu, hbm, ici).
    unit_s: dict[str, Num]
    floor_s: Num
    no_overlap_s: Num
    expected_s: Num
    #: Unit that sets the floor ("mxu", "hbm", ...; "none" when there is no work); an array of names for batches.
    limiter: Any
    #: Useful FLOPs per HBM byte.
    arithmetic_intensity: Num
    #: The chip's FLOP/byte ridge for the op's MXU dtype.
    ridge_point: float | None
    #: Useful FLOP/s and HBM bytes/s achieved at the floor.
    attainable_flops_per_s: Num
    attainable_hbm_bytes_per_s: Num
    #: Per unit: its time over the floor (1.0 for the limiter) = share of its peak used at the floor.
    peak_share: dict[str, Num]
    #: The fixed costs in expected_s and no_overlap_s by kind: "launch" (op / pallas_call launches),
    #: "dma_latency" (exposed first-fetch and last-write latencies), "op" (the op model's own: grid steps,
    #: ICI hops), "serial_vpu" (dequantization on the critical path, at its achievable rate) and "serial_hbm"
    #: (HBM traffic that runs alone, at its achievable rate).
    fixed_parts_s: dict[str, Num] = dataclasses.field(default_factory=dict)
    #: Share of peak per unit the expected time assumes (perfmodel.model.efficiency.unit_shares).
    achievable_share: dict[str, float] = dataclasses.field(default_factory=dict)
    #: Host dispatch of one jitted call on this chip: not in expected_s; add it to compare with a wall-clock
    #: timing of a single call (``expected_with_dispatch_s``). 0 when the spec has none.
    host_dispatch_s: float = 0.0

    @property
    def expected_with_dispatch_s(self) -> Num:
        """Expected time of one call timed from the host: expected_s plus the chip's host dispatch."""
        return self.expected_s + self.host_dispatch_s

    @property
    def bound(self) -> Any:
        """"HBM-bound", "MXU-bound", ... (array of names for batches)."""
        if isinstance(self.limiter, np.ndarray):
            return np.vectorize(BOUND_NAMES.get, otypes=[object])(self.limiter)
        return BOUND_NAMES[self.limiter]

    @property
    def mfu_at_floor(self) -> Num:
        """Useful FLOP/s at the floor over the chip's peak for the op's dtype."""
        return self.peak_share["mxu"] * _useful_share(self.cost)

    @property
    def mbu_at_floor(self) -> Num:
        return self.peak_share["hbm"]


def _useful_share(cost: OpCost) -> Num:
    issued = np.asarray(cost.mxu_flops, dtype=float)
    useful = np.asarray(cost.useful_flops, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        share = np.where(issued > 0, useful / np.where(issued > 0, issued, 1.0), 0.0)
    return share if share.ndim else float(share)


def _scalarize(x: np.ndarray) -> Num:
    return x if x.ndim else float(x)


def unit_rates(chip: ChipSpec, mxu_dtype: str, links: Num = 0) -> dict[str, Num]:
    """Peak rate of every unit for an op whose matmuls run in mxu_dtype (ICI over ``links`` links, 0 = all)."""
    from perfmodel.errors import InputError

    mxu = chip.matmul_rate(mxu_dtype)
    if mxu is None:
        known = ", ".join(sorted(chip.compute.matmul_flops_per_s_per_chip))
        raise InputError(f"{chip.name} has no {mxu_dtype} matmul rate; it has: {known}")
    ici = chip.interconnect.ici_bw_bytes_per_s_per_chip or float("nan")
    links = np.asarray(links, dtype=float)
    if np.any(links):
        per_link = chip.interconnect.ici_bw_bytes_per_s_per_link or float("nan")
        ici = _scalarize(np.where(links > 0, per_link * links, ici))
    return {
        "mxu": mxu,
        "vpu": chip.compute.vpu_flops_per_s_per_chip,
        "eup": chip.compute.eup_ops_per_s_per_chip,
        # no XLU rate in the spec: the work is not priced (the op model says so in a note)
        "xlu": chip.compute.xlu_vreg_ops_per_s_per_chip or float("inf"),
        "hbm": chip.memory.hbm_bw_bytes_per_s_per_chip,
        "ici": ici,
    }


def unit_work(cost: OpCost) -> dict[str, np.ndarray]:
    """The work each unit does, as float arrays."""
    return {
        "mxu": np.asarray(cost.mxu_flops, dtype=float),
        "vpu": np.asarray(cost.vpu_ops, dtype=float),
        "eup": np.asarray(cost.eup_ops, dtype=float),
        "xlu": np.asarray(cost.xlu_ops, dtype=float),
        "hbm": np.asarray(cost.hbm_bytes, dtype=float),
        "ici": np.asarray(cost.ici_bytes, dtype=float),
    }


def unit_times(cost: OpCost, chip: ChipSpec) -> dict[str, np.ndarray]:
    """Seconds per unit at peak. A cost with parts sums its parts' times (they may use different dtypes)."""
    if cost.parts:
        times = [unit_times(p, chip) for p in cost.parts]
        return {u: sum(t[u] for t in times) for u in UNITS}
    work = unit_work(cost)
    links = np.asarray(cost.ici_links, dtype=float)
    rates = unit_rates(chip, cost.mxu_dtype, links if np.any(links) else 0)
    out = {}
    for u in UNITS:
        if u == "ici" and not np.any(work[u]):
            out[u] = np.zeros_like(work[u])
            continue
        if u == "ici" and np.any(np.isnan(rates[u])):
            from perfmodel.errors import InputError

            raise InputError(f"{chip.name} has no ICI bandwidth in its spec; collectives cannot be modelled on it")
        out[u] = work[u] / rates[u]
    return out


def launch_overhead_s(chip: ChipSpec, kind: str) -> float:
    """Device-side cost of one launch of ``kind`` ("xla" or "pallas") on chip: a pallas_call's own figure
    where the spec has one, else the op launch (a GPU kernel); 0 when the spec has neither."""
    if kind not in ("xla", "pallas"):
        from perfmodel.errors import InputError

        raise InputError(f"`launch_kind` '{kind}': use 'xla' or 'pallas'")
    o = chip.overheads
    if kind == "pallas" and o.pallas_call_launch_s is not None:
        return o.pallas_call_launch_s
    return o.op_launch_s or 0.0


def _launch_costs(cost: OpCost, chip: ChipSpec) -> tuple[np.ndarray, np.ndarray]:
    """(launch seconds, exposed DMA-latency seconds) of cost's launches; parts count their own."""
    if cost.parts:
        pairs = [_launch_costs(p, chip) for p in cost.parts]
        own = np.maximum(np.asarray(cost.launches, dtype=float)
                         - sum(np.asarray(p.launches, dtype=float) for p in cost.parts), 0)
        launch = sum(a for a, _ in pairs) + own * launch_overhead_s(chip, cost.launch_kind)
        own_dma = own * 2 * (chip.overheads.dma_latency_s or 0.0) * (np.asarray(cost.hbm_bytes, dtype=float) > 0)
        return launch, sum(b for _, b in pairs) + own_dma
    n = np.asarray(cost.launches, dtype=float)
    touches_hbm = np.asarray(cost.hbm_bytes, dtype=float) > 0
    dma = n * 2 * (chip.overheads.dma_latency_s or 0.0) * touches_hbm
    return n * launch_overhead_s(chip, cost.launch_kind), dma


def _achievable_times(cost: OpCost, chip: ChipSpec, times: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Seconds per unit at the achievable shares (parts at their own dtype's share), serial VPU work apart."""
    from perfmodel.model.efficiency import unit_shares

    if cost.parts:
        per = [_achievable_times(p, chip, unit_times(p, chip)) for p in cost.parts]
        return {u: sum(t[u] for t in per) for u in (*UNITS, *SERIAL_UNITS)}
    shares = unit_shares(chip, cost.mxu_dtype if cost.mxu_dtype in chip.compute.matmul_flops_per_s_per_chip
                         else "bf16")
    out = {u: np.asarray(times[u], dtype=float) / shares[u] for u in UNITS}
    out["mxu"] = out["mxu"] / np.asarray(cost.mxu_efficiency, dtype=float)
    # The serial parts of a unit's work leave its overlapped time for a time of their own (SERIAL_UNITS).
    for unit, work, peak in (("vpu", cost.serial_vpu_ops, chip.compute.vpu_flops_per_s_per_chip),
                             ("hbm", cost.serial_hbm_bytes, chip.memory.hbm_bw_bytes_per_s_per_chip)):
        serial = np.asarray(work, dtype=float) / (peak * shares[unit])
        out[unit] = out[unit] - serial
        out[f"serial_{unit}"] = serial
    return out


def additive_times(cost: OpCost, chip: ChipSpec) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The parts of :func:`evaluate`'s expected time that add when pieces of work join one kernel: (achievable
    seconds per unit, stacked in :data:`UNITS` order on a new first axis; serial-VPU plus the op's own fixed
    seconds; launch plus exposed-DMA seconds). For costs c_i of one launch each, the expected time of their sum
    as one launch is ``max_u(sum_i a_i[u]) + sum_i s_i + l`` (``l`` of any one of them): how a serving simulator
    adds the sequences of a ragged step without re-evaluating the op model each step."""
    if cost.parts and cost.parts_in_sequence:
        raise ValueError(f"additive_times: {cost.name}'s parts run in sequence; their times do not add per unit")
    times = unit_times(cost, chip)
    ach = _achievable_times(cost, chip, times)
    launch_s, dma_s = _launch_costs(cost, chip)
    stacked = np.stack(np.broadcast_arrays(*(np.asarray(ach[u], dtype=float) for u in UNITS)))
    own = sum(np.asarray(ach[u], dtype=float) for u in SERIAL_UNITS) + np.asarray(cost.fixed_s, dtype=float)
    return stacked, own, np.asarray(launch_s, dtype=float) + np.asarray(dma_s, dtype=float)


def evaluate(cost: OpCost, chip: ChipSpec, *, fixed_overhead_s: Num = 0.0) -> Roofline:
    """Evaluate cost on chip: per-unit times, floor, expected and no-overlap bounds.

    Expected: the slowest unit at its achievable share (perfmodel.model.efficiency) plus the fixed parts
    (:attr:`Roofline.fixed_parts_s`: launches, DMA latency, the op's own fixed costs, serial dequantization).
    ``fixed_overhead_s`` (costs a caller knows about) joins the op's own; never part of the floor.
    """
    from perfmodel.model.efficiency import unit_shares

    times = unit_times(cost, chip)
    stacked = np.stack(np.broadcast_arrays(*(np.asarray(times[u], dtype=float) for u in UNITS)))
    ach = _achievable_times(cost, chip, times)
    achievable = np.stack(np.broadcast_arrays(*(ach[u] for u in UNITS)))
    floor, overlapped, bounded = _bounds(cost, chip, stacked, achievable)
    launch_s, dma_s = _launch_costs(cost, chip)
    parts = {"launch": launch_s, "dma_latency": dma_s,
             "op": np.asarray(fixed_overhead_s, dtype=float) + np.asarray(cost.fixed_s, dtype=float),
             **{u: ach[u] for u in SERIAL_UNITS}}
    fixed_overhead_s = sum(np.asarray(v, dtype=float) for v in parts.values())
    # Expected: the slowest unit at its achievable rate (units overlap; per part for parts in sequence).
    # No-overlap ceiling: every unit at its achievable rate, one after another. So floor <= expected <=
    # no_overlap always.
    expected = overlapped + fixed_overhead_s
    no_overlap = achievable.sum(axis=0) + fixed_overhead_s
    idx = bounded.argmax(axis=0)
    names = np.asarray(UNITS, dtype=object)[idx]
    limiter = np.where(floor > 0, names, "none").astype(object) if idx.ndim else (
        UNITS[int(idx)] if floor > 0 else "none")
    hbm = np.asarray(cost.hbm_bytes, dtype=float)
    useful = np.asarray(cost.useful_flops, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        intensity = np.where(hbm > 0, useful / np.where(hbm > 0, hbm, 1), np.inf)
        safe_floor = np.where(floor > 0, floor, np.inf)
        share = {u: _scalarize(np.broadcast_to(times[u], floor.shape) / safe_floor) for u in UNITS}
        flops_rate = useful / safe_floor
        hbm_rate = hbm / safe_floor
    dtypes = _leaf_dtypes(cost)
    ridge = chip.ridge_point(dtypes[0]) if len(set(dtypes)) == 1 else None
    return Roofline(
        cost=cost,
        chip=chip.name,
        unit_s={u: _scalarize(np.asarray(times[u], dtype=float)) for u in UNITS},
        floor_s=_scalarize(floor),
        no_overlap_s=_scalarize(np.asarray(no_overlap, dtype=float)),
        expected_s=_scalarize(np.asarray(expected, dtype=float)),
        limiter=limiter,
        arithmetic_intensity=_scalarize(intensity),
        ridge_point=ridge,
        attainable_flops_per_s=_scalarize(flops_rate),
        attainable_hbm_bytes_per_s=_scalarize(hbm_rate),
        peak_share=share,
        fixed_parts_s={k: _scalarize(np.asarray(v, dtype=float)) for k, v in parts.items()},
        achievable_share=unit_shares(chip, dtypes[0] if len(set(dtypes)) == 1 and dtypes[0] in
                                     chip.compute.matmul_flops_per_s_per_chip else "bf16"),
        host_dispatch_s=chip.overheads.host_dispatch_s or 0.0,
    )


def _bounds(cost: OpCost, chip: ChipSpec, stacked: np.ndarray,
            achievable: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(floor, slowest achievable time, per unit the floor time it bounds) of a cost whose per-unit peak and
    achievable times are ``stacked`` and ``achievable`` (:data:`UNITS` on the first axis). Parts in sequence
    are each bound by their own slowest unit and add up."""
    if not (cost.parts and cost.parts_in_sequence):
        floor = stacked.max(axis=0)
        return floor, achievable.max(axis=0), stacked
    floor = overlapped = bounded = 0.0
    for part in cost.parts:
        times = unit_times(part, chip)
        p_stacked = np.stack(np.broadcast_arrays(*(np.asarray(times[u], dtype=float) for u in UNITS)))
        ach = _achievable_times(part, chip, times)
        p_ach = np.stack(np.broadcast_arrays(*(np.asarray(ach[u], dtype=float) for u in UNITS)))
        p_floor, p_over, p_bounded = _bounds(part, chip, p_stacked, p_ach)
        floor, overlapped = floor + p_floor, overlapped + p_over
        # the part's floor goes to the unit that sets it
        top = p_bounded.argmax(axis=0)
        bounded = bounded + np.where(np.arange(len(UNITS)).reshape((-1,) + (1,) * top.ndim) == top, p_floor, 0.0)
    return floor, overlapped, bounded


def _leaf_dtypes(cost: OpCost) -> list[str]:
    if cost.parts:
        return [d for p in cost.parts for d in _leaf_dtypes(p)]
    return [cost.mxu_dtype]


def combine(name: str, parts: list[OpCost] | tuple[OpCost, ...], notes: tuple[str, ...] = (), *,
            launches: Num = 0, launch_kind: str = "xla", in_sequence: bool = False,
            metrics: dict[str, Num] | None = None) -> OpCost:
    """An OpCost that is the sum of parts: work fields add; times add per unit at evaluation (``in_sequence``:
    the parts are kernels run one after another, each bound by its own slowest unit, and their times add).

    ``launches``: launches of the whole beyond its parts' own (e.g. 1 for one kernel whose parts are the
    prefill and decode halves of its work and launch nothing themselves)."""
    parts = tuple(parts)
    if not parts:
        from perfmodel.errors import InputError

        raise InputError(f"combine('{name}'): needs at least one part")
    total = {f: sum(getattr(p, f) for p in parts) for f in _ADDITIVE}
    total["launches"] = total["launches"] + launches
    total["vmem_bytes"] = np.maximum.reduce([np.asarray(p.vmem_bytes, dtype=float) for p in parts])
    dtypes = {d for p in parts for d in _leaf_dtypes(p)}
    return OpCost(name=name, mxu_dtype=dtypes.pop() if len(dtypes) == 1 else "mixed", notes=notes, parts=parts,
                  launch_kind=launch_kind, parts_in_sequence=in_sequence, metrics=dict(metrics or {}), **total)


_ADDITIVE = ("mxu_flops", "useful_flops", "vpu_ops", "eup_ops", "xlu_ops", "hbm_read_bytes", "hbm_write_bytes", "ici_bytes",
             "vpu_padding_ops", "fixed_s", "launches", "serial_vpu_ops", "serial_hbm_bytes")


def to_cost_estimate(cost: OpCost) -> Any:
    """``pl.CostEstimate`` for a pallas_call from the model's algorithmic counts.

    flops = useful matrix FLOPs plus vector ops, transcendentals = EUP ops,
    bytes_accessed = HBM read + write, remote_bytes_transferred = ICI bytes
    (where this jax has the field). Scalars only (one shape).
    """
    from jax.experimental import pallas as pl

    def _int(x: Num) -> int:
        arr = np.asarray(x)
        if arr.ndim:
            raise ValueError("to_cost_estimate takes the cost of one shape, not a batch")
        return int(round(float(arr)))

    fields = dict(
        flops=_int(cost.useful_flops) + _int(cost.vpu_ops),
        transcendentals=_int(cost.eup_ops),
        bytes_accessed=_int(cost.hbm_bytes),
    )
    if _int(cost.ici_bytes) and "remote_bytes_transferred" in getattr(pl.CostEstimate, "__dataclass_fields__", {}):
        fields["remote_bytes_transferred"] = _int(cost.ici_bytes)
    return pl.CostEstimate(**fields)
