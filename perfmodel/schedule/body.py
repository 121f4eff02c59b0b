"""Work of a kernel body per grid step: MXU, VPU, EUP and manual DMA.

The body jaxpr is run through the vectorized interpreter with a
:class:`WorkCounter` hook, so a ``pl.when`` whose predicate depends only on
``program_id`` and scalar prefetch (causal block skipping, accumulator init)
counts its work only at the steps where it runs, and loops multiply their
body by their trip count.

Counting rules (per executed equation, times its weight):

* ``dot_general``: useful FLOPs 2*B*M*N*K; issued FLOPs pad M to the sublane
  count and K and N to the MXU dimension (a 128x128 or 256x256 systolic
  array processes whole tiles). The MXU rate is that of the operand dtypes
  (see :func:`mxu_rate_key`, which uses the op model's dtype rules).
* element-wise arithmetic, comparisons, selects, casts and reductions on
  vectors: one VPU op per element (reductions: per input element);
* transcendentals (exp, log, tanh, rsqrt, ...): one EUP op per element;
  division counts as one VPU op, as XLA's cost analysis and the op model do;
* layout ops (broadcast, reshape, slicing, transposes), loads and stores: no
  VPU work (transposes use the XLU, which is not modelled);
* ``dma_start``: bytes of the copied window (manual DMA).

Scalar ops (single elements) run on the scalar unit and are not counted.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from perfmodel.hw.spec import ChipSpec
from perfmodel.schedule.interpreter import Interpreter
from perfmodel.schedule.loops import LoopOptions
from perfmodel.schedule.slicing import written_inputs
from perfmodel.schedule.values import UNKNOWN, Hook, RefValue

EUP_PRIMITIVES = frozenset({
    "exp", "exp2", "log", "log1p", "expm1", "tanh", "logistic", "sin", "cos", "tan", "asin", "acos", "atan",
    "atan2", "sinh", "cosh", "asinh", "acosh", "atanh", "rsqrt", "sqrt", "cbrt", "erf", "erfc", "erf_inv",
    "pow", "lgamma", "digamma",
})

VPU_PRIMITIVES = frozenset({
    "add", "sub", "mul", "neg", "abs", "sign", "max", "min", "select_n", "clamp", "eq", "ne", "lt", "le", "gt",
    "ge", "and", "or", "not", "xor", "convert_element_type", "floor", "ceil", "round", "integer_pow", "square",
    "rem", "shift_left", "shift_right_logical", "shift_right_arithmetic", "is_finite", "nextafter",
    "population_count", "iota", "reduce_precision", "add_any", "stochastic_round", "prng_random_bits",
    "random_bits", "threefry2x32",
})

REDUCTIONS = frozenset({
    "reduce_sum", "reduce_max", "reduce_min", "reduce_prod", "reduce_and", "reduce_or", "reduce_xor",
    "argmax", "argmin", "cumsum", "cummax", "cummin", "cumprod", "cumlogsumexp",
})

def _model_dtype(dtype: Any) -> str:
    """perfmodel's dtype name for a numpy / jax dtype (unknown ones count as fp32)."""
    from perfmodel.errors import InputError
    from perfmodel.model.dtypes import parse_dtype

    try:
        return parse_dtype(np.dtype(dtype).name)
    except (InputError, TypeError):
        return "fp32"


#: A DotAlgorithmPreset's name -> the precision whose passes it takes (bf16 x3 / x6 algorithms, tf32, full f32).
_ALGORITHM_PRECISION = (("_X6", "highest"), ("F32_F32_F32", "highest"), ("_X3", "high"), ("TF32", "high"))
#: jax_default_matmul_precision values -> precision.
_CONFIG_PRECISION = {"bfloat16": "default", "fastest": "default", "default": "default", "tensorfloat32": "high",
                     "bfloat16_3x": "high", "high": "high", "float32": "highest", "highest": "highest"}


def dot_precision(params: Any) -> str:
    """The precision ("default", "high", "highest") of a dot_general: its ``precision`` parameter (a pair of
    jax.lax.Precision, the higher of the two; or a DotAlgorithmPreset), else ``jax_default_matmul_precision``
    (what jax applies to a dot without one), else default."""
    value = params.get("precision") if hasattr(params, "get") else None
    if value is None:
        import jax

        configured = jax.config.jax_default_matmul_precision
        return _CONFIG_PRECISION.get(str(configured).lower(), "default") if configured else "default"
    if isinstance(value, (tuple, list)):
        names = [getattr(p, "name", str(p)).lower() for p in value if p is not None]
        order = ("default", "high", "highest")
        return max((n for n in names if n in order), key=order.index, default="default")
    name = getattr(value, "name", str(value)).upper()
    return next((prec for marker, prec in _ALGORITHM_PRECISION if marker in name), "default")


def mxu_rate_key(lhs: Any, rhs: Any, chip: ChipSpec, precision: str | None = None) -> tuple[str, int, tuple[str, ...]]:
    """(rate key, MXU passes, notes) for a dot of these operand dtypes at ``precision`` on chip.

    Delegates to the op model's per-generation rule
    (:func:`perfmodel.model.dtypes.matmul_path`), so the schedule model and
    ``perfmodel predict`` agree on which rate applies and on multi-pass fp32.
    """
    from perfmodel.model.dtypes import matmul_path

    path = matmul_path(chip, _model_dtype(lhs), _model_dtype(rhs), precision)
    return path.compute_dtype, path.passes, path.notes


def _size(aval: Any) -> int:
    shape = getattr(aval, "shape", None)
    return int(math.prod(shape)) if shape is not None else 1


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m if m else x


def dot_flops(eqn: Any, chip: ChipSpec) -> tuple[int, int]:
    """(useful, issued) FLOPs of one dot_general, issued padded to the MXU tile."""
    (lc, rc), (lb, rb) = eqn.params["dimension_numbers"]
    lhs, rhs = eqn.invars[0].aval.shape, eqn.invars[1].aval.shape
    batch = int(math.prod(lhs[d] for d in lb))
    k = int(math.prod(lhs[d] for d in lc))
    m = int(math.prod(lhs[d] for d in range(len(lhs)) if d not in lc and d not in lb))
    n = int(math.prod(rhs[d] for d in range(len(rhs)) if d not in rc and d not in rb))
    mxu = chip.cores.mxu_dim or 1
    sub = chip.cores.vreg_sublanes or 1
    useful = 2 * batch * m * n * k
    issued = 2 * batch * _ceil_to(m, sub) * _ceil_to(n, mxu) * _ceil_to(k, mxu)
    return useful, issued


def dma_window_bytes(eqn: Any, invals: Sequence[Any] | None = None) -> tuple[Any, str, str, bool]:
    """(bytes, source memory space, destination memory space, whether a run-time slice size was unknown) of one
    dma_start.

    The equation's operands unflatten (with its ``tree`` param) to
    (source ref, destination ref, semaphore, ...), each a TransformedRef
    whose indexing transforms give the copied window's shape. A slice whose
    size is computed at run time takes its value from ``invals`` (the
    interpreter's values of the equation's operands, per step where they
    vary); when that value is unknown the whole dimension counts.
    """
    import jax

    missing: list[Any] = []

    def value_of(var: Any) -> Any:
        for v, x in zip(eqn.invars, invals or ()):
            if v is var and not _unknown(x):
                return np.asarray(x)
        missing.append(var)
        return None

    try:
        items = jax.tree_util.tree_unflatten(eqn.params["tree"], list(eqn.invars))
        src, dst = items[0], items[1]
        src_var, src_t = getattr(src, "ref", src), tuple(getattr(src, "transforms", ()) or ())
        dst_var = getattr(dst, "ref", dst)
        aval = src_var.aval
        shape: list[Any] = list(aval.shape)
        for t in src_t:
            shape = _indexed_shape(t, shape, value_of)
        itemsize = np.dtype(aval.dtype).itemsize
    except Exception:  # noqa: BLE001 - an unfamiliar dma_start layout: count nothing, say so
        return 0, "?", "?", False
    src_ms = _space(aval)
    dst_ms = _space(getattr(dst_var, "aval", None))
    nbytes: Any = itemsize
    for d in shape:
        nbytes = nbytes * d
    return (int(nbytes) if np.ndim(nbytes) == 0 else nbytes.astype(float)), src_ms, dst_ms, bool(missing)


def _unknown(x: Any) -> bool:
    return x is UNKNOWN or isinstance(x, RefValue) or x is None


def _space(aval: Any) -> str:
    text = str(getattr(aval, "memory_space", None) or "vmem").lower().rsplit(".", 1)[-1]
    return "any" if text in ("any", "hbm") else text


def _indexed_shape(t: Any, shape: list[Any], value_of: Any = None) -> list[Any]:
    """Shape of a ref window after one indexing transform; a slice size computed at run time is its value
    (``value_of(var)``: per step where it varies), or the whole dimension when that is unknown."""
    from jax._src.state.indexing import NDIndexer, Slice

    if not isinstance(t, NDIndexer):
        return list(getattr(t, "shape", shape))
    out: list[Any] = []
    for idx, dim in zip(t.indices, shape):
        if isinstance(idx, Slice):
            if isinstance(idx.size, (int, np.integer)):
                out.append(int(idx.size))
            else:
                value = value_of(idx.size) if value_of is not None else None
                out.append(dim if value is None else np.minimum(value.astype(float), np.asarray(dim, float)))
        else:
            out.extend(getattr(getattr(idx, "aval", None), "shape", ()) or ())
    return out


#: WorkCounter fields that add up over the equations executed (per-step scalars or arrays).
_ADDITIVE = ("useful", "vpu", "eup", "dma_read", "dma_write", "waves")


def _fold(x: Any, lanes: np.ndarray, n: int) -> Any:
    """Per-step sums of a value over expanded lanes (``lanes``: the step of each)."""
    if isinstance(x, np.ndarray) and x.ndim and x.shape[0] > 1:
        return np.bincount(lanes, weights=np.broadcast_to(x, lanes.shape).astype(float), minlength=n)
    scalar = float(np.asarray(x).reshape(-1)[0]) if np.ndim(x) else float(x)
    if scalar == 0.0:
        return 0.0
    return np.bincount(lanes, minlength=n) * scalar


class WorkCounter(Hook):
    """Accumulates per-step work (scalars or ``(n,)`` arrays) while the body is interpreted.

    Work under a per-step weight array (a ``pl.when`` mask, a loop's trip counts) is summed per weight
    first and multiplied out once when a total is read: on a million-step grid that is one array operation
    per distinct weight instead of one per equation. Counts are integers, so the sums are exact either way.
    """

    foldable = True

    def __init__(self, chip: ChipSpec, notes: list[str] | None = None, assumed_trips: int | None = None):
        self.chip = chip
        self.assumed_trips = assumed_trips
        self._totals: dict[str, Any] = dict.fromkeys(_ADDITIVE, 0.0)
        #: rate key -> issued FLOPs (padding and multi-pass included).
        self._issued: dict[str, Any] = {}
        #: rate key -> FLOPs without padding (multi-pass included): what the op floor uses.
        self._unpadded: dict[str, Any] = {}
        #: id(weight array) -> [weight, {(field, rate key or None): amount per unit weight}].
        self._pending: dict[int, list] = {}
        #: Distinct dot_general equations executed (a loop's dot counts once).
        self.dot_eqns: set[int] = set()
        self.notes: list[str] = notes if notes is not None else []
        #: Bytes of run_scoped VMEM / SMEM allocations, by memory space (largest seen).
        self.scoped_bytes: dict[str, int] = {}
        self.dma_directions: set[tuple[str, str]] = set()

    def _add(self, field: str, weight: Any, amount: float, key: str | None = None) -> None:
        """Add ``weight * amount`` to a total (``key``: the rate key of issued / unpadded FLOPs)."""
        if isinstance(weight, np.ndarray) and weight.ndim and weight.shape[0] > 1:
            entry = self._pending.get(id(weight))
            if entry is None:
                entry = self._pending[id(weight)] = [weight, {}]
            k = (field, key)
            entry[1][k] = entry[1].get(k, 0.0) + amount
            if key is not None:
                (self._issued if field == "issued" else self._unpadded).setdefault(key, 0.0)  # first-seen order
            return
        if key is None:
            self._totals[field] = self._totals[field] + weight * amount
        else:
            d = self._issued if field == "issued" else self._unpadded
            d[key] = d.get(key, 0.0) + weight * amount

    def _flush(self) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        for weight, amounts in pending.values():
            for (field, key), amount in amounts.items():
                if key is None:
                    self._totals[field] = self._totals[field] + weight * amount
                else:
                    d = self._issued if field == "issued" else self._unpadded
                    d[key] = d.get(key, 0.0) + weight * amount

    def _total(name: str) -> property:  # noqa: N805 - a property factory used in the class body
        def get(self: "WorkCounter") -> Any:
            self._flush()
            return self._totals[name]

        def put(self: "WorkCounter", value: Any) -> None:
            self._flush()
            self._totals[name] = value

        return property(get, put)

    useful = _total("useful")
    vpu = _total("vpu")
    eup = _total("eup")
    #: Bytes of the body's own DMAs per step: HBM -> on-chip (reads) and on-chip -> HBM (writes).
    dma_read = _total("dma_read")
    dma_write = _total("dma_write")
    #: Iterations per step of the body's software-pipelined loops (each starts and waits on its own DMAs).
    waves = _total("waves")
    del _total

    @property
    def issued(self) -> dict[str, Any]:
        self._flush()
        return self._issued

    @property
    def unpadded(self) -> dict[str, Any]:
        self._flush()
        return self._unpadded

    @property
    def dots(self) -> int:
        return len(self.dot_eqns)

    def note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def dma_waves(self, weight: Any) -> None:
        self._add("waves", weight, 1.0)

    def child(self) -> "WorkCounter":
        return WorkCounter(self.chip, self.notes, self.assumed_trips)

    def absorb_costliest(self, children: Sequence[Hook], reason: str) -> None:
        kids = [c for c in children if isinstance(c, WorkCounter)]
        if not kids:
            return
        best = max(kids, key=lambda c: float(np.sum(c.seconds_at_peak())))
        if len(kids) > 1:
            self.note(f"{reason}: the costliest branch is assumed to run at every step")
        self.useful = self.useful + best.useful
        for k, v in best.issued.items():
            self.issued[k] = self.issued.get(k, 0.0) + v
        for k, v in best.unpadded.items():
            self.unpadded[k] = self.unpadded.get(k, 0.0) + v
        self.vpu = self.vpu + best.vpu
        self.eup = self.eup + best.eup
        self.dma_read = self.dma_read + best.dma_read
        self.dma_write = self.dma_write + best.dma_write
        self.waves = self.waves + best.waves
        self.dot_eqns |= best.dot_eqns
        for k, v in best.scoped_bytes.items():
            self.scoped_bytes[k] = max(self.scoped_bytes.get(k, 0), v)
        self.dma_directions |= best.dma_directions

    def absorb_costliest_grouped(self, children: Sequence[Hook], reason: str, groups: np.ndarray,
                                 ngroups: int) -> None:
        """absorb_costliest within each group of lanes: the lanes of a group were one per-iteration pass."""
        kids = [c for c in children if isinstance(c, WorkCounter)]
        if not kids:
            return
        if len(kids) > 1:
            self.note(f"{reason}: the costliest branch is assumed to run at every step")
        n = groups.shape[0]
        totals = np.stack([np.bincount(groups, weights=np.broadcast_to(np.asarray(c.seconds_at_peak(), dtype=float),
                                                                        (n,)), minlength=ngroups) for c in kids])
        chosen = np.argmax(totals, axis=0)[groups]  # first costliest on ties, like max()
        for i, best in enumerate(kids):
            mask = chosen == i
            if not mask.any():
                continue
            self.useful = self.useful + best.useful * mask
            for k, v in best.issued.items():
                self.issued[k] = self.issued.get(k, 0.0) + v * mask
            for k, v in best.unpadded.items():
                self.unpadded[k] = self.unpadded.get(k, 0.0) + v * mask
            self.vpu = self.vpu + best.vpu * mask
            self.eup = self.eup + best.eup * mask
            self.dma_read = self.dma_read + best.dma_read * mask
            self.dma_write = self.dma_write + best.dma_write * mask
            self.waves = self.waves + best.waves * mask
            self.dot_eqns |= best.dot_eqns
            for k, v in best.scoped_bytes.items():
                self.scoped_bytes[k] = max(self.scoped_bytes.get(k, 0), v)
            self.dma_directions |= best.dma_directions

    def fold(self, child: Hook, lanes: np.ndarray, n: int) -> None:
        """Add a child's counts over expanded lanes to this counter's ``n`` steps."""
        assert isinstance(child, WorkCounter)
        for name in _ADDITIVE:
            folded = _fold(getattr(child, name), lanes, n)
            if not (isinstance(folded, float) and folded == 0.0):
                setattr(self, name, getattr(self, name) + folded)
        for field in ("issued", "unpadded"):
            mine = getattr(self, field)
            for k, v in getattr(child, field).items():
                mine[k] = mine.get(k, 0.0) + _fold(v, lanes, n)
        self.dot_eqns |= child.dot_eqns
        for k, v in child.scoped_bytes.items():
            self.scoped_bytes[k] = self.scoped_bytes.get(k, 0) + v
        self.dma_directions |= child.dma_directions

    def seconds_at_peak(self) -> Any:
        """Per-step seconds of the body's work at peak rates (for comparing branches)."""
        c = self.chip
        mxu = sum(v / c.compute.matmul_flops_per_s_per_chip[k] for k, v in self.issued.items())
        return mxu + self.vpu / c.compute.vpu_flops_per_s_per_chip + self.eup / c.compute.eup_ops_per_s_per_chip \
            + self.dma / c.memory.hbm_bw_bytes_per_s_per_chip

    @property
    def dma(self) -> Any:
        """All manual DMA bytes per step (both directions share the HBM bandwidth)."""
        return self.dma_read + self.dma_write

    def eqn(self, eqn: Any, weight: Any, interp: Interpreter) -> None:
        name = eqn.primitive.name
        if name == "dot_general":
            useful, issued = dot_flops(eqn, self.chip)
            key, passes, notes = mxu_rate_key(eqn.invars[0].aval.dtype, eqn.invars[1].aval.dtype, self.chip,
                                              dot_precision(eqn.params))
            for note in notes:
                self.note(note)
            self._add("useful", weight, useful)
            self._add("issued", weight, issued * passes, key)
            self._add("unpadded", weight, useful * passes, key)
            self.dot_eqns.add(id(eqn))
            return
        if name == "dma_start":
            nbytes, src, dst, unknown_size = dma_window_bytes(eqn, getattr(interp, "invals", None))
            if unknown_size:
                self.note("a DMA's slice size is computed at run time from data given only as a shape: the whole "
                          "dimension is counted; give that argument values (a FILL) for the real size")
            if src == "?":
                self.note("a dma_start whose operands could not be read is not counted")
                return
            if src != "any" and dst != "any":
                return  # VMEM <-> VMEM / SMEM copies do not touch HBM
            self._add("dma_read" if src == "any" else "dma_write", weight, nbytes)
            self.dma_directions.add((src, dst))
            return
        if name == "run_scoped":
            from perfmodel.schedule.vmem import buffer_bytes

            for v in eqn.params["jaxpr"].invars:
                aval = v.aval
                ms = str(getattr(aval, "memory_space", "vmem")).lower().rsplit(".", 1)[-1]
                if not hasattr(aval, "dtype") or "sem" in ms:
                    continue
                try:
                    itemsize = np.dtype(aval.dtype).itemsize
                except TypeError:
                    continue
                b = buffer_bytes(aval.shape, itemsize, ms if ms in ("vmem", "smem") else "vmem", self.chip)
                key = ms if ms in ("vmem", "smem") else "vmem"
                self.scoped_bytes[key] = self.scoped_bytes.get(key, 0) + b
            return
        out = eqn.outvars[0].aval if eqn.outvars else None
        if out is None or not getattr(out, "shape", ()):
            return  # scalar-unit work is not counted
        if name in EUP_PRIMITIVES:
            self._add("eup", weight, _size(out))
        elif name in VPU_PRIMITIVES or name == "div":
            self._add("vpu", weight, _size(out))
        elif name in REDUCTIONS:
            self._add("vpu", weight, _size(eqn.invars[0].aval))


def count_body_work(body: Any, chip: ChipSpec, grid: Sequence[int], points: np.ndarray,
                    known_values: Sequence[Any], *, loop_trips: int | None = None,
                    starts: np.ndarray | None = None, loop_options: LoopOptions = LoopOptions(),
                    axes: Sequence[int] | None = None) -> WorkCounter:
    """Interpret the kernel body once for all grid steps; returns the filled counter.

    The body's parameters are (*scalar prefetch, *blocks, *scratch); ``known_values`` are the known contents
    of the leading ones (scalar prefetch, then whole-array SMEM inputs; None where unknown). ``loop_trips``:
    iterations assumed for a while loop whose trip count cannot be evaluated (default: one, with a note).
    ``starts``: True at the first step of each TensorCore's sequence (``points`` in execution order); the SMEM
    refs among the known ones that the body writes (a first-step flag, a buffer slot) then carry their content
    from each step to the next (see :func:`carried_contents`). ``loop_options``: the interpreter's fast paths
    (default: all; the reference implementation with them off). ``axes``: the grid dimensions the body's
    ``program_id`` numbers name (default: all; a vmapped call's :attr:`~perfmodel.schedule.extract.PallasCall.body_axes`).
    """
    n = points.shape[0]
    counter = WorkCounter(chip, assumed_trips=loop_trips)
    axes = tuple(range(points.shape[1])) if axes is None else tuple(axes)
    grid = [grid[d] for d in axes]
    grid_ids = [points[:, d] for d in axes]
    args: list[Any] = []
    for i, v in enumerate(body.invars):
        ms = str(getattr(v.aval, "memory_space", "")).lower()
        known = i < len(known_values) and known_values[i] is not None
        content = np.asarray(known_values[i])[None, ...] if known else UNKNOWN
        args.append(RefValue(content, ms) if hasattr(v.aval, "memory_space") or known else UNKNOWN)
    written = written_inputs(body)
    carried = [i for i, a in enumerate(args) if isinstance(a, RefValue) and "smem" in a.memory_space
               and not isinstance(a.value, type(UNKNOWN)) and i + len(body.constvars) in written]
    if carried:
        steps = np.zeros(n, dtype=bool) if starts is None else np.asarray(starts, dtype=bool)
        steps[0] = True
        for i, content in carried_contents(body, grid, grid_ids, args, carried, steps,
                                           loop_options=loop_options).items():
            args[i] = RefValue(content, args[i].memory_space, track=True)
        if any(isinstance(args[i].value, type(UNKNOWN)) for i in carried):
            counter.note("scalar state the kernel writes in SMEM and reads at a later step (e.g. a buffer slot) "
                         "could not be followed from step to step: reads of it are treated as data")
    Interpreter(n, grid, grid_ids, counter, loop_options=loop_options).run(body, [], args)
    return counter


#: Passes over the grid that :func:`carried_contents` runs before giving up on SMEM state that keeps changing
#: (a chain of n steps, e.g. a double-buffer slot flipped at every step, needs n passes).
MAX_CARRY_PASSES = 8


def carried_contents(body: Any, grid: Sequence[int], grid_ids: Sequence[np.ndarray], args: Sequence[Any],
                     carried: Sequence[int], starts: np.ndarray, *,
                     loop_options: LoopOptions = LoopOptions()) -> dict[int, Any]:
    """The content of each carried SMEM ref at the start of every step: its initial content at each core's
    first step, else what the previous step left in it. Found by running the body (quietly, every step at
    once) from a guess until the contents stop changing; a ref still changing after
    :data:`MAX_CARRY_PASSES` passes (or when two passes in a row settle no further ref), or whose writes are
    data-dependent, is UNKNOWN. ``loop_options``: the interpreter's fast paths."""
    n = int(starts.shape[0])
    prev = np.maximum(np.arange(n) - 1, 0)
    initial = {i: np.asarray(args[i].value) for i in carried}
    state: dict[int, Any] = {i: np.broadcast_to(initial[i], (n,) + initial[i].shape[1:]) for i in carried}
    settled: set[int] = set()
    history: list[set[int]] = []
    for _ in range(MAX_CARRY_PASSES):
        run = [RefValue(_copy(state[i]), a.memory_space, track=True) if i in state
               else RefValue(a.value, a.memory_space) if isinstance(a, RefValue) else a for i, a in enumerate(args)]
        Interpreter(n, grid, grid_ids, loop_options=loop_options).run(body, [], run)
        following: dict[int, Any] = {}
        for i in carried:
            end = run[i].value
            if isinstance(end, type(UNKNOWN)):
                following[i] = UNKNOWN
                continue
            end = np.broadcast_to(end, (n,) + initial[i].shape[1:])
            first = np.broadcast_to(starts.reshape((n,) + (1,) * (end.ndim - 1)), end.shape)
            following[i] = np.where(first, np.broadcast_to(initial[i], end.shape), end[prev])
        settled = {i for i in carried if _same(following[i], state[i])}
        state = following
        history.append(settled)
        # Done when everything settled, or when two more passes settled nothing new (what is left keeps changing,
        # e.g. a double-buffer slot flipped at every step, which only a pass per step could follow).
        if len(settled) == len(carried) or (len(history) >= 3 and history[-3] == history[-2] == settled):
            break
    return {i: state[i] if i in settled else UNKNOWN for i in carried}


def _copy(x: Any) -> Any:
    return x if isinstance(x, type(UNKNOWN)) else np.array(x)


def _same(a: Any, b: Any) -> bool:
    unknown = isinstance(a, type(UNKNOWN)), isinstance(b, type(UNKNOWN))
    return all(unknown) if any(unknown) else bool(np.array_equal(a, b))
