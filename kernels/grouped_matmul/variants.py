"""The bundled grouped matmul's variants (its code paths: lhs and rhs dtypes, rhs scales) and the typed keys of its
tuned table, listed once (no jax).

The compile checks (tests/compiler/kernel_variants.py), the benchmark (tests/benchmarks/bench_grouped_matmul.py)
and the tuned configurations (kernels/grouped_matmul/entry.py) all take the variants from :data:`VARIANTS`; the
kernel looks its defaults up by :class:`TunedKey` (kernels/grouped_matmul/blocks.py).
"""

from __future__ import annotations

from dataclasses import dataclass

#: --shape dtype text of each dtype name of the table (perfmodel's names, as tiling.matmul_dtype_name gives them).
_SHAPE_DTYPE = {"bf16": "bf16", "fp32": "f32", "int8": "int8", "fp8": "fp8"}
#: Bytes per element of each dtype name of the table.
_ITEMSIZE = {"bf16": 2, "fp32": 4, "int8": 1, "fp8": 1}


@dataclass(frozen=True, kw_only=True)
class TunedKey:
    """One configuration of the grouped matmul's tuned table (kernels/grouped_matmul/tuned.json): the lhs and rhs
    dtypes, and decode-sized calls (all groups' rows at most kernels.matmul.blocks.DECODE_MAX_M)."""

    lhs: str
    rhs: str
    decode: bool = False

    def text(self) -> str:
        """The key as the JSON spells it: "<lhs> x <rhs>", then " decode"."""
        return f"{self.lhs} x {self.rhs}" + (" decode" if self.decode else "")


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One code path of the grouped matmul: ``lhs`` rows (bf16) against every expert's ``rhs`` weights (bf16, int8
    or fp8), with per-channel rhs scales ([experts, N] f32, applied to the f32 accumulator) when ``scaled``."""

    #: The variant's label in test ids, the benchmark's --variants and its table.
    name: str
    lhs: str = "bf16"
    rhs: str
    scaled: bool = False

    @property
    def rhs_itemsize(self) -> int:
        """Bytes per rhs element in HBM."""
        return _ITEMSIZE[self.rhs]

    def shapes(self, m: int, k: int, n: int, *, experts: int) -> tuple[str, ...]:
        """--shape texts of a call of M x K lhs rows split evenly over ``experts`` groups against their K x N
        weights: lhs, rhs, group_sizes, then the f32 [experts, N] rhs scales when ``scaled``."""
        shapes = (f"lhs={m}x{k}:{_SHAPE_DTYPE[self.lhs]}", f"rhs={experts}x{k}x{n}:{_SHAPE_DTYPE[self.rhs]}",
                  f"group_sizes={experts}:int32={m // experts}")
        return shapes + ((f"rhs_scale={experts}x{n}:f32",) if self.scaled else ())

    def tuned_key(self, *, decode: bool = False) -> TunedKey:
        """The variant's configuration in the tuned table."""
        return TunedKey(lhs=self.lhs, rhs=self.rhs, decode=decode)


#: Every variant, in the order of the tuned table, the compile checks and the benchmark's table.
VARIANTS: tuple[Variant, ...] = (
    Variant(name="bf16", rhs="bf16"),
    Variant(name="bf16 x int8", rhs="int8", scaled=True),
    Variant(name="bf16 x fp8", rhs="fp8", scaled=True),
)
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
