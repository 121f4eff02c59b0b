"""Read the optimized HLO module of a compiled TPU program (``compiled.as_text()``; no jax, no libtpu).

The module is a set of computations; the ENTRY one runs, ``while`` loops run
their body computation once per trip, fusions call a fused computation. This
module parses the text into :class:`Instruction`\\ s and counts, per
instruction that runs at the top level of a computation (not inside a fusion),
its work the way XLA's HloCostAnalysis does:

* FLOPs: a ``dot`` is 2 x output elements x contracted size, a
  ``convolution`` 2 x output elements x (kernel elements / output features)
  (taps on a base-dilated input's zeros left out; a ragged contraction's
  group-masked operands counted once per row, see :func:`_conv_flops`);
  elementwise arithmetic one per output element, a ``reduce`` one per input
  element; transcendentals (exp, log, tanh, rsqrt, ...) are counted apart;
  a fusion sums its fused computation (recursively);
* bytes: operands read plus results written; a fusion parameter only sliced
  inside (``dynamic-slice``, ``slice``, ``gather``) reads the slices, and a
  fusion whose root updates a buffer in place (``dynamic-update-slice``,
  ``scatter``) writes the update, not the buffer. Operands and results the
  compiler placed in VMEM (layout memory space ``S(1)``) are counted apart:
  ``hbm_bytes`` are those in HBM (memory space 0).

A ``while`` loop's trip count is read from its condition when that is
``counter < constant`` (the loops ``lax.scan`` and ``fori_loop`` build, which
count from 0); otherwise it is 1 and :attr:`Module.notes` says so.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_COMP_HEAD = re.compile(r"^(ENTRY\s+)?%([\w.\-]+)\s*\((.*)\)\s*->\s*(.*?)\s*\{\s*$")
_INSTR = re.compile(r"^\s*(ROOT\s+)?%([\w.\-]+)\s*=\s*(.*)$")
_ARRAY = re.compile(r"\b(pred|s4|u4|s8|u8|s16|u16|s32|u32|s64|u64|f16|bf16|f32|f64|f8e4m3fn|f8e5m2|f8e4m3b11fnuz|"
                    r"f8e4m3fnuz|f8e5m2fnuz|c64|c128|token)\[([\d,]*)\](\{[^}]*\})?")
_OPERAND = re.compile(r"%([\w.\-]+)")
_CALLS = re.compile(r"\b(?:calls|body|condition|to_apply)=%([\w.\-]+)")
_BODY = re.compile(r"\bbody=%([\w.\-]+)")
_COND = re.compile(r"\bcondition=%([\w.\-]+)")
_CALLS_ONLY = re.compile(r"\bcalls=%([\w.\-]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_MEMSPACE = re.compile(r"S\((\d+)\)")
_LHS_CONTRACT = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([\w?]+)_([\w?]+)->([\w?]+)")
_WINDOW = re.compile(r"window=\{size=([\dx]+)")
_LHS_DILATE = re.compile(r"lhs_dilate=([\dx]+)")
_COST_ESTIMATE = re.compile(r'"cost_estimate":\{"flops":"(\d+)","transcendentals":"(\d+)"')
_BYTES_ESTIMATE = re.compile(r'"cost_estimate":\{[^}]*"bytes_accessed":"(\d+)"')
_ALIASING = re.compile(r"output_to_operand_aliasing=\{(.*?)\}(?:,\s*\w+=|$)")
_ALIAS_OPERAND = re.compile(r":\s*\((\d+),")
_METADATA = re.compile(r"metadata=\{[^}]*\}")
_GROUPS_LIST = re.compile(r"replica_groups=\{\{([\d,]*)\}")
_GROUPS_IOTA = re.compile(r"replica_groups=\[(\d+),(\d+)\]<=")
_GROUPS_MESH = re.compile(r"replica_groups=mesh\[([^\]]*)\]\s*\{([^}]*)\}")

BITS: dict[str, int] = {"pred": 8, "s4": 4, "u4": 4, "s8": 8, "u8": 8, "s16": 16, "u16": 16, "s32": 32, "u32": 32,
                        "s64": 64, "u64": 64, "f16": 16, "bf16": 16, "f32": 32, "f64": 64, "c64": 64, "c128": 128,
                        "token": 0}
#: Memory space of VMEM in TPU HLO layouts (``S(1)``); 0 (no annotation) is HBM.
VMEM_SPACE = 1
TRANSCENDENTAL = frozenset({"exponential", "exponential-minus-one", "log", "log-plus-one", "tanh", "rsqrt", "sqrt",
                            "cbrt", "power", "sine", "cosine", "tan", "atan2", "logistic", "erf"})
ELEMENTWISE = frozenset({"add", "subtract", "multiply", "divide", "maximum", "minimum", "negate", "abs", "compare",
                         "select", "and", "or", "xor", "not", "remainder", "clamp", "sign", "floor", "ceil",
                         "round-nearest-even", "round-nearest-afz", "shift-left", "shift-right-logical",
                         "shift-right-arithmetic", "is-finite"})
#: Opcodes that move no data and run no code of their own.
FREE = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "after-all", "partition-id",
                  "replica-id", "opt-barrier", "add-dependency", "domain"})
COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
               "ragged-all-to-all")
#: Asynchronous copies (DMAs) the compiler issues: their bytes move, their ``-done`` half waits.
ASYNC_COPIES = ("copy-start", "slice-start")


@dataclass(frozen=True)
class Array:
    dtype: str
    dims: tuple[int, ...]
    memory_space: int

    @property
    def bytes(self) -> int:
        return self.elements * _bits(self.dtype) // 8

    @property
    def elements(self) -> int:
        return math.prod(self.dims)


def _bits(dtype: str) -> int:
    if dtype in BITS:
        return BITS[dtype]
    return 8 if dtype.startswith("f8") else 32


def parse_arrays(type_text: str) -> tuple[Array, ...]:
    """Every array of a (possibly tuple) HLO type, with its memory space."""
    out = []
    for m in _ARRAY.finditer(type_text):
        dims = tuple(int(d) for d in m.group(2).split(",") if d)
        space = _MEMSPACE.search(m.group(3) or "")
        out.append(Array(dtype=m.group(1), dims=dims, memory_space=int(space.group(1)) if space else 0))
    return tuple(out)


def _nbytes(arrays: tuple[Array, ...], *, hbm_only: bool = False) -> int:
    return sum(a.elements * _bits(a.dtype) // 8 for a in arrays if not hbm_only or a.memory_space == 0)


@dataclass
class Instruction:
    name: str
    opcode: str
    #: The result type text (arrays parsed into ``arrays``).
    arrays: tuple[Array, ...]
    operands: tuple[str, ...]
    #: The operand list as printed (a parameter's number, a constant's value).
    args_text: str
    #: The rest of the line after the operand list (attributes).
    attrs: str
    root: bool
    #: JAX's name stack of the op (``jit(f)/while/body/qkv_proj/dot_general``), "" when absent.
    op_name: str
    #: Computations it calls (fusion body, while body/condition, reducer).
    calls: tuple[str, ...]
    #: The result type as printed, layout and tiling included.
    type_text: str = ""


@dataclass
class Computation:
    name: str
    entry: bool
    instructions: list[Instruction] = field(default_factory=list)

    def by_name(self) -> dict[str, Instruction]:
        return {i.name: i for i in self.instructions}

    @property
    def root(self) -> Instruction | None:
        return next((i for i in self.instructions if i.root), self.instructions[-1] if self.instructions else None)


def _split_call(rest: str) -> tuple[str, str, str, str]:
    """(type text, opcode, operand text, attributes) of the text after ``name =``."""
    # the type is everything before the opcode: the opcode is the last identifier before the first '(' at depth 0
    depth = 0
    i = 0
    while i < len(rest):
        c = rest[i]
        if c in "([{":
            if c == "(" and depth == 0:
                head = rest[:i]
                m = re.search(r"([\w\-]+)$", head)
                if m and m.start() > 0 and head[m.start() - 1] == " ":
                    type_text, opcode = head[:m.start()].strip(), m.group(1)
                    j, d = i, 0
                    while j < len(rest):
                        if rest[j] == "(":
                            d += 1
                        elif rest[j] == ")":
                            d -= 1
                            if d == 0:
                                break
                        j += 1
                    return type_text, opcode, rest[i + 1:j], rest[j + 1:]
            depth += 1
        elif c in ")]}":
            depth -= 1
        i += 1
    return rest, "", "", ""


def parse_module(text: str) -> dict[str, Computation]:
    """Computations of an HLO module text by name."""
    comps: dict[str, Computation] = {}
    cur: Computation | None = None
    for line in text.splitlines():
        if cur is None:
            m = _COMP_HEAD.match(line)
            if m:
                cur = Computation(name=m.group(2), entry=bool(m.group(1)))
                comps[cur.name] = cur
            continue
        if line.startswith("}"):
            cur = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        type_text, opcode, operand_text, attrs = _split_call(m.group(3))
        op_name = _OP_NAME.search(attrs)
        cur.instructions.append(Instruction(
            name=m.group(2), opcode=opcode, arrays=parse_arrays(type_text),
            operands=tuple(_OPERAND.findall(operand_text)), args_text=operand_text.strip(), attrs=attrs, root=bool(m.group(1)),
            op_name=op_name.group(1) if op_name else "", calls=tuple(_CALLS.findall(attrs)), type_text=type_text))
    return comps


def entry(comps: dict[str, Computation]) -> Computation:
    for c in comps.values():
        if c.entry:
            return c
    raise ValueError("the HLO module has no ENTRY computation")


# --------------------------------------------------------------------------- work of one instruction


@dataclass(frozen=True, kw_only=True)
class Work:
    flops: float = 0.0
    transcendentals: float = 0.0
    #: Bytes read and written, wherever they live.
    bytes: float = 0.0
    #: The part in HBM (memory space 0).
    hbm_bytes: float = 0.0

    def __add__(self, other: "Work") -> "Work":
        return Work(flops=self.flops + other.flops, transcendentals=self.transcendentals + other.transcendentals,
                    bytes=self.bytes + other.bytes, hbm_bytes=self.hbm_bytes + other.hbm_bytes)

    def scaled(self, k: float) -> "Work":
        return Work(flops=self.flops * k, transcendentals=self.transcendentals * k, bytes=self.bytes * k,
                    hbm_bytes=self.hbm_bytes * k)


def _dot_flops(ins: Instruction, shapes: dict[str, tuple[Array, ...]]) -> float:
    out = sum(a.elements for a in ins.arrays)
    lhs = shapes.get(ins.operands[0], ()) if ins.operands else ()
    m = _LHS_CONTRACT.search(ins.attrs)
    if not lhs or not m:
        return 2.0 * out
    k = math.prod(lhs[0].dims[int(d)] for d in m.group(1).split(",") if d)
    return 2.0 * out * k


def _group_mask(comps: dict[str, Computation], producers: dict[str, Instruction], value: str) -> tuple[str, int] | None:
    """(mask operand, groups G) when ``value`` is a fusion computing ``select(broadcast(mask), x, broadcast(0))``
    with ``mask`` a pred[G, R] parameter: ``x`` broadcast over G groups, each group keeping its own rows."""
    ins = producers.get(value)
    called = _CALLS_ONLY.search(ins.attrs) if ins is not None and ins.opcode == "fusion" else None
    comp = comps.get(called.group(1)) if called else None
    root = comp.root if comp is not None else None
    if root is None or root.opcode != "select" or len(root.operands) != 3:
        return None
    inner = comp.by_name()
    keep, zero = inner.get(root.operands[0]), inner.get(root.operands[2])
    if keep is None or zero is None or keep.opcode != "broadcast" or zero.opcode != "broadcast":
        return None
    mask, fill = inner.get(keep.operands[0]) if keep.operands else None, inner.get(zero.operands[0]) if zero.operands else None
    if (mask is None or fill is None or mask.opcode != "parameter" or fill.opcode != "constant"
            or fill.args_text.strip() not in ("0", "0.0", "-0")):
        return None
    arr = mask.arrays[0] if mask.arrays else None
    if arr is None or arr.dtype != "pred" or len(arr.dims) != 2 or not mask.args_text.strip().isdigit():
        return None
    index = int(mask.args_text)
    return (ins.operands[index], arr.dims[0]) if index < len(ins.operands) else None


def _conv_flops(ins: Instruction, shapes: dict[str, tuple[Array, ...]], comps: dict[str, Computation] | None = None,
                producers: dict[str, Instruction] | None = None) -> float:
    """2 x output elements x (input features x window taps that land on real input); a batched matmul the
    compiler writes as a base-dilated convolution (window size = lhs dilation) has one tap per output.

    jax's ragged contraction (``ragged_dot_general`` with the group dimension on the contracting rows) lowers
    to such a convolution over G masked copies of both operands, each keeping the rows of one group
    (``select(row mask pred[G, R], x, 0)``, the same mask on both): every row is in one group, so the work is
    the dense count / G (the compiled program walks each group's own rows: ``group_starts`` / ``group_ends``)."""
    out = sum(a.elements for a in ins.arrays)
    kernel = shapes.get(ins.operands[1], ()) if len(ins.operands) > 1 else ()
    m = _DIM_LABELS.search(ins.attrs)
    if not kernel or not m:
        return 2.0 * out
    labels, dims = m.group(2), kernel[0].dims
    i = labels.find("i")
    per_out = float(dims[i]) if 0 <= i < len(dims) else 1.0
    w = _WINDOW.search(ins.attrs)
    sizes = [int(x) for x in w.group(1).split("x")] if w else []
    dil = _LHS_DILATE.search(ins.attrs)
    dilate = [int(x) for x in dil.group(1).split("x")] if dil else [1] * len(sizes)
    for size, d in zip(sizes, dilate):
        per_out *= math.ceil(size / max(d, 1))
    if comps is not None and producers is not None and len(ins.operands) == 2:
        masks = [_group_mask(comps, producers, o) for o in ins.operands]
        if masks[0] is not None and masks[0] == masks[1]:
            per_out /= masks[0][1]
    return 2.0 * out * per_out


def computation_flops(comps: dict[str, Computation], name: str, _memo: dict | None = None) -> tuple[float, float]:
    """(flops, transcendentals) of one run of a (fused) computation."""
    memo = _memo if _memo is not None else {}
    if name in memo:
        return memo[name]
    comp = comps.get(name)
    if comp is None:
        return 0.0, 0.0
    shapes = {i.name: i.arrays for i in comp.instructions}
    producers = comp.by_name()
    flops = trans = 0.0
    for ins in comp.instructions:
        f, t = instruction_flops(comps, ins, shapes, memo, producers)
        flops += f
        trans += t
    memo[name] = (flops, trans)
    return flops, trans


def instruction_flops(comps: dict[str, Computation], ins: Instruction, shapes: dict[str, tuple[Array, ...]],
                      memo: dict | None = None, producers: dict[str, Instruction] | None = None) -> tuple[float, float]:
    """(flops, transcendentals) of one instruction; ``producers``: its computation's instructions by name
    (how a convolution tells a ragged contraction's masked operands)."""
    out = float(sum(a.elements for a in ins.arrays))
    op = ins.opcode
    if op == "dot":
        return _dot_flops(ins, shapes), 0.0
    if op == "convolution":
        return _conv_flops(ins, shapes, comps, producers), 0.0
    if op == "fusion":
        called = _CALLS_ONLY.search(ins.attrs)
        return computation_flops(comps, called.group(1), memo) if called else (0.0, 0.0)
    if op == "custom-call":  # a Pallas kernel's own cost estimate, when it gives one
        m = _COST_ESTIMATE.search(ins.attrs)
        return (float(m.group(1)), float(m.group(2))) if m else (0.0, 0.0)
    if op in TRANSCENDENTAL:
        return 0.0, out
    if op in ELEMENTWISE:
        return out, 0.0
    if op in ("reduce", "reduce-window", "all-reduce", "reduce-scatter"):
        inputs = sum(a.elements for o in ins.operands[: max(1, len(ins.operands) // 2)] for a in shapes.get(o, ()))
        return float(inputs), 0.0
    return 0.0, 0.0


_PASS_THROUGH = frozenset({"bitcast", "reshape", "copy", "convert", "transpose", "broadcast"})


def _sliced_read(comps: dict[str, Computation], comp: Computation, value: str, users: dict[str, list[Instruction]],
                 depth: int = 0) -> float | None:
    """Bytes read of ``value`` when every path to its uses ends in a slice (dynamic-slice, slice, gather),
    following layout-only ops and nested fusions; None when something reads it whole."""
    us = users.get(value, [])
    if not us or depth > 8:
        return None
    total = 0.0
    for u in us:
        if u.opcode in ("dynamic-slice", "slice", "gather") and u.operands and u.operands[0] == value:
            total += _nbytes(u.arrays)
            continue
        if u.opcode == "fusion":
            called = _CALLS_ONLY.search(u.attrs)
            inner = comps.get(called.group(1)) if called else None
            if inner is None:
                return None
            idx = [i for i, o in enumerate(u.operands) if o == value]
            reads = _fused_param_reads(comps, inner.name, depth + 1)
            if all(reads.get(i) is not None for i in idx):
                total += sum(reads[i] for i in idx)
                continue
            if not _layout_only(inner):
                return None
            # else a nested copy/bitcast fusion (a re-tiling of the whole array): followed like a layout-only op
        elif u.opcode not in _PASS_THROUGH:
            return None
        part = _sliced_read(comps, comp, u.name, users, depth + 1)  # what reads u's result reads the value
        if part is None:
            return None
        total += part
    return total


def _layout_only(comp: Computation) -> bool:
    """Whether a fused computation only moves one parameter's elements (copies, bitcasts, transposes...)."""
    params = [i for i in comp.instructions if i.opcode == "parameter"]
    return len(params) == 1 and all(i.opcode == "parameter" or i.opcode in _PASS_THROUGH for i in comp.instructions)


def _fused_param_reads(comps: dict[str, Computation], name: str, depth: int = 0) -> dict[int, float | None]:
    """Parameter number -> bytes a fused computation reads of it when it only slices it (None: reads it whole)."""
    comp = comps.get(name)
    if comp is None or depth > 8:
        return {}
    params = {ins.name: int(ins.args_text) for ins in comp.instructions
              if ins.opcode == "parameter" and ins.args_text.isdigit()}
    users: dict[str, list[Instruction]] = {}
    for ins in comp.instructions:
        for o in ins.operands:
            users.setdefault(o, []).append(ins)
    return {idx: _sliced_read(comps, comp, pname, users, depth) for pname, idx in params.items()}


def instruction_work(comps: dict[str, Computation], ins: Instruction, shapes: dict[str, tuple[Array, ...]],
                     memo: dict | None = None) -> Work:
    """FLOPs and bytes of one top-level instruction (see the module docstring)."""
    flops, trans = instruction_flops(comps, ins, shapes, memo)
    if ins.opcode in FREE or ins.opcode.endswith("-done"):
        return Work(flops=flops, transcendentals=trans)
    operands = [shapes.get(o, ()) for o in ins.operands]
    if ins.opcode in ASYNC_COPIES:  # a DMA: reads what it copies, writes its destination buffer
        src = operands[0] if operands else ()
        dest = ins.arrays[1:2] if ins.opcode == "slice-start" else ins.arrays[:1]
        # a slice-start copies one slice of its operand (the compiler cuts a big prefetch into many of them):
        # it reads as many bytes as it writes, from wherever the operand lives
        read = float(_nbytes(src) if ins.opcode == "copy-start" else _nbytes(dest))
        read_hbm = read if all(a.memory_space == 0 for a in src) else 0.0
        return Work(bytes=read + _nbytes(dest), hbm_bytes=read_hbm + _nbytes(dest, hbm_only=True))
    aliased = {int(m) for a in _ALIASING.findall(ins.attrs) for m in _ALIAS_OPERAND.findall(a)}
    if ins.opcode == "custom-call" and aliased:
        # a kernel that updates a buffer in place (e.g. a KV-cache write): the buffer is neither read nor
        # written whole; the kernel's own CostEstimate says what it touches, else the other operands and
        # their size again for the update written
        est = _BYTES_ESTIMATE.search(ins.attrs)
        if est:
            return Work(flops=flops, transcendentals=trans, bytes=float(est.group(1)), hbm_bytes=float(est.group(1)))
        rest = [a for i, a in enumerate(operands) if i not in aliased]
        moved = 2.0 * sum(_nbytes(a) for a in rest)
        return Work(flops=flops, transcendentals=trans, bytes=moved,
                    hbm_bytes=2.0 * sum(_nbytes(a, hbm_only=True) for a in rest))
    written = ins.arrays
    if ins.opcode.endswith("-start"):  # async collectives: the result tuple repeats the operands
        written = ins.arrays[len(operands):] or ins.arrays
    read = total_read = 0.0
    hbm_read = 0.0
    sliced: dict[int, float | None] = {}
    in_place = False
    if ins.opcode == "fusion":
        called = _CALLS_ONLY.search(ins.attrs)
        if called:
            sliced = _fused_param_reads(comps, called.group(1))
            root = comps[called.group(1)].root if called.group(1) in comps else None
            in_place = root is not None and root.opcode in ("dynamic-update-slice", "scatter")
    if ins.opcode in ("dynamic-update-slice", "scatter"):
        in_place = True
    biggest = max(range(len(operands)), key=lambda i: _nbytes(operands[i]), default=None) if in_place else None
    for i, arrs in enumerate(operands):
        if i == biggest:
            continue  # the buffer updated in place: neither read nor rewritten whole
        part = sliced.get(i)
        whole = float(_nbytes(arrs))
        hbm = float(_nbytes(arrs, hbm_only=True))
        if part is not None and whole > 0:
            hbm = hbm * part / whole
            whole = part
        total_read += whole
        hbm_read += hbm
    read = total_read
    if in_place and biggest is not None:
        upd = max((_nbytes(a) for i, a in enumerate(operands) if i != biggest), default=0)  # the update, written
        space_hbm = all(a.memory_space == 0 for a in ins.arrays)
        return Work(flops=flops, transcendentals=trans, bytes=read + upd, hbm_bytes=hbm_read + (upd if space_hbm
                                                                                                  else 0.0))
    return Work(flops=flops, transcendentals=trans, bytes=read + _nbytes(written),
                hbm_bytes=hbm_read + _nbytes(written, hbm_only=True))


def while_trip_count(comps: dict[str, Computation], ins: Instruction) -> int | None:
    """Trip count of a ``while`` whose condition is ``counter < constant`` (counting from 0), else None."""
    m = _COND.search(ins.attrs)
    cond = comps.get(m.group(1)) if m else None
    if cond is None or cond.root is None:
        return None
    root = cond.root
    if root.opcode != "compare" or "direction=LT" not in root.attrs:
        return None
    by = cond.by_name()
    for o in root.operands[1:]:
        c = by.get(o)
        if c is not None and c.opcode == "constant" and re.fullmatch(r"-?\d+", c.args_text):
            return int(c.args_text)
    return None


def collective_group_size(ins: Instruction, default: int) -> int:
    """Chips in one replica group of a collective (``default`` when the text does not say)."""
    m = _GROUPS_LIST.search(ins.attrs)
    if m:
        return max(1, len([x for x in m.group(1).split(",") if x]))
    m = _GROUPS_IOTA.search(ins.attrs)
    if m:
        return int(m.group(2))
    m = _GROUPS_MESH.search(ins.attrs)
    if m:
        sizes = dict((k.strip().strip("'"), int(v)) for k, v in
                     (kv.split("=") for kv in m.group(1).split(",") if "=" in kv))
        axes = [a.strip().strip("'") for a in m.group(2).split(",") if a.strip()]
        return math.prod(sizes.get(a, 1) for a in axes) or default
    return default


# --------------------------------------------------------------------------- identical programs

#: Attributes that change what an instruction computes (the rest: names, metadata, the compiler's config).
_STRUCTURAL = re.compile(r"\b(dimensions|slice|slice_sizes|dynamic_slice_sizes|offset_dims|collapsed_slice_dims|"
                         r"start_index_map|index_vector_dim|lhs_contracting_dims|rhs_contracting_dims|lhs_batch_dims|"
                         r"rhs_batch_dims|dim_labels|window|direction|kind|custom_call_target|index|padding|"
                         r"iota_dimension|update_window_dims|inserted_window_dims|scatter_dims_to_operand_dims|"
                         r"feature_group_count|batch_group_count|lhs_dilate|rhs_dilate)=(\{[^}]*\}|[^,\s]+)")


def _computation_signature(comps: dict[str, Computation], name: str, memo: dict[str, str], depth: int = 0) -> str:
    """What a computation computes, without its names: every instruction's type, opcode, structural attributes,
    operands by position and called computations (recursively)."""
    if name in memo:
        return memo[name]
    comp = comps.get(name)
    if comp is None or depth > 8:
        return name
    pos = {ins.name: i for i, ins in enumerate(comp.instructions)}
    lines = []
    for ins in comp.instructions:
        value = ins.args_text if ins.opcode in ("parameter", "constant") else ""
        lines.append("|".join((ins.type_text, ins.opcode, value, ",".join(str(pos.get(o, o)) for o in ins.operands),
                               ";".join(m.group(0) for m in _STRUCTURAL.finditer(ins.attrs)),
                               ",".join(_computation_signature(comps, c, memo, depth + 1) for c in ins.calls),
                               "root" if ins.root else "")))
    memo[name] = "\n".join(lines)
    return memo[name]


def program_signature(comps: dict[str, Computation], ins: Instruction, types: dict[str, str],
                      memo: dict[str, str]) -> str:
    """A key equal for two top-level instructions that compile to the same program: the same opcode, result and
    operand types (layouts included), structural attributes and called computations up to names. The TPU
    compiler dumps the schedule of such a program once (under one of their names); the others reuse it.
    ``types``: instruction name -> result type text in ``ins``'s computation."""
    # a custom call's program is in its attributes (a Pallas kernel's serialized body): all of them count
    attrs = (_METADATA.sub("", ins.attrs) if ins.opcode == "custom-call"
             else ";".join(m.group(0) for m in _STRUCTURAL.finditer(ins.attrs)))
    return "\n".join((ins.type_text, ins.opcode, ",".join(types.get(o, "?") for o in ins.operands), attrs,
                      *(_computation_signature(comps, c, memo) for c in ins.calls)))
