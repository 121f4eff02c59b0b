"""Block sizes of the matmul kernel: the validated dataclass and per-chip defaults.

The per-chip defaults are data chosen by the schedule model's block-size advisor
(``perfmodel tune matmul``) and stored in ``kernels/matmul/tuned.json``
(chip name -> "LHS x RHS" operand dtypes -> blocks); see :func:`default_block_table`.
Stored defaults fit the chip's default scoped VMEM limit unless the JSON gives
them a ``vmem_limit_bytes``. Blocks larger than the default scoped VMEM limit
make the wrapper raise ``vmem_limit_bytes`` up to the physical VMEM.
"""

from __future__ import annotations

import functools

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

from kernels import tiling
from kernels.matmul.variants import TunedKey

if TYPE_CHECKING:  # pragma: no cover
    from kernels.perf import ChipSpec


#: x tiles (``bm x bk``) of internal scratch Mosaic's bf16 matmul keeps when it stages the LHS.
X_STAGING_TILES = 1.5
#: f32 x / w tiles of internal scratch of an f32 (HIGHEST precision) matmul: the operands' bf16 splits.
F32_X_SPLIT_TILES = 4.75
F32_W_SPLIT_TILES = 0.5


@dataclass(frozen=True, kw_only=True)
class MatmulVariant:
    """What a call adds to the VMEM of the plain kernel.

    ``x_row``: the width of a resident x row block (K rounded up to bk; it replaces the x tile: quantize_activations,
    and small row blocks of decode GEMMs, fetched once per row block instead of once per column block);
    ``x_codes``: quantize_activations's int8 codes of that row and its per-token scales (``code_slots`` row blocks of
    them: 2 when the next row block is quantized ahead; ``float_codes``: held in bf16 for the bf16 MXU,
    :func:`kernels.matmul.rules.blockwise_codes_on_bf16_mxu`); ``scale_rows``: rows of the resident
    [rows, bn] f32 block of blockwise weight scales (0: none); ``w_dequant``: one dequantized w tile in x's dtype
    (int4 weights; blockwise scales at large bm), int8 with ``x_codes`` (bf16 with ``float_codes``); ``x_share_rows``
    (quantize_activations's lookahead): the streamed x block is that many rows of the row (the share of the next row
    block a step quantizes), plus one single-buffered [bm, x_row] block (row block 0).
    """

    x_row: int | None = None
    x_codes: bool = False
    #: Row blocks of codes (and scales) held: 2 when quantize_activations quantizes the next row block ahead.
    code_slots: int = 1
    float_codes: bool = False
    #: Two stacked int8 code planes of x (bf16 x int4 at decode on the int8 MXU): twice the code rows and the
    #: accumulator's.
    split_codes: bool = False
    scale_rows: int = 0
    w_dequant: bool = False
    x_share_rows: int | None = None


PLAIN = MatmulVariant()
T = TypeVar("T")


def w_dequant_dtype(x_dtype: Any, *, x_codes: bool, float_codes: bool = False) -> Any:
    """The dtype of the dequantized w tile (``w_dequant``): int8 codes against quantize_activations's int8 x codes, bf16
    against codes held in bf16 (``float_codes``), else x's dtype (the kernel's scratch and the VMEM estimate both
    take it from here)."""
    if float_codes:
        return "bfloat16"
    return "int8" if x_codes else x_dtype


def code_dtype(*, float_codes: bool) -> str:
    """The dtype quantize_activations's x codes are held in: int8 for the int8 MXU, bf16 (exact) for the bf16 MXU."""
    return "bfloat16" if float_codes else "int8"


def fp8_as_is(x_dtype: Any, w_dtype: Any, bm: int, bn: int) -> bool:
    """Whether fp8 weights go to the MXU unconverted against bf16 x (its mixed bf16 x fp8 path) rather than being
    converted to bf16 tile by tile on the VPU. The mixed path repacks the x tile (bm x bk) for each dot where the
    conversion touches the w tile (bk x bn), so it is taken when bm < bn: decode always (v6e 64x4096x1024: 8,160 ->
    1,490 bundles per step); at bm == bn converting is faster (v5p 1024x512x1024 at 8192^3: 2.40 vs 2.54 ms
    compiler-backed)."""
    return ("float8" in str(tiling.np_dtype(w_dtype)) and tiling.np_dtype(x_dtype) == tiling.np_dtype("bfloat16")
            and bm < bn)


@dataclass(frozen=True, kw_only=True)
class MatmulBlockSizes(tiling.GemmTile):
    """Tile of one grid step: x[bm, bk] @ w[bk, bn] -> out[bm, bn].

    bm is a sublane dimension (multiple of the x/out dtype's sublane tile);
    bk and bn are lane dimensions of x and w/out (multiples of 128).
    """

    def vmem_bytes(self, *, x_dtype: Any, w_dtype: Any, out_dtype: Any, epilogue_vectors: int,
                   chip: ChipSpec | None = None, variant: MatmulVariant = PLAIN) -> int:
        """VMEM one grid step holds, as Mosaic allocates it (libtpu 0.0.42, v4 to 7x).

        Double-buffered x, w, out tiles (and the epilogue's [1, bn] vectors) and the
        f32 accumulator, padded as :func:`kernels.tiling.mosaic_buffer_bytes`, plus the
        matmul's internal scratch, which depends on the chip (``chip`` None: the
        largest case):

        * bf16 x: Mosaic stages about 1.5 x tiles (``bm x bk``) when the MXU is 128
          wide (v4, v5e, v5p), and on 256-wide MXUs (v6e, 7x) when ``bk >= 1024`` or
          the x tile has 1M elements or more; otherwise the dot accumulates in place.
        * int8 w (and fp8 against f32 x) on chips where Mosaic widens through f32 (v4): two converted (x-dtype) w tiles.
        * f32 x (HIGHEST precision: bf16 splits of both operands, several passes): about
          4.75 f32 x tiles and half an f32 w tile (w widened to f32 counted so).

        At or above Mosaic's figure for every measured block shape but one (f32 256x256x1024 on
        7x, 2% below); within 10% except where 7x skips the staging (up to 35% above), tiny
        256^3 blocks (17%), and f32 on v4 and 7x, whose splits are cheaper (up to 45% above).
        """
        buf = tiling.mosaic_buffer_bytes
        x_cols = self.bk if variant.x_row is None else variant.x_row
        streamed = (
            buf((variant.x_share_rows or self.bm, x_cols), x_dtype)
            + buf((self.bk, self.bn), w_dtype)
            + buf((self.bm, self.bn), out_dtype)
            + epilogue_vectors * buf((1, self.bn), "float32")
            + (buf((variant.scale_rows, self.bn), "float32") if variant.scale_rows else 0)
        )
        acc_rows = 2 * self.bm if variant.split_codes else self.bm
        acc = buf((acc_rows, self.bn), "float32")
        need = 2 * streamed + acc
        if variant.x_share_rows:  # row block 0, single-buffered
            need += buf((self.bm, x_cols), x_dtype)
        if variant.x_codes:  # codes of the row block(s) and the per-token scales; the dot's int32 (f32) result
            codes = (buf((acc_rows, variant.x_row or self.bk), code_dtype(float_codes=variant.float_codes))
                     + buf((self.bm, 1), "float32"))
            need += variant.code_slots * codes + buf((acc_rows, self.bn), "int32")
        if variant.w_dequant:  # the dequantized w tile (int8 codes against quantize_activations's int8 x)
            need += buf((self.bk, self.bn), w_dequant_dtype(x_dtype, x_codes=variant.x_codes,
                                                            float_codes=variant.float_codes))
        if tiling.itemsize_bytes(x_dtype) == 4:
            need += int(F32_X_SPLIT_TILES * buf((self.bm, self.bk), "float32")
                        + F32_W_SPLIT_TILES * buf((self.bk, self.bn), "float32"))
            return int(need)
        mxu = (chip.cores.mxu_dim if chip is not None else None) or 128
        # int8 x int8 (x_codes): no LHS staging. With the codes in their own scratch and no zeroing pass Mosaic
        # allocates at most what the terms above give (libtpu 0.0.42.1, 9 compiles: v5e 512x8192x1024 at 8192^3
        # 44.0 MiB vs 46.6 estimated, v6e 1024x2048x1024 62.7 vs 65.2, v5p 256x2048x256 11.6 vs 11.9 and
        # 256x4096x256 12.6 vs 12.9; 4096^3: +4% to +20%). The earlier kernel staged about two int32 x tiles.
        staged = mxu <= 128 or self.bk >= 1024 or self.bm * self.bk >= 1 << 20
        if (not variant.x_codes or variant.float_codes) and staged:
            need += int(X_STAGING_TILES * buf((self.bm, self.bk), x_dtype))
        # Weights converted to x's dtype in VMEM (fp8 may go to the MXU as is: fp8_as_is).
        converted = tiling.np_dtype(w_dtype) != tiling.np_dtype(x_dtype) and not fp8_as_is(
            x_dtype, w_dtype, self.bm, self.bn)
        if converted and (chip is None or not tiling.narrow_vmem_temporaries(chip)):
            need += 2 * buf((self.bk, self.bn), x_dtype)
        return int(need)

    def check(self, *, x_dtype: Any, w_dtype: Any, out_dtype: Any, epilogue_vectors: int, chip: ChipSpec,
              variant: MatmulVariant = PLAIN) -> int | None:
        """Check the dtype-dependent tiling rules and the VMEM budget on chip.

        Returns the ``vmem_limit_bytes`` to compile with (None: the default scoped limit suffices).
        """
        self.check_dtype_tiles(x_dtype, w_dtype, out_dtype)
        if variant.x_codes:
            tiling.check_multiple("bm", self.bm, tiling.sublane_multiple("int8"), "sublane tile of the int8 x codes")
        need = self.vmem_bytes(x_dtype=x_dtype, w_dtype=w_dtype, out_dtype=out_dtype, epilogue_vectors=epilogue_vectors,
                               chip=chip, variant=variant)
        return tiling.check_vmem(need, chip, f"block_sizes ({self.label()})", raised_limit=True)


def _b(bm: int, bk: int, bn: int) -> MatmulBlockSizes:
    return MatmulBlockSizes(bm=bm, bk=bk, bn=bn)


@functools.lru_cache(maxsize=None)
def default_block_table() -> dict[str, dict[str, MatmulBlockSizes]]:
    """chip name -> "x dtype x w dtype" (ChipSpec naming) -> default blocks.

    Data chosen by the block-size advisor (``perfmodel tune matmul``) and stored
    in ``kernels/matmul/tuned.json``; regenerate it with
    ``perfmodel tune --write``. Read on first use, not at import.
    """
    return tiling.tuned_block_table("matmul", lambda b: _b(b["bm"], b["bk"], b["bn"]))


#: Used for an operand pair or chip the table does not list (e.g. a chip spec given as a file): at most 5 MiB
#: of VMEM (f32 x f32), within every TPU's default scoped limit.
FALLBACK_BLOCK_SIZES = _b(256, 512, 512)


#: Calls with at most this many rows of x take the table's "<pair> decode" blocks where it has them (tuned on a
#: decode GEMM, kernels/matmul/entry.py DECODE_SHAPE_MNK): few rows against the whole weight matrix want large
#: weight tiles and few grid steps, not the square GEMM's.
DECODE_MAX_M = 64


def pair_blocks(configs: dict[str, T], pair: str, m: int | None, fallback: T) -> T:
    """A chip's stored blocks for an operand pair ("bf16 x int8"): its "<pair> decode" entry when ``m`` (rows of
    the left operand) is at most DECODE_MAX_M and stored, else the pair's entry, else ``fallback``. Shared with
    grouped_matmul, whose table has the same keys."""
    x, w = pair.split(" x ")
    return _stored_blocks(configs, TunedKey(x=x, w=w), m, fallback)


def _stored_blocks(configs: dict[str, T], key: TunedKey, m: int | None, fallback: T) -> T:
    """The stored blocks of ``key``: its decode entry when ``m`` is at most DECODE_MAX_M and stored, else its own,
    else ``fallback``."""
    decode = replace(key, decode=True).text()
    if m is not None and m <= DECODE_MAX_M and decode in configs:
        return configs[decode]
    return configs.get(key.text(), fallback)


def default_block_sizes(chip: str, x_name: str, w_name: str, *, m: int | None = None,
                        blockwise: bool = False) -> MatmulBlockSizes:
    """The table's blocks for (chip, operand dtypes), its decode blocks when ``m <= DECODE_MAX_M`` and it has
    them; with blockwise weight scales its "<pair> blockwise" or "<pair> blockwise decode" blocks first when it has
    them (int8 x int8 and w4a8; bf16 x int4 at decode); a chip the table lacks takes
    :func:`kernels.tiling.tuned_entry_chip`'s; FALLBACK_BLOCK_SIZES when the pair is not listed."""
    table = default_block_table()
    configs, key = table.get(tiling.tuned_entry_chip(table, chip), {}), TunedKey(x=x_name, w=w_name)
    if blockwise:
        text = replace(key, blockwise=True, decode=m is not None and m <= DECODE_MAX_M).text()
        if text in configs:
            return configs[text]
    return _stored_blocks(configs, key, m, FALLBACK_BLOCK_SIZES)
