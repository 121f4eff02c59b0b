"""The contract every bundled kernel keeps, checked over the registry (``perfmodel.schedule.catalog``).

For each catalog entry of ``catalog.bundled()`` and each :class:`TunedKernel` of ``catalog.tuned_kernels()``:

* it lowers for TPU to one Mosaic call (``jax.export`` on the host, no TPU needed) at its example shapes and at
  the production variants listed in :data:`CONTRACTS`, in place where it donates its inputs;
* the ``pl.CostEstimate`` it hands to Mosaic equals perfmodel's op model of the call (and the hand-worked figures
  listed with a variant);
* at the shape it was tuned on, each chip's default block sizes, as read back from the kernel's named scope, are the
  stored ones in ``kernels/<name>/tuned.json``, with the stored scoped-VMEM limit;
* in interpret mode it matches its jnp reference on small shapes (default blocks, or the listed ones), every output
  written and finite, within tolerances keyed by the output dtype.

The per-kernel data lives in one table, :data:`CONTRACTS` (one row per catalog entry); a bundled kernel without a row
fails :func:`test_every_bundled_kernel_has_a_contract`. What a single kernel does beyond this contract (its tiling
matrices, quantization, input errors, VMEM estimates) is tested in its own ``test_<kernel>.py``.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import kernels
from kernels.tuned import load_tuned_defaults
from perfmodel.errors import UnknownChipError
from perfmodel.hw.registry import get_chip
from perfmodel.schedule import catalog
from perfmodel.schedule.shapes import ShapeSpec, materialize, parse_shape
from tests.kernels.lowering import MOSAIC_CUSTOM_CALL, cost_estimates, export_for_tpu
from tests.schedule.traffic import assert_traffic_is_the_models

# ----------------------------------------------------------------------------- lowering for TPU on the host

_SCOPED_VMEM_RE = re.compile(r"scoped_memory_configs\\22: \[\{[^\]]*?\\22size\\22: (\d+)\}")


def scoped_vmem_limits(text: str) -> list[int]:
    """The raised scoped-VMEM limits (bytes) the module's Mosaic calls ask for (none: the chip's default)."""
    return [int(v) for v in _SCOPED_VMEM_RE.findall(text)]


# ----------------------------------------------------------------------------- the per-kernel table


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One call of a kernel: --shape texts, static keyword arguments, blocks and chip."""

    id: str
    #: --shape texts of the catalog entry's arrays ("=random" fills are seeded normal floats, one seed per array).
    shapes: tuple[str, ...]
    #: Arrays the wrapper takes by keyword that the catalog entry does not list (sampling's noise).
    keyword_arrays: tuple[str, ...] = ()
    #: Static keyword arguments given to both the kernel and its reference (e.g. activation, a PRNG key).
    static: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Factors applied to "=random" arrays (e.g. 1/sqrt(K) on matmul weights keeps outputs O(1)).
    scale: Mapping[str, float] = dataclasses.field(default_factory=dict)
    #: Block fields (None: the chip's defaults).
    blocks: Mapping[str, int] | None = None
    chip: str = "tpu-v5e"
    #: Lowered cases: hand-worked CostEstimate fields (exact) and lower bounds independent of the model.
    exact: Mapping[str, int] = dataclasses.field(default_factory=dict)
    floor: Mapping[str, int] = dataclasses.field(default_factory=dict)
    #: Lowered cases: the fields the named scope must carry (a callable is evaluated at test time).
    scope: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None
    #: Lowered cases: the raised scoped-VMEM limit the call asks Mosaic for (None: not checked).
    vmem_limit: int | None = None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Contract:
    #: Regex of the kernel's named scope; its named groups are the blocks the call used (digits become ints).
    scope: str
    #: perfmodel's op model of a call: (specs of all arrays, static keyword arguments, scope fields) -> OpCost.
    op_cost: Callable[[Mapping[str, ShapeSpec], Mapping[str, Any], Mapping[str, Any]], Any]
    #: assert_allclose tolerances by output dtype name.
    tol: Mapping[str, Mapping[str, float]]
    #: Small interpret-mode cases vs the reference.
    small: tuple[Case, ...]
    #: Production-shape variants lowered besides the catalog example.
    lowered: tuple[Case, ...] = ()
    #: Static keyword arguments of the catalog example's lowering (e.g. a PRNG key the example needs).
    example_static: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: The wrapper donates its inputs: the lowered call must alias them to its outputs.
    aliased: bool = False
    #: False where the reference computes in f32 whatever the input dtype (attention): outputs are then compared
    #: in f32 with the tolerance of the kernel's output dtype.
    same_dtype: bool = True


def _dt(spec: ShapeSpec) -> str:
    """perfmodel's dtype name of an array."""
    from perfmodel.model.dtypes import parse_dtype

    return parse_dtype(spec.dtype)


def _gemm(specs, static, used):
    from perfmodel.model.gemm import gemm

    x, w = specs["x"], specs["w"]
    activation = static.get("activation", "none")
    epilogue = (("bias",) if "bias" in specs else ()) + ((activation,) if activation != "none" else ())
    quantize_activations = bool(static.get("quantize_activations", False))
    # w_dtype="int4": w is [K/2, N] uint8 holding two int4 codes per byte; the model reads int4 weights.
    rhs = "int4" if static.get("w_dtype") == "int4" else _dt(w)
    return gemm(m=x.shape[0], k=x.shape[1], n=w.shape[1], lhs_dtype=_dt(x), rhs_dtype=rhs, out_dtype=_dt(x),
                quantize_activations=quantize_activations,
                weight_scale=_scale_kind(specs.get("w_scale")), epilogue=epilogue, chip=None)


def _scale_kind(w_scale) -> str:
    """The op model's name for a w_scale spec: none, per-channel ([N]) or per-block ([cdiv(K, 128), N])."""
    return "none" if w_scale is None else "per-block" if len(w_scale.shape) == 2 else "per-channel"


def _grouped_gemm(specs, static, used):
    from perfmodel.model.gemm import grouped_gemm, uniform_group_sizes

    (m, k), (groups, _, n) = specs["lhs"].shape, specs["rhs"].shape
    # Group sizes are data: the estimate splits the rows evenly over the groups (hand-worked below).
    return grouped_gemm(group_sizes=uniform_group_sizes(m, groups), m=m, n=n, k=k, lhs_dtype=_dt(specs["lhs"]),
                        rhs_dtype=_dt(specs["rhs"]), out_dtype=_dt(specs["lhs"]),
                        weight_scale="per-channel" if "rhs_scale" in specs else "none", chip=None)


def _rms_norm(specs, static, used):
    from perfmodel.model.fused import rms_norm

    tokens, hidden = specs["x"].shape
    return rms_norm(tokens=tokens, hidden=hidden, dtype=_dt(specs["x"]), residual=True,
                    out_dtype="int8" if static.get("quantize") else None, chip=None)


def _kv_cache_update(page_dim: int, cache: str = "k_cache", layout: str = "rows"):
    def op_cost(specs, static, used):
        from perfmodel.model.kvcache import kv_cache_update

        num_tokens, kv_heads, head_dim = specs["new_k"].shape
        return kv_cache_update(num_tokens=num_tokens, kv_heads=kv_heads, head_dim=head_dim,
                               page_size=specs[cache].shape[page_dim], kv_dtype=_dt(specs[cache]),
                               src_dtype=_dt(specs["new_k"]), layout=layout, chip=None)

    return op_cost


def _flash_attention(specs, static, used):
    from perfmodel.model.attention import flash_attention

    batch, q_heads, q_len, head_dim = specs["q"].shape
    _, kv_heads, kv_len, _ = specs["k"].shape
    return flash_attention(batch=batch, q_heads=q_heads, kv_heads=kv_heads, q_len=q_len, kv_len=kv_len,
                           head_dim=head_dim, dtype=_dt(specs["q"]), causal=static.get("causal", True),
                           sliding_window=static.get("sliding_window"), block_q=used["block_q"],
                           block_kv=used["block_kv"], chip=None)


def _paged_attention(specs, static, used):
    from perfmodel.model.paged_attention import paged_decode_attention

    batch, q_heads, head_dim = specs["q"].shape
    kv_heads, _, page_size, _ = specs["k_pages"].shape
    pages_per_seq = specs["page_table"].shape[1]
    scales = specs.get("k_scales")
    kv_scale = "none" if scales is None else "per-token" if len(scales.shape) == 3 else "per-page"
    # Lengths are data: the estimate assumes every sequence fills its page table.
    return paged_decode_attention(context_lens=pages_per_seq * page_size, batch=batch, pages_per_seq=pages_per_seq,
                                  q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim, page_size=page_size,
                                  q_dtype=_dt(specs["q"]), kv_dtype=_dt(specs["k_pages"]), kv_scale=kv_scale, chip=None)


def _ragged_paged_attention(specs, static, used):
    from kernels.ragged_paged_attention.plan import assumed_lengths
    from perfmodel.model.paged_attention import ragged_paged_attention

    total_tokens, q_heads, head_dim = specs["q"].shape
    num_pages, page_size, combined_heads, _ = specs["kv_pages"].shape
    kv_heads = combined_heads // 2
    max_seqs, pages_per_seq = specs["page_table"].shape
    # Lengths are data: the estimate shares the tokens and the cache evenly (tested by hand in
    # test_ragged_paged_attention.py).
    q_lens, kv_lens = assumed_lengths(total_tokens=total_tokens, max_seqs=max_seqs, pages_per_seq=pages_per_seq,
                                      num_pages=num_pages, page_size=page_size)
    scales = specs.get("kv_scales")  # [num_pages, page_size, 2 * kv_heads] per token, [num_pages, 2 * kv_heads]
    kv_scale = "none" if scales is None else "per-token" if len(scales.shape) == 3 else "per-page"
    return ragged_paged_attention(query_lens=q_lens, context_lens=kv_lens, q_heads=q_heads, kv_heads=kv_heads,
                                  head_dim=head_dim, page_size=page_size, kv_dtype=_dt(specs["kv_pages"]),
                                  q_dtype=_dt(specs["q"]), kv_scale=kv_scale, block_q=used["block_q"],
                                  block_kv=used["block_kv"])


#: The kernel's worst case of passes per threshold search: the bracket's probe, then 32 halvings of the key range.
SAMPLING_PASSES = 33


def _sampling(specs, static, used):
    from perfmodel.model.sampling import sampling

    batch, vocab = specs["logits"].shape
    random = used["mode"] != "greedy"
    # The filters a call leaves out are compiled out and left out of the count; greedy: no temperature, no filters.
    cost = sampling(batch=batch, vocab=vocab, dtype=_dt(specs["logits"]), temperature=random, method="threshold",
                    passes=SAMPLING_PASSES, top_k=vocab if random and "top_k" in static else None,
                    top_p=1.0 if random and "top_p" in static else None,
                    min_p=0.0 if random and "min_p" in static else None)
    if "noise" not in specs:
        return cost
    # Pre-drawn noise adds its [batch, vocab] f32 read.
    return dataclasses.replace(cost, hbm_read_bytes=cost.hbm_read_bytes + batch * vocab * 4)


def _key() -> jax.Array:
    return jax.random.key(0)


def _paged_v5e_pages(page_size: int) -> Callable[[], dict[str, int]]:
    """tpu-v5e's stored token target over the page size: the block the lookup picks on a 2048-token table."""

    def fields() -> dict[str, int]:
        from kernels.paged_attention import DEFAULT_TOKENS_PER_COMPUTE_BLOCK

        target = DEFAULT_TOKENS_PER_COMPUTE_BLOCK["tpu-v5e"]
        pages_per_seq = 2048 // page_size
        assert target % page_size == 0 and target % 128 == 0 and pages_per_seq % (target // page_size) == 0
        return {"pages_per_compute_block": target // page_size, "page_size": page_size}

    return fields


def _v5e_defaults(kernel: str, **fields: str) -> Callable[[], dict[str, int]]:
    """Named-scope fields from tpu-v5e's stored blocks (the kernel's DEFAULT_BLOCK_SIZES): scope field -> attribute."""

    def get() -> dict[str, int]:
        import importlib

        stored = importlib.import_module(f"kernels.{kernel}").DEFAULT_BLOCK_SIZES["tpu-v5e"]
        return {name: getattr(stored, attr) for name, attr in fields.items()}

    return get


def _sampling_v5e_blocks(dtype: str) -> Callable[[], dict[str, Any]]:
    def fields() -> dict[str, Any]:
        from kernels.sampling import default_block_sizes

        blocks = default_block_sizes("tpu-v5e", logits_dtype=jnp.dtype(dtype), vocab=128256)
        return {"block_b": blocks.block_b, "block_v": blocks.block_v, "mode": "key"}

    return fields


#: Float outputs: bf16 carries one bf16 rounding (2^-8 relative) of O(1) values whose f32 accumulation order
#: differs from the reference's; f32 differs only by accumulation order and rsqrt vs 1/sqrt.
FLOAT_TOL = {"bfloat16": dict(rtol=1.6e-2, atol=1.6e-2), "float32": dict(rtol=2e-5, atol=2e-5)}
#: Copies and ids are exact; int8 codes may differ by one where a value sits at a .5 rounding boundary.
EXACT = dict(rtol=0, atol=0)



def _paged_decode(page_size: int, kv: str, scales: str | None = None) -> tuple[str, ...]:
    """Decode of 64 sequences at 2048-token contexts, 32 q / 8 kv heads of 128; scales "per-token" or "per-page"."""
    pages_per_seq = 2048 // page_size
    pages = 64 * pages_per_seq
    shapes = ("q=64x32x128:bf16", f"k_pages=8x{pages}x{page_size}x128:{kv}", f"v_pages=8x{pages}x{page_size}x128:{kv}",
              f"page_table=64x{pages_per_seq}:int32", "lengths=64:int32")
    if scales is not None:
        dims = f"8x{pages}x{page_size}" if scales == "per-token" else f"8x{pages}"
        shapes += (f"k_scales={dims}:f32", f"v_scales={dims}:f32")
    return shapes

_RAGGED_SMALL = ("kv_lens=2:int32=100", "page_table=2x8:int32=arange", "cu_q_lens=3:int32=arange*8",
                 "num_seqs=1:int32=2")
_SAMPLING_PROD = "logits=64x128256:f32"

CONTRACTS: dict[str, Contract] = {
    "matmul": Contract(
        scope=r"matmul\[bm=(?P<bm>\d+),bk=(?P<bk>\d+),bn=(?P<bn>\d+)\]",
        op_cost=_gemm,
        tol=FLOAT_TOL,
        small=(
            # tpu-v5e's stored bf16 default clamps on (24, 200, 136) to bm=32 (24 rounded up to the bf16 sublane
            # tile 16), bk=256, bn=256: one grid step, K zero-padded, partial M and N.
            Case(id="bf16-defaults-clamped", shapes=("x=24x200:bf16=random", "w=200x136:bf16=random",
                                                     "bias=136:f32=random"), scale={"w": 200**-0.5}),
        ),
        lowered=(
            Case(id="bias-gelu", shapes=("x=4096x4096:bf16", "w=4096x4096:bf16", "bias=4096:f32"),
                 static={"activation": "gelu"}, blocks={"bm": 512, "bk": 1024, "bn": 1024},
                 scope={"bm": 512, "bk": 1024, "bn": 1024},
                 # At least the 2*M*N*K MACs, and each bf16 operand and the output once.
                 floor={"flops": 2 * 4096**3, "bytes_accessed": 3 * 4096 * 4096 * 2}),
            Case(id="int8-weights", shapes=("x=4096x4096:bf16", "w=4096x4096:int8", "w_scale=4096:f32"),
                 blocks={"bm": 512, "bk": 1024, "bn": 1024}),
            # 46 MiB of VMEM on tpu-v5e (hand-worked in test_matmul.py): over the 16 MiB scoped default, so the
            # call raises the limit to 46 MiB * 1.25.
            Case(id="raised-vmem-limit", shapes=("x=4096x4096:bf16", "w=4096x4096:bf16"),
                 blocks={"bm": 1024, "bk": 2048, "bn": 2048}, vmem_limit=int(46 * 2**20 * 1.25)),
            # int8 x int8 (quantize_activations) at its tuned defaults on every chip with an int8 MXU path (v4 and 7x
            # refuse it); decode-sized M: the defaults clamp bm to 64.
            *(Case(id=f"w8a8-{chip}", shapes=("x=64x8192:bf16", "w=8192x8192:int8", "w_scale=8192:f32"),
                   static={"quantize_activations": True}, chip=chip,
                   # At least the 2*M*N*K MACs, the int8 weights and the bf16 activations once.
                   floor={"flops": 2 * 64 * 8192 * 8192, "bytes_accessed": 8192 * 8192 + 64 * 8192 * 2})
              for chip in ("tpu-v5e", "tpu-v5p", "tpu-v6e")),
        ),
    ),
    "grouped_matmul": Contract(
        scope=r"grouped_matmul\[bm=(?P<bm>\d+),bk=(?P<bk>\d+),bn=(?P<bn>\d+)\]",
        op_cost=_grouped_gemm,
        tol=FLOAT_TOL,
        small=(
            # 3 experts of 8 rows at tpu-v5e's defaults clamped to (24, 200, 136): one row tile of 32 (24 rounded up
            # to the bf16 sublane tile) visited once per expert, K masked past 200, partial N.
            Case(id="bf16-defaults-clamped", shapes=("lhs=24x200:bf16=random", "rhs=3x200x136:bf16=random",
                                                     "group_sizes=3:int32=8"), scale={"rhs": 200**-0.5}),
        ),
        lowered=(
            # Hand-worked: 64 rows over 4 experts, K = 256, N = 128, bf16. Bytes: lhs 64 x 256 x 2 = 32,768, the
            # 4 experts' weights 4 x 256 x 128 x 2 = 262,144, out 64 x 128 x 2 = 16,384: 311,296 B. FLOPs: 2 x 64 x
            # 128 x 256 = 4,194,304 MXU + 64 x 128 = 8,192 VPU (the f32 -> bf16 output cast) = 4,202,496.
            Case(id="bf16-hand-worked", shapes=("lhs=64x256:bf16", "rhs=4x256x128:bf16", "group_sizes=4:int32"),
                 blocks={"bm": 16, "bk": 128, "bn": 128}, scope={"bm": 16, "bk": 128, "bn": 128},
                 exact={"bytes_accessed": 311_296, "flops": 4_202_496}),
            # MoE decode (64 token-expert rows over 8 experts) with int8 weights and per-channel scales; fp8 on v6e.
            Case(id="int8-decode", shapes=("lhs=64x4096:bf16", "rhs=8x4096x14336:int8", "group_sizes=8:int32",
                                           "rhs_scale=8x14336:f32"),
                 # At least the 2*M*N*K MACs, every expert's int8 weights and the bf16 rows once.
                 floor={"flops": 2 * 64 * 4096 * 14336, "bytes_accessed": 8 * 4096 * 14336 + 64 * 4096 * 2}),
            Case(id="fp8-v6e", shapes=("lhs=512x4096:bf16", "rhs=8x4096x2048:fp8", "group_sizes=8:int32"),
                 chip="tpu-v6e"),
        ),
    ),
    "rms_norm": Contract(
        scope=r"rms_norm\[block_tokens=(?P<block_tokens>\d+)\]",
        op_cost=_rms_norm,
        tol={"bfloat16": dict(rtol=1e-2, atol=1e-2), "float32": dict(rtol=1e-5, atol=1e-5)},
        small=(
            # Fewer tokens than one block, hidden not a multiple of 128.
            Case(id="bf16-defaults", shapes=("x=7x1000:bf16=random", "residual=7x1000:bf16=random",
                                             "weight=1000:f32=random")),
        ),
        lowered=(
            # Independent floor: x, residual in, out and residual out, all bf16, each once.
            Case(id="bf16-out", shapes=("x=4096x8192:bf16", "residual=4096x8192:bf16", "weight=8192:bf16"),
                 floor={"bytes_accessed": 4 * 4096 * 8192 * 2}),
            Case(id="int8-out", shapes=("x=8192x8192:bf16", "residual=8192x8192:bf16", "weight=8192:bf16"),
                 static={"quantize": True}),
        ),
    ),
    "kv_cache_update": Contract(  # the default head-major layout: row granules, no block sizes
        scope=r"kv_cache_update\[layout=(?P<layout>head-major)\]",
        op_cost=_kv_cache_update(page_dim=2, layout="head-major"),
        tol={"bfloat16": EXACT, "float32": dict(rtol=1e-6, atol=0), "int8": dict(rtol=0, atol=1)},
        aliased=True,
        small=(
            # 12 tokens over 16 pages of 8, three or so to a page (slots 0, 3, .., 33).
            Case(id="bf16", shapes=("new_k=12x2x128:bf16=random", "new_v=12x2x128:bf16=random",
                                    "k_cache=2x16x8x128:bf16=random", "v_cache=2x16x8x128:bf16=random",
                                    "slot_mapping=12:int32=arange*3")),
        ),
        lowered=(
            # Independent floor: read 2 * 512*8*128 bf16 = 2 MiB of new rows; each token's K and V row granule
            # (2 bf16 rows = 512 B per head, 8 heads: 8 KiB a token, 4 MiB) read and written back: 10 MiB.
            Case(id="bf16-cache", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=8x4096x16x128:bf16",
                                          "v_cache=8x4096x16x128:bf16", "slot_mapping=512:int32"),
                 floor={"bytes_accessed": 10 * 2**20}),
            # paged_attention's int8 layout: 32-row pages, per-token scales [kv_heads, num_pages, page_size].
            Case(id="int8-cache", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=8x4096x32x128:int8",
                                          "v_cache=8x4096x32x128:int8", "slot_mapping=512:int32"),
                 keyword_arrays=("k_scale_cache=8x4096x32:f32", "v_scale_cache=8x4096x32:f32")),
        ),
    ),
    "kv_cache_update_token_major": Contract(
        scope=r"kv_cache_update\[tokens_per_block=(?P<tokens_per_block>\d+)\]",
        op_cost=_kv_cache_update(page_dim=1),
        tol={"bfloat16": EXACT, "float32": dict(rtol=1e-6, atol=0), "int8": dict(rtol=0, atol=1)},
        aliased=True,
        small=(
            # bf16 quantized into an int8 cache with scales; the default block clamps to the call's 13 tokens.
            Case(id="int8-cache-defaults", shapes=("new_k=13x2x128:bf16=random", "new_v=13x2x128:bf16=random",
                                                   "k_cache=6x8x2x128:int8=random", "v_cache=6x8x2x128:int8=random",
                                                   "slot_mapping=13:int32=arange*3",
                                                   "k_scale_cache=6x8x2x1:f32=random",
                                                   "v_scale_cache=6x8x2x1:f32=random")),
        ),
        lowered=(
            # bf16 caches at the tuned token count: tpu-v5e's stored block.
            Case(id="bf16-cache", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16", "k_cache=4096x16x8x128:bf16",
                                          "v_cache=4096x16x8x128:bf16", "slot_mapping=512:int32"),
                 scope=_v5e_defaults("kv_cache_update", tokens_per_block="tokens_per_block")),
            # Independent floor: read 2 * 512*8*128 bf16 = 2 MiB, write the same count as int8 = 1 MiB.
            Case(id="int8-cache", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16",
                                          "k_cache=4096x16x8x128:int8", "v_cache=4096x16x8x128:int8",
                                          "slot_mapping=512:int32", "k_scale_cache=4096x16x8x1:f32",
                                          "v_scale_cache=4096x16x8x1:f32"),
                 floor={"bytes_accessed": 3 * 2**20}),
        ),
    ),
    "kv_cache_update_combined": Contract(
        scope=r"kv_cache_update\[layout=combined,tokens_per_block=(?P<tokens_per_block>\d+)\]",
        op_cost=_kv_cache_update(page_dim=1, cache="kv_pages"),
        tol={"bfloat16": EXACT, "float32": EXACT},
        aliased=True,
        small=(
            # 13 tokens (an unaligned count: the default block clamps to 13), slots 0, 3, .., 36 over 6 pages of 8.
            Case(id="bf16-defaults", shapes=("new_k=13x2x128:bf16=random", "new_v=13x2x128:bf16=random",
                                             "kv_pages=6x8x4x128:bf16=random", "slot_mapping=13:int32=arange*3")),
        ),
        lowered=(
            # Independent floor: read 2 * 512*8*128 bf16 = 2 MiB of new K/V, write the same 2 MiB into the pages.
            Case(id="bf16-pages", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16",
                                          "kv_pages=4096x16x16x128:bf16", "slot_mapping=512:int32"),
                 floor={"bytes_accessed": 4 * 2**20}),
            # An int8 cache (quantize on write, per-token scales; ragged_paged_attention's int8 layout): read the 2 MiB
            # of bf16 K/V, write 1 MiB of int8 rows and 512 x 16 x 4 B = 32 KiB of scales.
            Case(id="int8-pages", shapes=("new_k=512x8x128:bf16", "new_v=512x8x128:bf16",
                                          "kv_pages=4096x16x16x128:int8", "slot_mapping=512:int32"),
                 keyword_arrays=("kv_scales=4096x16x16:f32",), floor={"bytes_accessed": 3 * 2**20 + 2**15}),
        ),
    ),
    "flash_attention": Contract(
        scope=r"flash_attention_bq(?P<block_q>\d+)_bkv(?P<block_kv>\d+)_bkvc(?P<block_kv_compute>\d+)/",
        op_cost=_flash_attention,
        same_dtype=False,
        # bf16: the kernel feeds bf16 probabilities to the PV matmul and rounds the output to bf16.
        tol={"bfloat16": dict(rtol=1.5e-2, atol=1.5e-2), "float32": dict(rtol=2e-5, atol=2e-5)},
        small=(
            # GQA 4, a 40-token chunk after a 260-token prefix: the defaults shrink to the whole sequence.
            Case(id="bf16-gqa4-prefix", shapes=("q=1x4x40x128:bf16=random", "k=1x1x300x128:bf16=random",
                                                "v=1x1x300x128:bf16=random")),
        ),
        lowered=(
            # At the tuned shape, with a window: tpu-v5e's stored blocks (no fitting).
            Case(id="window", shapes=("q=1x32x8192x128:bf16", "k=1x8x8192x128:bf16", "v=1x8x8192x128:bf16"),
                 static={"causal": True, "sliding_window": 4096},
                 scope=_v5e_defaults("flash_attention", block_q="block_q", block_kv="block_kv",
                                     block_kv_compute="kv_compute")),
            # Hand-worked traffic: q read and out written once, 2 x 256 x 128 x 4 B = 262144 B each; K and V read
            # once per visited (q block, kv block) tile per kv head: 3 tiles (q block 0 -> kv 0; q block 1 -> kv 0,
            # 1) x 2 kv heads x 2 (K, V) x 128 x 128 x 4 B = 786432 B. Total 1310720 B. Useful matmul FLOPs alone:
            # 4 x head_dim per visible pair per head: 4 x 128 x (256 x 257 / 2) x 2 heads = 33685504.
            Case(id="f32-hand-worked", shapes=("q=1x2x256x128:f32", "k=1x2x256x128:f32", "v=1x2x256x128:f32"),
                 static={"causal": True}, blocks={"block_q": 128, "block_kv": 128},
                 exact={"bytes_accessed": 1_310_720}, floor={"flops": 33_685_504 + 1}),
        ),
    ),
    "paged_attention": Contract(
        scope=r"paged_attention_ppcb(?P<pages_per_compute_block>\d+)_ps(?P<page_size>\d+)/",
        op_cost=_paged_attention,
        same_dtype=False,
        tol={"bfloat16": dict(rtol=1.5e-2, atol=1.5e-2), "float32": dict(rtol=2e-5, atol=2e-5)},
        small=(
            # GQA 4, 100 of 128 tokens per sequence: the tpu-v5e token target gives one compute block.
            Case(id="bf16-gqa4", shapes=("q=3x8x128:bf16=random", "k_pages=2x24x16x128:bf16=random",
                                         "v_pages=2x24x16x128:bf16=random", "page_table=3x8:int32=arange",
                                         "lengths=3:int32=100")),
        ),
        lowered=(
            # Decode batch 64 at 2048-token contexts, GQA 4; the named scope carries tpu-v5e's stored token
            # target over the page size.
            Case(id="bf16-pages16", shapes=_paged_decode(16, "bf16"), scope=_paged_v5e_pages(16)),
            Case(id="int8-per-token", shapes=_paged_decode(32, "int8", "per-token"), scope=_paged_v5e_pages(32)),
            Case(id="int8-per-page", shapes=_paged_decode(32, "int8", "per-page"), scope=_paged_v5e_pages(32)),
            # int8 pages of 16 tokens (half an int8 sublane tile).
            Case(id="int8-per-token-pages16", shapes=_paged_decode(16, "int8", "per-token"),
                 scope=_paged_v5e_pages(16)),
            # Hand-worked traffic, every sequence assumed full (256 tokens): per sequence K and V 2 x 1 kv head x
            # 256 x 128 x 2 B = 131072 B, q read and out written 4 x 128 x 2 B = 1024 B each, page table + length +
            # start (8 + 2) x 4 B = 40 B: 131072 + 2 x 1024 + 40 = 133160 B; x 2 sequences = 266320 B.
            Case(id="bf16-hand-worked", shapes=("q=2x4x128:bf16", "k_pages=1x64x32x128:bf16",
                                                "v_pages=1x64x32x128:bf16", "page_table=2x8:int32",
                                                "lengths=2:int32"),
                 exact={"bytes_accessed": 266_320}),
            Case(id="int8-per-token-small", shapes=("q=2x4x128:bf16", "k_pages=1x64x32x128:int8",
                                                    "v_pages=1x64x32x128:int8", "page_table=2x8:int32",
                                                    "lengths=2:int32", "k_scales=1x64x32:f32",
                                                    "v_scales=1x64x32:f32")),
            Case(id="int8-per-page-small", shapes=("q=2x4x128:bf16", "k_pages=1x64x32x128:int8",
                                                   "v_pages=1x64x32x128:int8", "page_table=2x8:int32",
                                                   "lengths=2:int32", "k_scales=1x64:f32", "v_scales=1x64:f32")),
        ),
    ),
    "ragged_paged_attention": Contract(
        scope=r"ragged_paged_attention_bq(?P<block_q>\d+)_bkv(?P<block_kv>\d+)/",
        op_cost=_ragged_paged_attention,
        tol={"bfloat16": dict(rtol=2e-2, atol=2e-2), "float32": dict(rtol=1e-5, atol=1e-5)},
        small=(
            # Two sequences of 8 new tokens over 100-token contexts, GQA 4 (small blocks: the interpreter runs the
            # defaults' 512-token KV blocks slowly).
            Case(id="bf16-gqa4", shapes=("q=16x8x128:bf16=random", "kv_pages=16x16x4x128:bf16=random",
                                         *_RAGGED_SMALL),
                 blocks={"block_q": 16, "block_kv": 128}),
            # The same batch over an int8 cache with per-token scales (codes from seeded normals, scales too).
            Case(id="int8-per-token-gqa4", shapes=("q=16x8x128:bf16=random", "kv_pages=16x16x4x128:int8=random",
                                                   *_RAGGED_SMALL),
                 keyword_arrays=("kv_scales=16x16x4:f32=random",), blocks={"block_q": 16, "block_kv": 128}),
        ),
        lowered=(
            # 512 tokens of a mixed batch, Llama-3-8B attention, 64 sequences of up to 2048 tokens, 4096 pages.
            Case(id="mixed-batch", shapes=("q=512x32x128:bf16", "kv_pages=4096x16x16x128:bf16",
                                           "kv_lens=64:int32", "page_table=64x128:int32",
                                           "cu_q_lens=65:int32", "num_seqs=1:int32"),
                 scope=_v5e_defaults("ragged_paged_attention", block_q="block_q", block_kv="block_kv")),
            # Hand-worked traffic. The estimate splits 80 tokens over the 2 sequences (40 each) and gives each the
            # 9 pages of its table (144 tokens, 16 per page). q blocks are 16 rows of the flat token axis, KV blocks
            # 128 tokens (8 pages); a sequence in a q block fetches the KV blocks up to its last row's position
            # there, the last one only as far as its 9 pages. Sequence 0 (rows 0-39, positions 104-143): q block 0
            # ends at 119 (KV block 0: 8 pages), q block 1 at 135 and q block 2 at 143 (9 pages each): 26.
            # Sequence 1 (rows 40-79, positions 64-143): q block 2 ends at row 47 = position 111 (8 pages), q block
            # 3 at 127 (8), q block 4 at 143 (9): 25. 51 pages x 16 tokens x 4 rows (K, V of 2 kv heads) x 128 x
            # 2 B = 835584 B (per-sequence q blocks would count 52 pages). q read and out written: 2 x 80 x 4 x
            # 128 x 2 B = 163840 B; page table + length + query start: 2 x (9 + 2) x 4 B = 88 B. Total 999512 B.
            Case(id="bf16-hand-worked", shapes=("q=80x4x128:bf16", "kv_pages=18x16x4x128:bf16", "kv_lens=2:int32",
                                                "page_table=2x9:int32", "cu_q_lens=3:int32", "num_seqs=1:int32"),
                 blocks={"block_q": 16, "block_kv": 128}, exact={"bytes_accessed": 999_512}),
            # The same call over an int8 cache with per-token scales. Pages: 51 x 16 x 4 x 128 x 1 B = 417792 B.
            # KV blocks fetched: sequence 0's q blocks end at positions 119, 135, 143 (1 + 2 + 2 blocks of 128
            # tokens), sequence 1's at 111, 127, 143 (1 + 1 + 2): 9 blocks, each with its scales [4 rows, 128
            # tokens] f32 = 2048 B: 18432 B. The scale gather before the kernel reads each sequence's 9 pages of
            # scales, 9 x 16 x 4 x 4 B = 2304 B, and writes cdiv(9, 8) = 2 blocks of 2048 B: 2 x (2304 + 4096) =
            # 12800 B. With q / out 163840 B and the page table 88 B: 612952 B.
            Case(id="int8-per-token-hand-worked", shapes=(
                "q=80x4x128:bf16", "kv_pages=18x16x4x128:int8", "kv_lens=2:int32", "page_table=2x9:int32",
                "cu_q_lens=3:int32", "num_seqs=1:int32"), keyword_arrays=("kv_scales=18x16x4:f32",),
                 blocks={"block_q": 16, "block_kv": 128}, exact={"bytes_accessed": 612_952}),
            # Per-page scales: the gather reads 9 x 4 x 4 B = 144 B per sequence instead (612952 - 2 x 2160).
            Case(id="int8-per-page-hand-worked", shapes=(
                "q=80x4x128:bf16", "kv_pages=18x16x4x128:int8", "kv_lens=2:int32", "page_table=2x9:int32",
                "cu_q_lens=3:int32", "num_seqs=1:int32"), keyword_arrays=("kv_scales=18x4:f32",),
                 blocks={"block_q": 16, "block_kv": 128}, exact={"bytes_accessed": 608_632}),
            # fp8 (e4m3fn) pages where the chip has fp8: the production decode shape on tpu-v6e's defaults.
            Case(id="fp8-per-token-v6e", shapes=(
                "q=1024x32x128:bf16", "kv_pages=8192x16x16x128:float8_e4m3fn", "kv_lens=64:int32",
                "page_table=64x128:int32", "cu_q_lens=65:int32", "num_seqs=1:int32"),
                 keyword_arrays=("kv_scales=8192x16x16:f32",), chip="tpu-v6e"),
        ),
    ),
    # The int8 entry (the compile matrix's int8 row): its example lowers with the op model's estimate; numerics and
    # hand-worked traffic are the int8 cases above.
    "ragged_paged_attention_int8": Contract(
        scope=r"ragged_paged_attention_bq(?P<block_q>\d+)_bkv(?P<block_kv>\d+)/",
        op_cost=_ragged_paged_attention,
        tol={"bfloat16": dict(rtol=2e-2, atol=2e-2)},
        small=(),
    ),
    "sampling": Contract(
        scope=r"sampling_bb(?P<block_b>\d+)_bv(?P<block_v>\d+)_(?P<mode>[a-z]+)/",
        op_cost=_sampling,
        tol={"int32": EXACT},
        example_static={"key": _key},
        small=(
            # A random draw with top-k: the kernel and the reference draw the same noise from the key.
            Case(id="f32-key-top-k", shapes=("logits=10x1000:f32=random",),
                 static={"key": _key, "temperature": 0.8, "top_k": 50}, blocks={"block_b": 8, "block_v": 256}),
        ),
        lowered=(
            # The named scope names the draw: greedy (no key, no noise), a key, or pre-drawn noise.
            Case(id="greedy", shapes=(_SAMPLING_PROD,), scope={"mode": "greedy"}),
            Case(id="key-top-k-top-p", shapes=(_SAMPLING_PROD,), static={"key": _key, "top_k": 40, "top_p": 0.9},
                 scope={"mode": "key"}),
            Case(id="noise-min-p", shapes=(_SAMPLING_PROD,), keyword_arrays=("noise=64x128256:f32",),
                 static={"min_p": 0.05}, scope={"mode": "noise"}),
            Case(id="key-all-filters", shapes=(_SAMPLING_PROD,),
                 static={"key": _key, "top_k": 40, "top_p": 0.9, "min_p": 0.05}, scope={"mode": "key"}),
            # bf16 logits: tpu-v5e's stored f32 rows rounded up to the bf16 sublane tile.
            Case(id="bf16-key", shapes=("logits=64x128256:bf16",), static={"key": _key, "top_k": 40, "top_p": 0.9},
                 scope=_sampling_v5e_blocks("bfloat16")),
        ),
    ),
}


# ----------------------------------------------------------------------------- helpers


def _static(static: Mapping[str, Any]) -> dict[str, Any]:
    """Static keyword arguments, calling the factories (PRNG keys are made at test time)."""
    return {k: v() if callable(v) else v for k, v in static.items()}


def _specs(entry: catalog.KernelEntry, case: Case) -> tuple[dict[str, ShapeSpec], dict[str, ShapeSpec]]:
    return entry.specs(case.shapes), {s.name: s for s in map(parse_shape, case.keyword_arrays)}


def _function(entry: catalog.KernelEntry, specs: Mapping[str, ShapeSpec], keyword: Mapping[str, ShapeSpec],
              blocks: Mapping[str, int] | None, chip: str, static: Mapping[str, Any], *,
              reference: bool = False) -> Callable:
    """The kernel (or its reference) as a function of the entry's arrays, then the keyword arrays, positionally."""
    names = entry.names(specs)

    def fn(*arrays: Any) -> Any:
        by_keyword = dict(zip(keyword, arrays[len(names):]))
        call = entry.make_function(specs, blocks, get_chip(chip), reference=reference,
                                   extra={**static, **by_keyword})
        return call(*arrays[:len(names)])

    return fn


def _abstract(entry, specs, keyword) -> list[Any]:
    return [*entry.arguments(specs, concrete=False), *(jax.ShapeDtypeStruct(s.shape, s.dtype) for s in keyword.values())]


def _concrete(entry, specs, keyword, scale: Mapping[str, float]) -> list[Any]:
    """Concrete arrays: "random" fills drawn with one seed per array name (so that, e.g., k and v differ)."""

    def make(spec: ShapeSpec) -> Any:
        if spec.fill == "random" and jnp.issubdtype(jnp.dtype(spec.dtype), jnp.floating):
            rng = np.random.default_rng(zlib.crc32(spec.name.encode()))
            values = rng.standard_normal(spec.shape) * scale.get(spec.name, 1.0)
            return jnp.asarray(values, jnp.dtype(spec.dtype))
        return materialize(spec)

    return [make(specs[n]) for n in entry.names(specs)] + [make(s) for s in keyword.values()]


def _scope_fields(contract: Contract, text: str) -> dict[str, Any]:
    """The fields of the kernel's named scope (it recurs in the module's locations; one scope, one set of blocks)."""
    found = {tuple(m.groupdict().items()) for m in re.finditer(contract.scope, text)}
    assert len(found) == 1, f"expected one named scope matching {contract.scope!r}, found {sorted(found)}"
    (fields,) = found
    return {k: int(v) if v.isdigit() else v for k, v in fields}


def _lower(entry: catalog.KernelEntry, case: Case, static: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """Export a case for TPU; check it is one Mosaic call whose CostEstimate is the op model's; its text and
    named-scope fields."""
    from perfmodel.model.core import to_cost_estimate

    contract = CONTRACTS[entry.name]
    specs, keyword = _specs(entry, case)
    text = export_for_tpu(_function(entry, specs, keyword, case.blocks, case.chip, static),
                          *_abstract(entry, specs, keyword))
    assert MOSAIC_CUSTOM_CALL in text
    used = _scope_fields(contract, text)
    (found,) = cost_estimates(text)  # one Mosaic call
    model = to_cost_estimate(contract.op_cost({**specs, **keyword}, static, used))
    assert (found["flops"], found["transcendentals"], found["bytes_accessed"]) == (
        model.flops, model.transcendentals, model.bytes_accessed)
    assert found["bytes_accessed"] > 0
    if contract.aliased:
        assert "output_operand_aliases" in text  # donated inputs are updated in place
    return text, used


# ----------------------------------------------------------------------------- the registry


def test_every_bundled_kernel_has_a_contract():
    names = [e.name for e in catalog.bundled()]
    assert sorted(CONTRACTS) == sorted(names)
    # Every kernel folder contributes entries, and every tuned kernel tunes one of them.
    assert {e.function.split(":")[0].split(".")[1] for e in catalog.bundled()} == set(kernels.BUNDLED)
    assert {t.entry for t in catalog.tuned_kernels()} <= set(names)


# ----------------------------------------------------------------------------- lowering and cost estimate


def _lowering_cases() -> list:
    cases = []
    for entry in catalog.bundled():
        contract = CONTRACTS.get(entry.name)
        if contract is None:
            continue
        example = Case(id="example", shapes=entry.example, static=contract.example_static)
        for case in (example, *contract.lowered):
            cases.append(pytest.param(entry, case, id=f"{entry.name}-{case.id}"))
    return cases


@pytest.mark.parametrize("entry, case", _lowering_cases())
def test_lowers_to_mosaic_with_the_op_models_cost_estimate(entry, case):
    static = {**entry.static, **_static(case.static)}
    text, used = _lower(entry, case, static)
    (found,) = cost_estimates(text)
    for field, value in case.exact.items():
        assert found[field] == value, field
    for field, value in case.floor.items():
        assert found[field] >= value, field
    if case.scope is not None:
        expected = case.scope() if callable(case.scope) else case.scope
        assert {k: used[k] for k in expected} == dict(expected)
    if case.vmem_limit is not None:
        assert scoped_vmem_limits(text) == [case.vmem_limit]


# ----------------------------------------------------------------------------- defaults from the tuned data


def _tuned_cases() -> list:
    cases = []
    for tuned in catalog.tuned_kernels():
        for chip in sorted(load_tuned_defaults(tuned.kernel)):
            cases.append(pytest.param(tuned, chip, id=f"{tuned.kernel}-{chip}"))
    return cases


@pytest.mark.parametrize("tuned, chip", _tuned_cases())
def test_default_blocks_are_the_stored_ones_at_the_tuned_shape(tuned, chip):
    try:
        get_chip(chip)
    except UnknownChipError:
        pytest.skip(f"no spec for {chip} yet")
    entry = catalog.get_entry(tuned.entry)
    stored = load_tuned_defaults(tuned.kernel)[chip]
    configs = [c for c in tuned.configs if c.key in stored]
    assert configs, f"{tuned.kernel}: none of its configurations is stored for {chip}"
    static = {**entry.static, **(tuned.extra() if tuned.extra else {})}
    fields = [ax.field for ax in entry.block_axes]
    for config in configs:
        # No blocks given: the wrapper picks the chip's defaults for this dtype configuration.
        case = Case(id=config.key, shapes=config.shapes, chip=chip)
        text, used = _lower(entry, case, {**static, **config.static})
        want = stored[config.key]
        assert {f: used[f] for f in fields} == {f: want[f] for f in fields}, config.key
        # The stored scoped-VMEM limit: None keeps the chip's default (no raised limit in the module).
        expected_limits = [] if want["vmem_limit_bytes"] is None else [want["vmem_limit_bytes"]]
        assert scoped_vmem_limits(text) == expected_limits, config.key


# ----------------------------------------------------------------------------- numerics in interpret mode


def _small_cases() -> list:
    cases = []
    for entry in catalog.bundled():
        contract = CONTRACTS.get(entry.name)
        for case in contract.small if contract else ():
            cases.append(pytest.param(entry, case, id=f"{entry.name}-{case.id}"))
    return cases


@pytest.mark.parametrize("entry, case", _small_cases())
def test_matches_the_reference_in_interpret_mode(entry, case):
    # One interpret run serves two checks: its outputs against the reference, and its logged block copies
    # against the schedule model's prediction (record_traffic runs the kernel in TPU interpret mode, as
    # interpret=True does, with the copies instrumented).
    from tests.schedule.recorder import record_traffic

    contract = CONTRACTS[entry.name]
    specs, keyword = _specs(entry, case)
    static = _static(case.static)
    kernel = _function(entry, specs, keyword, case.blocks, case.chip, {**static, "interpret": True})
    reference = _function(entry, specs, keyword, None, case.chip, static, reference=True)
    # Fresh arrays for each call: kernels that update in place donate (consume) their inputs.
    rec = record_traffic(kernel, *_concrete(entry, specs, keyword, case.scale))
    outs = jax.tree.leaves(rec.outputs)
    refs = jax.tree.leaves(reference(*_concrete(entry, specs, keyword, case.scale)))
    assert len(outs) == len(refs)
    for i, (out, ref) in enumerate(zip(outs, refs)):
        assert out.shape == ref.shape, i
        assert out.dtype == ref.dtype or not contract.same_dtype, i
        out32, ref32 = np.asarray(out.astype(jnp.float32)), np.asarray(ref.astype(jnp.float32))
        # Interpret mode fills fresh buffers with NaN: a skipped write shows up here.
        assert np.isfinite(out32).all(), f"output {i}: {np.isnan(out32).sum()} elements never written"
        np.testing.assert_allclose(out32, ref32, **contract.tol[jnp.dtype(out.dtype).name], err_msg=f"output {i}")
    # the schedule model's block copies are the ones this run made (as test_sched_traffic_validation checks)
    assert_traffic_is_the_models(kernel, _concrete(entry, specs, keyword, case.scale), get_chip(case.chip), rec)


# ----------------------------------------------------------------------------- ragged paged attention traffic


def test_ragged_op_model_kv_bytes_equal_the_interpreters_page_copies():
    # A mixed batch whose q blocks of 16 flat rows straddle sequences (decode rows 0 and 52, prefill rows 1-30
    # and 31-51): the op model's KV bytes (combined K/V pages, per flat q block and 128-token KV block) equal
    # the bytes the kernel's DMAs moved in interpret mode: 67 pages, where q blocks per sequence and page-wise
    # causal reads would give 56.
    from kernels.ragged_paged_attention import RaggedPagedAttentionBlockSizes, ragged_paged_attention
    from perfmodel.model.paged_attention import ragged_paged_attention as ragged_model
    from tests.schedule.recorder import record_traffic

    q_lens, kv_lens = np.array([1, 30, 21, 1]), np.array([17, 200, 150, 129])
    q = jax.random.normal(jax.random.key(3), (int(q_lens.sum()), 4, 128), jnp.bfloat16)
    kv_pages = jax.random.normal(jax.random.key(4), (64, 16, 4, 128), jnp.bfloat16)
    page_table = jnp.asarray(np.arange(64, dtype=np.int32).reshape(4, 16)[:, ::-1].copy())
    cu_q_lens = jnp.asarray(np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32))
    blocks = RaggedPagedAttentionBlockSizes(block_q=16, block_kv=128)
    rec = record_traffic(lambda *a: ragged_paged_attention(*a, block_sizes=blocks, chip="tpu-v5e"), q, kv_pages,
                         jnp.asarray(kv_lens, jnp.int32), page_table, cu_q_lens, jnp.asarray([4], jnp.int32))
    cost = ragged_model(query_lens=q_lens, context_lens=kv_lens, q_heads=4, kv_heads=2, head_dim=128, page_size=16,
                        block_q=16, block_kv=128, pages_per_seq=16)
    kv_bytes = cost.metrics["prefill_kv_bytes"] + cost.metrics["decode_kv_bytes"]
    # 16 x 4 x 128 x 2 B = 16384 B per page (K and V of both kv heads).
    assert rec.manual_hbm_bytes == kv_bytes == 67 * 16384
