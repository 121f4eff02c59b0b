"""The bundled matmul's variants (its code paths: activation and weight dtypes, weight scales, quantize_activations) and
the typed keys of its tuned table, listed once (no jax).

The compile checks (tests/compiler/kernel_variants.py), the variants benchmark
(tests/benchmarks/bench_matmul_variants.py) and the tuned configurations (kernels/matmul/entry.py) all take the
variants from :data:`VARIANTS`; the kernel looks its defaults up by :class:`TunedKey`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: --shape dtype text of each dtype name of the table (perfmodel's names; int4 is stored as uint8 bytes).
_SHAPE_DTYPE = {"bf16": "bf16", "fp32": "f32", "int8": "int8", "fp8": "fp8", "int4": "uint8"}


@dataclass(frozen=True, kw_only=True)
class TunedKey:
    """One configuration of the matmul tuned table (kernels/matmul/tuned.json): the MXU's operand dtypes ("int8"
    activations: quantize_activations's codes of float x), blockwise weight scales, and decode-sized calls (at most
    blocks.DECODE_MAX_M rows)."""

    x: str
    w: str
    blockwise: bool = False
    decode: bool = False

    def text(self) -> str:
        """The key as the JSON spells it: "<x> x <w>", then " blockwise", then " decode"."""
        return f"{self.x} x {self.w}" + (" blockwise" if self.blockwise else "") + (" decode" if self.decode else "")


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One code path of the matmul: ``x`` activations (bf16 or fp32) against ``w`` weights (x's own dtype, int8,
    fp8 or packed int4), their ``scales`` ("none", "per-channel": [N], "per-block": one per 128 rows of K), and
    ``quantize_activations`` (x quantized per token to int8 codes in the kernel: int8 x int8, w4a8 with int4
    weights)."""

    #: The variant's label in test ids, the benchmark's --variants and its table.
    name: str
    x: str = "bf16"
    w: str
    scales: str = "none"
    quantize_activations: bool = False

    @property
    def blockwise(self) -> bool:
        """One weight scale per 128 rows of K."""
        return self.scales == "per-block"

    def static(self) -> dict[str, Any]:
        """The matmul's static keyword arguments of the variant: quantize_activations, then w_dtype (int4)."""
        static: dict[str, Any] = {}
        if self.quantize_activations:
            static["quantize_activations"] = True
        if self.w == "int4":
            static["w_dtype"] = "int4"
        return static

    def shapes(self, m: int, k: int, n: int, *, bias: bool = False) -> tuple[str, ...]:
        """--shape texts of a call of M x K activations against K x N weights (int4: [K/2, N] uint8, two codes per
        byte), then an f32 [N] bias when ``bias``, then the f32 scales."""
        rows = k // 2 if self.w == "int4" else k
        shapes = [f"x={m}x{k}:{_SHAPE_DTYPE[self.x]}", f"w={rows}x{n}:{_SHAPE_DTYPE[self.w]}"]
        shapes += [f"bias={n}:f32"] if bias else []
        shapes += {"none": [], "per-channel": [f"w_scale={n}:f32"],
                   "per-block": [f"w_scale={k // 128}x{n}:f32"]}[self.scales]
        return tuple(shapes)

    def tuned_key(self, *, decode: bool = False) -> TunedKey:
        """The variant's configuration in the tuned table (quantize_activations: int8 codes on the MXU)."""
        return TunedKey(x="int8" if self.quantize_activations else self.x, w=self.w, blockwise=self.blockwise,
                        decode=decode)


#: Every variant, bf16 activations first (the order of the benchmark's table), then fp32 activations.
VARIANTS: tuple[Variant, ...] = (
    Variant(name="bf16", w="bf16"),
    Variant(name="bf16 x int8", w="int8", scales="per-channel"),
    Variant(name="bf16 x int8 blockwise", w="int8", scales="per-block"),
    Variant(name="w8a8", w="int8", scales="per-channel", quantize_activations=True),
    Variant(name="w8a8 blockwise", w="int8", scales="per-block", quantize_activations=True),
    Variant(name="bf16 x int4", w="int4", scales="per-channel"),
    Variant(name="bf16 x int4 blockwise", w="int4", scales="per-block"),
    Variant(name="bf16 x fp8", w="fp8", scales="per-channel"),
    Variant(name="w4a8", w="int4", scales="per-channel", quantize_activations=True),
    Variant(name="w4a8 blockwise", w="int4", scales="per-block", quantize_activations=True),
    Variant(name="fp32", x="fp32", w="fp32"),
    Variant(name="fp32 x int8", x="fp32", w="int8", scales="per-channel"),
    Variant(name="fp32 x fp8", x="fp32", w="fp8", scales="per-channel"),
)
BY_NAME: dict[str, Variant] = {v.name: v for v in VARIANTS}
#: The variants of bf16 activations (the serving paths): what the compile checks and the benchmark run.
BF16_VARIANTS: tuple[Variant, ...] = tuple(v for v in VARIANTS if v.x == "bf16")
