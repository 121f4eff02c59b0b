"""Find the pallas_calls in a traced function and read their schedules.

:func:`trace` runs ``jax.make_jaxpr`` on the function; :func:`find_pallas_calls`
walks the jaxpr (through ``jit``, custom-derivative calls and control flow)
and returns one :class:`PallasCall` per ``pallas_call`` equation with its grid,
block mappings (block shapes, index-map jaxprs, memory spaces, buffering),
scalar-prefetch operands (and their values when the function's arguments are
concrete), scratch shapes, dimension semantics, ``vmem_limit_bytes`` and the
kernel body jaxpr.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Sequence

import numpy as np

from perfmodel.errors import InputError
from perfmodel.schedule.values import ELEMENTWISE

#: Block-dimension classes of jax._src.pallas.core -> our names.
_BLOCK_KINDS = {
    "Blocked": "blocked",
    "Squeezed": "squeezed",
    "Element": "element",
    "BoundedSlice": "bounded_slice",
    "Indirect": "indirect",
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockMapping:
    """One blocked operand of a pallas_call, as the schedule model needs it."""

    name: str
    role: str
    position: int
    array_shape: tuple[int, ...]
    dtype: np.dtype
    block_shape: tuple[int, ...]
    block_kinds: tuple[str, ...]
    memory_space: str
    buffer_count: int
    #: ClosedJaxpr: (*grid indices, *scalar-prefetch refs) -> block indices.
    index_map: Any

    @property
    def pipelined(self) -> bool:
        return self.memory_space in ("vmem", "smem")

    @property
    def itemsize_bytes(self) -> int:
        return int(self.dtype.itemsize)

    @property
    def ref_shape(self) -> tuple[int, ...]:
        """Shape of the kernel's ref: the block without squeezed dimensions."""
        return tuple(b for b, k in zip(self.block_shape, self.block_kinds) if k != "squeezed")

    @property
    def array_label(self) -> str:
        return f"{self.dtype.name}[{','.join(str(d) for d in self.array_shape)}]"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PallasCall:
    """A pallas_call equation, read."""

    name: str
    grid: tuple[int, ...]
    dimension_semantics: tuple[str, ...]
    blocks: tuple[BlockMapping, ...]
    num_scalar_prefetch: int
    #: Concrete values of the scalar-prefetch operands (None where unknown).
    prefetch_values: tuple[Any, ...]
    #: Concrete values of the inputs whose block is the whole array in SMEM (None elsewhere, or unknown):
    #: the body reads them like scalar prefetch (e.g. a loop bound or a DMA size).
    smem_input_values: tuple[Any, ...] = ()
    #: (name, aval) of each scratch operand.
    scratch: tuple[tuple[str, Any], ...]
    vmem_limit_bytes: int | None
    cost_estimate: dict[str, int] | None
    #: The kernel body (open jaxpr) and the names of its parameters.
    body: Any
    input_output_aliases: tuple[tuple[int, int], ...]
    eqn: Any = dataclasses.field(repr=False, compare=False)
    #: Grid dimensions that ``jax.vmap`` added (jax's ``GridMapping.vmapped_dims``; parallel): the index maps
    #: see them, the body's ``program_id`` and ``num_programs`` do not (see :attr:`body_axes`).
    vmapped_dims: tuple[int, ...] = ()

    @property
    def steps(self) -> int:
        return int(math.prod(self.grid))

    @property
    def body_axes(self) -> tuple[int, ...]:
        """The grid dimensions the body's ``program_id(0)``, ``program_id(1)``, ... name, in order: every one
        but the vmapped (as Mosaic lowers them)."""
        return tuple(d for d in range(len(self.grid)) if d not in self.vmapped_dims)

    @property
    def body_values(self) -> tuple[Any, ...]:
        """Known contents of the body's leading refs, in parameter order (scalar prefetch, then inputs)."""
        return self.prefetch_values + self.smem_input_values


def trace(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    """``jax.make_jaxpr(fn)(*args, **kwargs)``; args may be arrays or ShapeDtypeStructs."""
    import jax

    try:
        return jax.make_jaxpr(lambda *a: fn(*a, **kwargs))(*args)
    except (TypeError, ValueError) as exc:
        name = getattr(fn, "__name__", repr(fn))
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise InputError(f"tracing {name} failed: {first}") from exc


def _memory_space_name(ms: Any) -> str:
    if ms is None:
        return "vmem"
    text = str(ms).lower()
    if "." in text:
        text = text.rsplit(".", 1)[-1]
    return {"semaphore_mem": "semaphore", "default": "vmem"}.get(text, text)


def _semantics(params: Any, ndim: int, vmapped: Sequence[int] = ()) -> tuple[str, ...]:
    """Per grid dimension: the kernel's dimension semantics (given for the dimensions it names, ``ndim`` less
    the vmapped ones), "parallel" at each vmapped dimension (as Mosaic lowers them)."""
    user = _user_semantics(params, ndim - len(vmapped))
    it = iter(user)
    return tuple("parallel" if d in vmapped else next(it, "arbitrary") for d in range(ndim))


def _user_semantics(params: Any, ndim: int) -> tuple[str, ...]:
    cp = params.get("compiler_params")
    ds = getattr(cp, "dimension_semantics", None)
    if ds is None and isinstance(cp, dict):
        for v in cp.values():
            ds = getattr(v, "dimension_semantics", None) or (v.get("dimension_semantics") if isinstance(v, dict) else None)
            if ds is not None:
                break
    if ds is None:
        return ("arbitrary",) * ndim
    out = []
    for d in ds:
        text = str(getattr(d, "value", d)).lower()
        out.append(text.rsplit(".", 1)[-1])
    return tuple(out)


def _vmem_limit(params: Any) -> int | None:
    cp = params.get("compiler_params")
    limit = getattr(cp, "vmem_limit_bytes", None)
    if limit is None and isinstance(cp, dict):
        for v in cp.values():
            limit = getattr(v, "vmem_limit_bytes", None)
            if limit is not None:
                break
    return int(limit) if limit is not None else None


def _cost_estimate(params: Any) -> dict[str, int] | None:
    ce = params.get("cost_estimate")
    if ce is None:
        return None
    return {
        "flops": int(getattr(ce, "flops", 0) or 0),
        "transcendentals": int(getattr(ce, "transcendentals", 0) or 0),
        "bytes_accessed": int(getattr(ce, "bytes_accessed", 0) or 0),
    }


def _block_dims(block_shape: Sequence[Any]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    sizes, kinds = [], []
    for b in block_shape:
        kind = _BLOCK_KINDS.get(type(b).__name__)
        if kind is None:
            kind, size = "blocked", int(b) if b is not None else 1
        elif kind == "squeezed":
            size = 1
        else:
            size = int(b.block_size)
        sizes.append(size)
        kinds.append(kind)
    return tuple(sizes), tuple(kinds)


def read_pallas_call(eqn: Any, prefetch_values: Sequence[Any] | None = None,
                     grid_bounds: Sequence[Any] | None = None, input_values: Sequence[Any] | None = None
                     ) -> PallasCall:
    """Read one pallas_call equation. ``grid_bounds``: the values of its dynamic grid sizes, in order (computed
    from the concrete arguments they depend on, see :func:`find_pallas_calls`); ``input_values``: the
    concrete values of its inputs where known (kept for whole-array SMEM blocks only)."""
    p = eqn.params
    gm = p["grid_mapping"]
    body = p["jaxpr"]
    grid = _static_grid(gm.grid, grid_bounds, p.get("name") or "pallas_call")
    vmapped = tuple(int(d) for d in getattr(gm, "vmapped_dims", ()) or ())
    n_idx, n_in, n_out = gm.num_index_operands, gm.num_inputs, gm.num_outputs
    arg_names = getattr(getattr(body, "debug_info", None), "arg_names", None)
    names = list(arg_names) if arg_names and len(arg_names) == len(body.invars) else None
    block_names = names[n_idx : n_idx + n_in + n_out] if names else None
    scratch_names = names[n_idx + n_in + n_out :] if names else None
    blocks = []
    for i, bm in enumerate(gm.block_mappings):
        role = "input" if i < n_in else "output"
        pos = i if i < n_in else i - n_in
        name = block_names[i] if block_names and block_names[i] else f"{'in' if role == 'input' else 'out'}{pos}"
        sizes, kinds = _block_dims(bm.block_shape)
        buffers = getattr(bm.pipeline_mode, "buffer_count", None) or 2
        blocks.append(
            BlockMapping(
                name=_clean_name(name),
                role=role,
                position=pos,
                array_shape=tuple(int(d) for d in bm.array_aval.shape),
                dtype=np.dtype(bm.array_aval.dtype),
                block_shape=sizes,
                block_kinds=kinds,
                memory_space=_memory_space_name(getattr(bm.transformed_block_aval, "memory_space", None)),
                buffer_count=int(buffers),
                index_map=bm.index_map_jaxpr,
            )
        )
    scratch = []
    for j, aval in enumerate(gm.scratch_avals):
        sname = scratch_names[j] if scratch_names and j < len(scratch_names) and scratch_names[j] else f"scratch{j}"
        scratch.append((_clean_name(sname), aval))
    values = tuple(prefetch_values) if prefetch_values is not None else (None,) * n_idx
    smem_values = tuple(_smem_value(b, v) for b, v in zip(blocks[:n_in], input_values or ()))
    func_name = getattr(getattr(body, "debug_info", None), "func_name", None)
    name = p.get("name") or func_name or "pallas_call"
    aliases = tuple(tuple(int(x) for x in pair) for pair in (p.get("input_output_aliases") or ()))
    return PallasCall(
        name=_clean_name(str(name)),
        grid=grid,
        dimension_semantics=_semantics(p, len(grid), vmapped),
        blocks=tuple(blocks),
        num_scalar_prefetch=n_idx,
        prefetch_values=values,
        smem_input_values=smem_values if any(v is not None for v in smem_values) else (),
        scratch=tuple(scratch),
        vmem_limit_bytes=_vmem_limit(p),
        cost_estimate=_cost_estimate(p),
        body=body,
        input_output_aliases=aliases,
        eqn=eqn,
        vmapped_dims=vmapped,
    )


def _static_grid(grid: Sequence[Any], bounds: Sequence[Any] | None, name: str) -> tuple[int, ...]:
    """The grid with each dynamic size replaced by its value; InputError when a size depends on data given
    only as a shape."""
    out, dynamic = [], iter(bounds or ())
    for g in grid:
        if isinstance(g, (int, np.integer)):
            out.append(int(g))
            continue
        value = next(dynamic, None)
        if value is None or np.ndim(value) != 0:
            raise InputError(
                f"{name}: the grid size is computed at run time from arguments given only as shapes; give those "
                "arguments values (--shape NAME=DIMS:DTYPE=FILL, or concrete arrays to analyze) so the size can "
                "be evaluated")
        out.append(int(value))
    return tuple(out)


#: Largest whole-array SMEM input whose contents the body interpreter is given.
MAX_SMEM_VALUE_BYTES = 1 << 20


def _smem_value(block: BlockMapping, value: Any) -> Any:
    """The value of an input the body sees whole in SMEM (its block is the array), else None."""
    if value is None or block.memory_space != "smem" or block.block_shape != block.array_shape:
        return None
    arr = np.asarray(value)
    return arr if arr.shape == block.array_shape and arr.nbytes <= MAX_SMEM_VALUE_BYTES else None


def _whole_smem_input(bm: Any) -> bool:
    """A block mapping whose block is its whole array in SMEM."""
    ms = _memory_space_name(getattr(bm.transformed_block_aval, "memory_space", None))
    sizes, _ = _block_dims(bm.block_shape)
    return ms == "smem" and sizes == tuple(int(d) for d in bm.array_aval.shape)


def _clean_name(name: str) -> str:
    """Kernel argument names come as e.g. "x_tile_ref" or "args[0]"; keep them readable."""
    return name.replace(" ", "")


def find_pallas_calls(closed: Any, args: Sequence[Any] = ()) -> list[PallasCall]:
    """Every pallas_call in a ClosedJaxpr, in program order.

    When ``args`` are concrete arrays, the values of scalar-prefetch operands
    are computed (everything before each pallas_call is evaluated eagerly on
    the CPU; pallas_calls themselves are not run).
    """
    found: list[tuple[Any, list[Any] | None]] = []
    need_values = _any_prefetch(closed.jaxpr)
    if need_values:
        env_args = [_concrete_or_none(a) for a in args]
        _walk_eval(closed.jaxpr, [np.asarray(c) if _is_array_like(c) else None for c in closed.consts], env_args, found)
    else:
        _walk(closed.jaxpr, found)
    return [read_pallas_call(eqn, values, bounds, inputs) for eqn, values, bounds, inputs in found]


def _sub_jaxprs(params: dict) -> list[Any]:
    from jax.extend.core import jaxprs_in_params

    return list(jaxprs_in_params(params))


def _any_prefetch(jaxpr: Any) -> bool:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            gm = eqn.params["grid_mapping"]
            if gm.num_index_operands or gm.num_dynamic_grid_bounds:
                return True
            if any(_whole_smem_input(bm) for bm in gm.block_mappings[: gm.num_inputs]):
                return True
            continue
        if any(_any_prefetch(sub) for sub in _sub_jaxprs(eqn.params)):
            return True
    return False


def _walk(jaxpr: Any, found: list) -> None:
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "pallas_call":
            found.append((eqn, None, None, None))
            continue
        for sub in _sub_jaxprs(eqn.params):
            _walk(sub, found)


def _is_array_like(x: Any) -> bool:
    return hasattr(x, "shape") and hasattr(x, "dtype") and not type(x).__name__ == "ShapeDtypeStruct"


def _concrete_or_none(x: Any) -> Any:
    if type(x).__name__ == "ShapeDtypeStruct":
        return None
    if isinstance(x, (int, float, bool, np.number)):
        return np.asarray(x)
    if _is_array_like(x):
        try:
            return np.asarray(x)
        except Exception:  # noqa: BLE001 - a tracer or abstract value
            return None
    return None


def _walk_eval(jaxpr: Any, consts: Sequence[Any], args: Sequence[Any], found: list) -> list[Any]:
    """Evaluate jaxpr eagerly where inputs are known; record pallas_calls with their prefetch values."""
    from jax.extend.core import ClosedJaxpr, Literal

    env: dict = {}
    for v, x in zip(jaxpr.constvars, consts):
        env[v] = x
    for v, x in zip(jaxpr.invars, args):
        env[v] = x

    def read(v: Any) -> Any:
        if isinstance(v, Literal):
            return np.asarray(v.val)
        return env.get(v)

    for eqn in jaxpr.eqns:
        invals = [read(v) for v in eqn.invars]
        name = eqn.primitive.name
        outs: list[Any]
        if name == "pallas_call":
            gm = eqn.params["grid_mapping"]
            n_dyn = gm.num_dynamic_grid_bounds
            n_idx = gm.num_index_operands
            values = invals[n_dyn : n_dyn + n_idx]
            found.append((eqn, values, invals[:n_dyn], invals[n_dyn + n_idx : n_dyn + n_idx + gm.num_inputs]))
            outs = [None] * len(eqn.outvars)
        elif name in ("jit", "pjit", "closed_call", "core_call", "remat", "checkpoint", "custom_jvp_call", "custom_vjp_call"):
            sub = eqn.params.get("jaxpr") or eqn.params.get("call_jaxpr") or eqn.params.get("fun_jaxpr")
            if isinstance(sub, ClosedJaxpr):
                outs = _walk_eval(sub.jaxpr, [np.asarray(c) if _is_array_like(c) else None for c in sub.consts], invals, found)
            elif sub is not None:
                outs = _walk_eval(sub, [], invals, found)
            else:
                outs = [None] * len(eqn.outvars)
        elif any(_sub_jaxprs(eqn.params)):
            for sub in _sub_jaxprs(eqn.params):
                _walk(sub, found)
            outs = _bind(eqn, invals)
        else:
            outs = _bind(eqn, invals)
        for v, x in zip(eqn.outvars, outs):
            env[v] = x
    return [read(v) for v in jaxpr.outvars]


def _bind(eqn: Any, invals: list[Any]) -> list[Any]:
    if any(x is None for x in invals) or eqn.effects:
        return [None] * len(eqn.outvars)
    computed = _numpy_eval(eqn, invals)
    if computed is not None:
        return [computed]
    key = _memo_key(eqn, invals)
    if key is not None and key in _BIND_MEMO:
        return list(_BIND_MEMO[key])
    try:
        out = eqn.primitive.bind(*invals, **eqn.params)
    except Exception:  # noqa: BLE001 - anything we cannot run eagerly is unknown
        return [None] * len(eqn.outvars)
    out = out if eqn.primitive.multiple_results else [out]
    result = [np.asarray(o) for o in out]
    if key is not None:
        if len(_BIND_MEMO) >= MAX_BIND_MEMO:
            _BIND_MEMO.clear()
        _BIND_MEMO[key] = tuple(result)
    return result


#: Eager results of equations jax had to run (each a CPU compile the first time), by primitive, params
#: and input values: tune evaluates the same wrapper prologue for every candidate.
_BIND_MEMO: dict = {}
MAX_BIND_MEMO = 512
#: Inputs larger than this are not hashed for the memo.
MAX_MEMO_INPUT_BYTES = 1 << 22


def _memo_key(eqn: Any, invals: list[Any]) -> Any:
    try:
        params = tuple(sorted((k, v) for k, v in eqn.params.items()))
        hash(params)
    except TypeError:
        return None
    parts = []
    for x in invals:
        arr = np.asarray(x)
        if arr.dtype == object or arr.nbytes > MAX_MEMO_INPUT_BYTES:
            return None
        parts.append((arr.dtype.str, arr.shape, arr.tobytes()))
    return (eqn.primitive.name, params, tuple(parts))


def _int_like(dtype: Any) -> bool:
    try:
        kind = np.dtype(dtype).kind
    except TypeError:
        return False
    return kind in "biu"


def _numpy_eval(eqn: Any, invals: list[Any]) -> np.ndarray | None:
    """The few integer / layout primitives a kernel wrapper computes before its pallas_call (index
    arithmetic on lengths and page tables), in numpy with XLA's semantics; None: let jax run it.

    Only integer and boolean arithmetic is done here (exact in both); layout primitives move values
    of any dtype unchanged.
    """
    if eqn.primitive.multiple_results or len(eqn.outvars) != 1:
        return None
    name = eqn.primitive.name
    p = eqn.params
    aval = eqn.outvars[0].aval
    try:
        out_dtype = np.dtype(aval.dtype)
    except TypeError:
        return None
    xs = [np.asarray(x) for x in invals]
    if any(x.dtype == object for x in xs):
        return None
    out: Any
    try:
        if name in _INT_ELEMENTWISE:
            if not _int_like(out_dtype) or not all(_int_like(x.dtype) for x in xs):
                return None
            if name in ("div", "rem") and np.any(xs[1] == 0):
                return None
            with np.errstate(all="ignore"):
                out = ELEMENTWISE[name](*xs)
        elif name == "select_n":
            out = ELEMENTWISE[name](*xs)
        elif name == "convert_element_type":
            if not _int_like(xs[0].dtype):
                return None
            out = xs[0]
        elif name == "iota":
            shape, dim = tuple(p["shape"]), int(p["dimension"])
            ar = np.arange(shape[dim], dtype=out_dtype).reshape([-1 if d == dim else 1 for d in range(len(shape))])
            out = np.broadcast_to(ar, shape)
        elif name == "broadcast_in_dim":
            shape, dims = tuple(p["shape"]), tuple(p["broadcast_dimensions"])
            view = [1] * len(shape)
            for i, d in enumerate(dims):
                view[d] = xs[0].shape[i]
            out = np.broadcast_to(xs[0].reshape(view), shape)
        elif name == "reshape":
            if p.get("dimensions") is not None:
                return None
            out = xs[0].reshape(tuple(p["new_sizes"]))
        elif name == "squeeze":
            out = np.squeeze(xs[0], axis=tuple(p["dimensions"]))
        elif name == "slice":
            strides = p.get("strides") or (1,) * xs[0].ndim
            out = xs[0][tuple(slice(a, b, c) for a, b, c in zip(p["start_indices"], p["limit_indices"], strides))]
        elif name == "concatenate":
            out = np.concatenate(xs, axis=int(p["dimension"]))
        elif name == "transpose":
            out = np.transpose(xs[0], tuple(p["permutation"]))
        elif name in ("reduce_sum", "reduce_max", "reduce_min", "reduce_and", "reduce_or"):
            if not _int_like(xs[0].dtype):
                return None
            fn = {"reduce_sum": np.sum, "reduce_max": np.max, "reduce_min": np.min, "reduce_and": np.all,
                  "reduce_or": np.any}[name]
            axes = tuple(p["axes"])
            if name in ("reduce_max", "reduce_min") and any(xs[0].shape[a] == 0 for a in axes):
                return None
            out = fn(xs[0], axis=axes, dtype=out_dtype) if name == "reduce_sum" else fn(xs[0], axis=axes)
        elif name == "cumsum":
            if not _int_like(xs[0].dtype):
                return None
            x = np.flip(xs[0], int(p["axis"])) if p.get("reverse") else xs[0]
            out = np.cumsum(x, axis=int(p["axis"]), dtype=out_dtype)
            out = np.flip(out, int(p["axis"])) if p.get("reverse") else out
        elif name in ("copy", "copy_p"):
            out = xs[0]
        else:
            return None
    except (ValueError, IndexError, TypeError):
        return None
    out = np.asarray(out)
    if out.shape != tuple(aval.shape):
        return None
    return np.array(out, dtype=out_dtype)


#: Element-wise primitives evaluated in numpy when every operand is an integer or boolean.
_INT_ELEMENTWISE = frozenset({
    "add", "sub", "mul", "div", "rem", "neg", "abs", "sign", "max", "min", "eq", "ne", "lt", "le", "gt", "ge",
    "and", "or", "xor", "not", "clamp",
})
