"""Data types the model knows: names, sizes, aliases, and the MXU dtype rules.

Every op model takes dtype names as strings (``"bf16"``, ``"int8"``, ...);
:func:`parse_dtype` turns what a user typed into the canonical name and
raises :class:`~perfmodel.errors.InputError` naming the flag for anything
unknown. :func:`matmul_path` applies a chip's per-generation rules: which
operand dtype pair the MXU takes natively, and what has to be converted on
the VPU first when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfmodel.errors import InputError

if TYPE_CHECKING:  # pragma: no cover
    from perfmodel.hw.spec import ChipSpec


@dataclass(frozen=True, kw_only=True)
class DType:
    """One element type."""

    name: str
    bits: int
    #: "float" or "int".
    kind: str
    #: Key of ChipSpec.compute.matmul_flops_per_s_per_chip whose rate applies (None: not a matmul dtype).
    matmul_key: str | None
    #: VPU ops to widen one element to bf16/f32 (unpack, shift, convert); 0 for bf16/f32.
    widen_ops_per_element: int
    #: VPU ops to widen one element to an int8 MXU operand (int4 -> int8); None: not widened to int8.
    int8_widen_ops_per_element: int | None = None
    aliases: tuple[str, ...] = ()

    def widen_ops(self, to: str) -> int:
        """VPU ops per element to widen to MXU operand dtype ``to`` (0 when ``to`` is this dtype)."""
        if to == self.name:
            return 0
        if to == "int8" and self.int8_widen_ops_per_element is not None:
            return self.int8_widen_ops_per_element
        return self.widen_ops_per_element

    @property
    def itemsize_bytes(self) -> float:
        """Bytes per element (0.5 for int4)."""
        return self.bits / 8


#: Canonical dtypes. Widening costs are estimates of the VPU instruction count
#: per element to bring a packed narrow element to a bf16 MXU operand: int8 ->
#: bf16: unpack from the packed 32-bit lane layout, convert, repack to bf16 (3);
#: int4: shift + mask, convert, repack (4); fp8: unpack, exponent re-bias, repack
#: (3); int4 -> int8 (the w4a8 path): one unpack of the bitcast codes, no convert (1; the bundled
#: matmul's v5e decode step of 64x4096x1024 compiles to 2,210 bundles against 2,265 for int8 weights).
#: With these, an HBM-bound int8-weight GEMM on TPU v5e comes out ~1.4x of
#: bf16, not 2x (tests/model/test_fixed_costs.py), in line with the ~1.3x
#: quantized-serving gains the project's issue 10 cites.
DTYPES: dict[str, DType] = {
    d.name: d
    for d in (
        DType(name="fp32", bits=32, kind="float", matmul_key="fp32", widen_ops_per_element=0,
              aliases=("f32", "float32", "float")),
        DType(name="bf16", bits=16, kind="float", matmul_key="bf16", widen_ops_per_element=0,
              aliases=("bfloat16",)),
        DType(name="fp16", bits=16, kind="float", matmul_key="bf16", widen_ops_per_element=1,
              aliases=("f16", "float16", "half")),
        DType(name="fp8", bits=8, kind="float", matmul_key="fp8", widen_ops_per_element=3,
              aliases=("f8", "fp8_e4m3", "e4m3", "float8_e4m3fn", "fp8_e5m2", "e5m2", "float8_e5m2")),
        DType(name="int8", bits=8, kind="int", matmul_key="int8", widen_ops_per_element=3,
              aliases=("i8", "s8", "qint8")),
        DType(name="int4", bits=4, kind="int", matmul_key="int4", widen_ops_per_element=4,
              int8_widen_ops_per_element=1, aliases=("i4", "s4", "qint4")),
        DType(name="int32", bits=32, kind="int", matmul_key=None, widen_ops_per_element=1,
              aliases=("i32", "s32")),
    )
}

_BY_ALIAS: dict[str, str] = {alias: d.name for d in DTYPES.values() for alias in (d.name, *d.aliases)}

#: Bytes of one quantization scale (scales are stored in f32).
SCALE_BYTES = 4
#: Bytes of one page-table / index entry (int32).
INDEX_BYTES = 4


def is_quantized(dtype: str) -> bool:
    """Whether tensors of this (canonical) dtype carry scales: the int and fp8 types (8 bits or fewer)."""
    return DTYPES[dtype].bits <= 8


def default_kv_scale(kv_dtype: str) -> str:
    """The scale layout of a KV cache when none is given, the one default every op model and command uses
    (decode and ragged attention, KV-cache update, KV bytes per token, predict model): per-token f32 scales
    (one per token and KV head, for K and V; what the bundled kv_cache_update writes) for a quantized cache,
    none otherwise."""
    return "per-token" if is_quantized(kv_dtype) else "none"


def parse_dtype(text: str, flag: str = "`dtype`") -> str:
    """Canonical name of a dtype a user typed; InputError naming ``flag`` if unknown."""
    key = str(text).strip().lower().replace("-", "_")
    name = _BY_ALIAS.get(key) or _BY_ALIAS.get(key.replace("_", ""))
    if name is None:
        known = ", ".join(DTYPES)
        raise InputError(f"{flag}: unknown dtype '{text}'; use one of {known}")
    return name


def dtype_info(text: str, flag: str = "`dtype`") -> DType:
    return DTYPES[parse_dtype(text, flag)]


def itemsize(text: str, flag: str = "`dtype`") -> float:
    """Bytes per element of a dtype name."""
    return dtype_info(text, flag).itemsize_bytes


@dataclass(frozen=True, kw_only=True)
class MatmulPath:
    """How the MXU runs one (lhs, rhs) dtype pair on a chip."""

    #: Stored operand dtypes.
    lhs: str
    rhs: str
    #: Dtype each operand is fed to the MXU in (differs from the stored dtype when converted).
    lhs_fed: str
    rhs_fed: str
    #: Dtype whose peak rate applies (a key of the chip's matmul rate table).
    compute_dtype: str
    #: MXU passes per useful FLOP (fp32 on a chip without an fp32 MXU rate: by precision, see PRECISION_PASSES).
    passes: int
    notes: tuple[str, ...] = ()

    @property
    def converts_lhs(self) -> bool:
        return self.lhs_fed != self.lhs

    @property
    def converts_rhs(self) -> bool:
        return self.rhs_fed != self.rhs


#: Widening order tried when a pair has no native path (narrow -> wide).
_WIDEN_TO = ("bf16", "fp32")
#: Dot precisions (jax.lax.Precision, lower case) and the bf16 MXU passes an fp32 matmul takes at each on a chip
#: without an fp32 MXU rate (every TPU): DEFAULT rounds the operands to bf16 (one pass), HIGH runs three bf16
#: passes (bf16_3x), HIGHEST six (bf16_6x). Source: the jax.lax.Precision documentation
#: (https://docs.jax.dev/en/latest/_autosummary/jax.lax.Precision.html: "On TPU: performs float32 computations
#: in bfloat16 / in 3 bfloat16 passes / in 6 bfloat16 passes"). Mosaic and XLA honour a dot's precision.
PRECISION_PASSES: dict[str, int] = {"default": 1, "high": 3, "highest": 6}
#: bf16 passes of an fp32 matmul at Precision.HIGHEST (what the bundled kernels ask for with f32 operands).
FP32_EMULATION_PASSES = PRECISION_PASSES["highest"]


def _wider(a: DType, b: DType) -> DType:
    return a if a.bits >= b.bits else b


def parse_precision(text: str | None, flag: str = "`precision`") -> str:
    """Canonical dot precision ("default", "high", "highest"); None means "default" (jax's default for a dot
    without a precision). InputError naming ``flag`` otherwise."""
    if text is None:
        return "default"
    key = str(text).strip().lower()
    if key not in PRECISION_PASSES:
        raise InputError(f"{flag} '{text}' is not a dot precision; use one of {', '.join(PRECISION_PASSES)}")
    return key


def matmul_path(chip: "ChipSpec | None", lhs: str, rhs: str, precision: str | None = None) -> MatmulPath:
    """Per-generation dtype rule for an (lhs, rhs) matmul on ``chip`` at a dot ``precision`` (None: default).

    * A native pair (``chip.supports_matmul``) runs at the rate of its wider
      operand's dtype.
    * Otherwise the narrower operand(s) are widened on the VPU to the wider
      operand's dtype if ``w x w`` is native, else to bf16, else fp32.
    * fp32 on a chip without an fp32 matmul rate runs as bf16 passes: 1 at
      Precision.DEFAULT, 3 at HIGH, 6 at HIGHEST (:data:`PRECISION_PASSES`).
    ``chip=None`` assumes every pair is native (used for pl.CostEstimate).
    """
    lo, ro = DTYPES[parse_dtype(lhs, "`lhs_dtype`")], DTYPES[parse_dtype(rhs, "`rhs_dtype`")]
    prec = parse_precision(precision)
    wide = _wider(lo, ro)
    if chip is None:
        return MatmulPath(compute_dtype=wide.matmul_key or "bf16", lhs_fed=lo.name, rhs_fed=ro.name, passes=1,
                          lhs=lo.name, rhs=ro.name)
    notes: list[str] = []
    if chip.supports_matmul(lo.name, ro.name) or (lo.name == ro.name == "fp32"):
        lhs_fed, rhs_fed = lo.name, ro.name
    else:
        candidates = [wide.name] + [d for d in _WIDEN_TO if DTYPES[d].bits > wide.bits or d == wide.name]
        # fp32 x fp32 counts as a target where native even without an fp32 rate (emulated in bf16 passes below).
        target = next((d for d in candidates if chip.supports_matmul(d, d)
                       and (chip.matmul_rate(d) or d == "fp32")), None)
        if target is None:
            target = "bf16"
        lhs_fed, rhs_fed = target, target
        converted = " and ".join(f"{side} ({o.name})" for side, o in (("lhs", lo), ("rhs", ro)) if o.name != target)
        notes.append(
            f"{chip.name} has no native {lo.name} x {ro.name} MXU path: converts {converted} to {target} "
            f"on the VPU and runs at the {target} rate"
        )
    compute = _wider(DTYPES[lhs_fed], DTYPES[rhs_fed]).matmul_key or "bf16"
    passes = 1
    if compute == "fp32" and chip.matmul_rate("fp32") is None:
        compute, passes = "bf16", PRECISION_PASSES[prec]
        notes.append(f"{chip.name} lists no fp32 MXU rate: fp32 matmul at Precision.{prec.upper()} modelled as "
                     f"{passes} bf16 pass{'es' if passes > 1 else ''}")
    if chip.matmul_rate(compute) is None:
        known = ", ".join(sorted(chip.compute.matmul_flops_per_s_per_chip))
        raise InputError(f"{chip.name} has no {compute} matmul rate in its spec; it has: {known}")
    return MatmulPath(compute_dtype=compute, lhs_fed=lhs_fed, rhs_fed=rhs_fed, passes=passes,
                      notes=tuple(notes), lhs=lo.name, rhs=ro.name)
