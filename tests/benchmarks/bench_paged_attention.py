"""paged_attention through the real TPU compiler (deviceless): bundles per compute block and cycles per sequence
against the HBM floor of its K/V.

Prints figures; not collected by pytest. Run: ``.venv/bin/python tests/benchmarks/bench_paged_attention.py
[--chips tpu-v5e,tpu-v6e] [--page-sizes 16,64] [--blocks 0,8]`` (block 0: the kernel's default).

How it measures: one compile per (chip, page size, block) through the compile server (:mod:`perfmodel.compiler.client`) with
libtpu's schedule dumps on (:func:`perfmodel.compiler.toolchain.worker_environment`); the kernel's dump is read
with :mod:`perfmodel.compiler.bundles`. The compute-block loop runs a data-dependent number of trips (one per
block of the sequence), which the compile report counts once; here its body's ``weighted_bundles`` (the
page-DMA loops inside counted per page) is the cycles of one block at one bundle per cycle (no stalls). Per
sequence: the step's other bundles + blocks x max(those bundles, the block's K/V bytes over the chip's HBM
bandwidth in cycles), against the floor of the sequence's K/V bytes. DMA latency and issue contention are left out.
The problem: decode of 8 sequences x 2048 tokens, 32 q / 8 kv heads of 128, bf16 pages.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")

BATCH, CONTEXT, Q_HEADS, KV_HEADS, HEAD_DIM, BF16_BYTES = 8, 2048, 32, 8, 128, 2


def measure(chip: str, page_size: int, pages_per_block: int) -> dict:
    from perfmodel.compiler.bundles import grid_loop, loop_stats
    from perfmodel.compiler.client import ask
    from perfmodel.compiler.toolchain import topology_for, worker_environment
    from perfmodel.compiler.worker import _op_files, read_schedule
    from perfmodel.hw.registry import get_chip

    pages_per_seq = CONTEXT // page_size
    pages = BATCH * pages_per_seq
    shapes = [f"q={BATCH}x{Q_HEADS}x{HEAD_DIM}:bf16", f"k_pages={KV_HEADS}x{pages}x{page_size}x{HEAD_DIM}:bf16",
              f"v_pages={KV_HEADS}x{pages}x{page_size}x{HEAD_DIM}:bf16",
              f"page_table={BATCH}x{pages_per_seq}:int32=arange", f"lengths={BATCH}:int32={CONTEXT}"]
    call = {"kind": "catalog", "kernel": "paged_attention", "shapes": shapes,
            "blocks": {"pages_per_compute_block": pages_per_block} if pages_per_block else None, "args": {}}
    dump = tempfile.mkdtemp(prefix="perfmodel-bench-paged-")
    try:
        request = {"chip": chip, "topology": topology_for(chip), "call": call, "dump_dir": dump}
        result = ask(request, worker_environment(None), 900)
        if result.get("server_error"):
            return {"error": result.get("stderr") or result["server_error"]}
        if not result["compiled"]:
            return {"error": result["error"]}
        files = {name: f for name, f in _op_files(dump).items() if name.startswith("paged_attention")}
        (name,) = files
        sched = read_schedule(files[name])
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    grid = grid_loop(sched)
    inner = [lp for lp in sched.loops if lp is not grid and grid.start <= lp.start and lp.end <= grid.end]
    # The compute-block loop: the largest loop of the grid step not nested in another one.
    outer = [lp for lp in inner if not any(o is not lp and o.start <= lp.start and lp.end <= o.end for o in inner)]
    block_loop = max(outer, key=lambda lp: lp.bundles)
    block_bundles = loop_stats(sched, block_loop).weighted_bundles
    ppcb = int(re.search(r"ppcb(\d+)", name).group(1))
    spec = get_chip(chip)
    cycles_per_byte = spec.compute.clock_hz / spec.memory.hbm_bw_bytes_per_s_per_chip
    block_bytes = 2 * KV_HEADS * ppcb * page_size * HEAD_DIM * BF16_BYTES
    blocks = pages_per_seq // ppcb
    floor = 2 * KV_HEADS * CONTEXT * HEAD_DIM * BF16_BYTES * cycles_per_byte
    step = loop_stats(sched, grid)
    # The step's bundles outside the block loop (whose trips the schedule does not fix: counted once there).
    fixed = step.weighted_bundles - block_bundles
    cycles = fixed + blocks * max(block_bundles, block_bytes * cycles_per_byte)
    return {"tokens_per_block": ppcb * page_size, "block_bundles": block_bundles,
            "block_dma_cycles": block_bytes * cycles_per_byte, "cycles_per_seq": cycles, "floor_cycles": floor,
            "vs_floor": cycles / floor, "bounds_check_halts": step.bounds_check_halts,
            "scoped_vmem_bytes": result["kernels"][0]["scoped_vmem_bytes"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chips", default="tpu-v5e,tpu-v6e")
    parser.add_argument("--page-sizes", default="64,16")
    parser.add_argument("--blocks", default="0,8", help="pages per compute block; 0: the kernel's default")
    args = parser.parse_args()
    print(f"{'chip':8} {'page':>4} {'block':>5} {'bundles/block':>13} {'DMA cycles':>10} {'cycles/seq':>10} "
          f"{'floor':>7} {'x floor':>7} {'halts':>5} {'VMEM KiB':>8}")
    for chip in args.chips.split(","):
        for page_size in (int(x) for x in args.page_sizes.split(",")):
            for ppcb in (int(x) for x in args.blocks.split(",")):
                r = measure(chip, page_size, ppcb)
                if "error" in r:
                    print(f"{chip:8} {page_size:4} {ppcb:5} error: {r['error']}")
                    continue
                print(f"{chip:8} {page_size:4} {r['tokens_per_block']:5} {r['block_bundles']:13,} "
                      f"{r['block_dma_cycles']:10,.0f} {r['cycles_per_seq']:10,.0f} {r['floor_cycles']:7,.0f} "
                      f"{r['vs_floor']:6.2f}x {r['bounds_check_halts']:5} {r['scoped_vmem_bytes'] / 1024:8,.0f}")


if __name__ == "__main__":
    main()
