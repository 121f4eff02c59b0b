"""Decode attention kernels compiled for TPU (deviceless libtpu): bundles per 512-token KV block vs the HBM floor.

Prints, per chip (v5e, v6e) and page size (16, 128 tokens), for the bundled ragged_paged_attention on a decode
batch (16 sequences x 1 new token, 2k context, 32 q / 8 kv heads of 128, bf16, block_kv 512):

* the KV-block loop body's static bundles on the decode (one-row) path: the loop body less its largest
  predicated region (the multi-row block path), which is what one 512-token block for all 8 KV heads issues;
* the block's HBM floor in cycles: 512 tokens x 8 heads x (K + V) x 128 x 2 B over the chip's HBM bandwidth,
  at its clock (hwspecs/*.yaml, sources there);
* DMA starts and waits in that loop body.

The same decode over an int8 cache with per-token f32 scales (v5e, v6e) and an fp8 (e4m3fn) one (v6e; v5e has no
fp8): its floor is the block's int8 bytes plus its scales (512 tokens x 16 K/V rows x 4 B). Their cache has 4x
spare pages (the sequences read only their own): XLA places a cache that fits in VMEM there (a 64 MiB int8 cache
does on v5e), which turns the page DMAs into vector copies; a serving cache never fits.

vLLM tpu-inference's ragged paged attention v3 is compiled side by side on the same decode problem (its decode
kernel, KV blocks of 512 tokens fetched and computed whole, new tokens not written) through the adapter
tests/benchmarks/rpa_v3_adapter.py, from the installed package or the wheel in ``$TPI_WHEEL_DIR`` (default
/tmp/tpi; ``pip download tpu-inference==0.32.0 --no-deps -d /tmp/tpi``); its bundles per block are its KV-block
loop body (the page DMAs of the next block and the one-trip compute loop nested in it). Not collected by pytest;
run ``.venv/bin/python tests/benchmarks/bench_attention_kernels.py`` from the repository root (about 20 s per
compile on 2 cores).
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

os.environ.setdefault("PERFMODEL_CACHE_DIR", tempfile.mkdtemp(prefix="perfmodel-bench-attn-"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

sys.path.insert(0, os.getcwd())  # tests.benchmarks.rpa_v3_adapter imports (and keys the compile cache) from the root

from perfmodel.compiler.api import CompileCall, compile_report  # noqa: E402
from perfmodel.hw.registry import get_chip  # noqa: E402
from tests.benchmarks import rpa_v3_adapter  # noqa: E402

SEQS, CONTEXT, Q_HEADS, KV_HEADS, HEAD_DIM, BLOCK_KV = 16, 2048, 32, 8, 128, 512
_ROW = re.compile(r"^\s*0x[0-9a-f]+\s+(?:[A-Z]{2}:)?\s*(>*)\s*\{(.*)")


#: Spare pages of the quantized caches (see the module docstring).
QUANT_SPARE_PAGES = 4
#: Bytes per K/V element by cache dtype, and of one f32 scale.
KV_BYTES = {"bf16": 2, "int8": 1, "float8_e4m3fn": 1}
SCALE_BYTES = 4


def ragged_call(page_size: int, kv_dtype: str = "bf16", chip: str | None = None) -> CompileCall:
    quantized = kv_dtype != "bf16"
    pages = SEQS * CONTEXT // page_size * (QUANT_SPARE_PAGES if quantized else 1)
    scales = (f"kv_scales={pages}x{page_size}x{2 * KV_HEADS}:f32",) if quantized else ()
    chip_arg = (f'chip="{chip}"',) if quantized else ()  # fp8 is checked against the chip
    return CompileCall(kind="function", target="kernels.ragged_paged_attention:ragged_paged_attention", shapes=(
        f"q={SEQS}x{Q_HEADS}x{HEAD_DIM}:bf16", f"kv_pages={pages}x{page_size}x{2 * KV_HEADS}x{HEAD_DIM}:{kv_dtype}",
        f"kv_lens={SEQS}:int32={CONTEXT}", f"page_table={SEQS}x{CONTEXT // page_size}:int32=arange",
        f"cu_q_lens={SEQS + 1}:int32=arange", "num_seqs=1:int32=16", *scales),
        args=(f'block_sizes={{"block_q": 16, "block_kv": {BLOCK_KV}}}', *chip_arg))


def v3_call(page_size: int) -> CompileCall:
    pages = SEQS * CONTEXT // page_size
    return CompileCall(kind="function", target="tests.benchmarks.rpa_v3_adapter:decode", shapes=(
        f"q={SEQS}x{Q_HEADS}x{HEAD_DIM}:bf16", f"k={SEQS}x{KV_HEADS}x{HEAD_DIM}:bf16",
        f"v={SEQS}x{KV_HEADS}x{HEAD_DIM}:bf16",
        # v3's cache: [pages, page_size, 2 * kv_heads / 2 (bf16 packing), 2, head_dim]
        f"kv_cache={pages}x{page_size}x{KV_HEADS}x2x{HEAD_DIM}:bf16", f"kv_lens={SEQS}:int32={CONTEXT}",
        f"page_indices={pages}:int32=arange", f"cu_q_lens={SEQS + 1}:int32=arange",
        f"distribution=3:int32={SEQS}"),  # all decode
        args=(f"bkv={BLOCK_KV}",))


def kv_loop_body(report, *, less_largest_region: bool = True) -> tuple[int, int, int]:
    """(decode-path bundles, DMA starts, DMA waits) of the KV-block loop: the deepest loop holding DMA starts
    in the first kernel's grid-step body the compiler dumped (nested loops included), less its largest
    predicated region (the bundled kernel's multi-row path) when ``less_largest_region``."""
    kernel = report.kernels[0]
    rows = []
    for line in open(kernel.body_bundles_path):
        m = _ROW.match(line)
        if m:
            rows.append((len(m.group(1)), m.group(2)))
    depths = sorted({d for d, text in rows if re.search(r"= dma\.(?!done)", text)}, reverse=True)
    depth = depths[0]
    body = [text for d, text in rows if d >= depth]
    starts = sum(len(re.findall(r"= dma\.(?!done)", t)) for t in body)
    waits = sum(t.count("dma.done.wait") for t in body)
    less = max(kernel.loop.predicated_regions) if less_largest_region else 0
    return len(body) - less, starts, waits


def hbm_floor_cycles(chip, kv_dtype: str = "bf16") -> float:
    """Cycles to read one KV block's K and V of every head (and, quantized, its K and V scales) from HBM."""
    block_bytes = BLOCK_KV * KV_HEADS * 2 * HEAD_DIM * KV_BYTES[kv_dtype]
    if kv_dtype != "bf16":
        block_bytes += BLOCK_KV * KV_HEADS * 2 * SCALE_BYTES
    return block_bytes / chip.memory.hbm_bw_bytes_per_s_per_chip * chip.compute.clock_hz


def main() -> None:
    print(f"decode: {SEQS} seqs x 1 token, {CONTEXT}-token context, {Q_HEADS} q / {KV_HEADS} kv heads of "
          f"{HEAD_DIM}, bf16, KV blocks of {BLOCK_KV} tokens")
    print(f"{'kernel':34s} {'chip':8s} {'page':>4s} {'bundles/block':>13s} {'HBM floor cyc':>13s} "
          f"{'cycles/floor':>12s} {'DMA starts':>10s} {'waits':>5s}")
    for chip_name in ("tpu-v5e", "tpu-v6e"):
        chip = get_chip(chip_name)
        for page_size in (16, 128):
            row(chip, page_size, "ragged_paged_attention (bundled)", ragged_call(page_size), True)
    for chip_name, kv_dtype in (("tpu-v5e", "int8"), ("tpu-v6e", "int8"), ("tpu-v6e", "float8_e4m3fn")):
        chip = get_chip(chip_name)
        for page_size in (16, 128):
            label = f"ragged_paged_attention {'fp8' if kv_dtype != 'int8' else kv_dtype} KV"
            row(chip, page_size, label, ragged_call(page_size, kv_dtype, chip_name), True, kv_dtype)
    if rpa_v3_adapter.v3_root() is None:
        print("vLLM tpu-inference v3: not found (pip download tpu-inference==0.32.0 --no-deps -d /tmp/tpi)")
        return
    for chip_name in ("tpu-v5e", "tpu-v6e"):
        chip = get_chip(chip_name)
        for page_size in (16, 128):
            row(chip, page_size, "tpu-inference RPA v3 (decode)", v3_call(page_size), False)


def row(chip, page_size: int, label: str, call: CompileCall, less_largest_region: bool,
        kv_dtype: str = "bf16") -> None:
    report = compile_report(call, chip.name)
    if not report.compiled:
        print(f"{label} {chip.name} page {page_size}: does not compile: {report.error}")
        return
    bundles, starts, waits = kv_loop_body(report, less_largest_region=less_largest_region)
    floor = hbm_floor_cycles(chip, kv_dtype)
    # A block costs max(issue, DMA) cycles when the next block's DMA overlaps this one's compute.
    print(f"{label:34s} {chip.name:8s} {page_size:4d} {bundles:13,d} "
          f"{floor:13,.0f} {max(bundles, floor) / floor:12.2f} {starts:10d} {waits:5d}")

if __name__ == "__main__":
    sys.exit(main())
