"""The sampling kernel through the real TPU compiler (deviceless): per pass, bundles per vocabulary chunk, vector
spills/fills, and cycles against the HBM floor of reading that chunk; then the whole call against its roofline.

Prints figures; not collected by pytest. Run: ``.venv/bin/python tests/benchmarks/bench_sampling_kernel.py
[--chips tpu-v5e,...] [--variants top-k,...] [--batch 64 --vocab 128256]``.

How it measures: one compile child per (chip, variant) with libtpu's schedule dumps on
(:func:`perfmodel.compiler.toolchain.worker_environment`); the dumps are read with
:mod:`perfmodel.compiler.bundles`. A *pass* over the resident rows is a compiled loop whose trip count is the
number of vocabulary chunks (``vocab / block_v``); its body is one chunk of ``block_b x block_v`` logits, so
``weighted_bundles`` of the body is the cycles per chunk at one bundle per cycle (no stalls). The HBM floor of a
chunk is its bytes over the HBM bandwidth one TensorCore gets (chip rate / TensorCores sharing it), in core
cycles. Passes are labelled in program order by the variant's known sequence of searches.

Whole call: phase 0 (streaming the logits once) is HBM-bound; the passes over VMEM are the threshold searches,
whose number depends on the data. For the top-k+top-p variant the script counts them with
``kernels.sampling.search.search_passes`` (the kernel's own search, in interpret mode on this host) on three
kinds of 64 x vocab rows, as compiled, without the capture pass, and without the lane-maxima brackets too, and
prints the searches' cycles per row block (passes x chunks x bundles per chunk, plus 32 halvings per small
selection) against the roofline (one read of the row block's logits from HBM).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

from kernels.sampling.variants import VARIANTS as SAMPLING_VARIANTS

os.environ.setdefault("JAX_PLATFORMS", "cpu")

#: The variants (kernels/sampling/variants.py), by name; each call's arrays are its --shape texts at --batch and
#: --vocab, its static options the table's, its chunk loops labelled by the table's passes.
VARIANTS = {v.name: v for v in SAMPLING_VARIANTS}
CHIPS = ("tpu-v4", "tpu-v5e", "tpu-v5p", "tpu-v6e", "tpu-7x")


def _child(request: dict) -> None:
    """In the compile child: compile one variant, print nothing but the result JSON on the last line."""
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies

    import kernels.sampling
    from perfmodel.compiler.toolchain import topology_for
    from perfmodel.schedule.shapes import parse_shape

    topo = topologies.get_topology_desc(topology_for(request["chip"]), "tpu")
    sharding = jax.sharding.SingleDeviceSharding(topo.devices[0])
    v = VARIANTS[request["variant"]]
    specs = [parse_shape(text) for text in v.shapes(request["batch"], request["vocab"])]
    arrays = {s.name: jax.ShapeDtypeStruct(s.shape, jnp.dtype(s.dtype), sharding=sharding) for s in specs}
    fn, opts = getattr(kernels.sampling, v.function), v.kwargs

    def call(named):
        return fn(**named, **opts, chip=request["chip"])

    _report(jax.jit(call).trace(arrays).lower(lowering_platforms=("tpu",)).compile())


def _report(compiled) -> None:
    from perfmodel.compiler.worker import _CUSTOM_CALL, _SCOPED, _SCOPED_ITEM

    vmem = None
    for line in compiled.as_text().splitlines():
        found = _SCOPED.search(line) if _CUSTOM_CALL.match(line) else None
        if found:
            vmem = max(vmem or 0, sum(int(size) for space, size in _SCOPED_ITEM.findall(found.group(1))
                                      if space == "1"))
    print("@@RESULT@@" + json.dumps({"ok": True, "scoped_vmem_bytes": vmem}))


def measure(chip: str, variant: str, *, batch: int, vocab: int) -> dict:
    """Compile one variant for ``chip`` in a child; read its schedule dumps; per-chunk-loop stats."""
    from kernels.sampling import default_block_sizes
    from perfmodel.compiler.bundles import grid_loop, loop_stats
    from perfmodel.compiler.toolchain import worker_environment
    from perfmodel.compiler.worker import _op_files, read_schedule

    v = VARIANTS[variant]
    options, labels, dtype = v.kwargs, v.passes, v.logits_dtype
    blocks = default_block_sizes(chip, logits_dtype=dtype, vocab=vocab)
    dump = tempfile.mkdtemp(prefix="perfmodel-bench-sampling-")
    try:
        request = dict(chip=chip, batch=batch, vocab=vocab, variant=variant)
        proc = subprocess.run([sys.executable, __file__, "--child", json.dumps(request)], capture_output=True,
                              text=True, env=worker_environment(dump), timeout=900)
        if "@@RESULT@@" not in proc.stdout:
            return {"error": (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        child = json.loads(proc.stdout.rsplit("@@RESULT@@", 1)[1].splitlines()[0])
        files = [f for name, f in _op_files(dump).items()
                 if ("sampling" in name or "rejection" in name) and "bundles" in f]
        if not files:
            return {"error": "no sampling kernel schedule in the dumps"}
        sched = read_schedule(files[0])
    finally:
        shutil.rmtree(dump, ignore_errors=True)
    grid = grid_loop(sched)
    body = loop_stats(sched, grid)
    chunks = -(-vocab // blocks.block_v)
    # Innermost loops of `chunks` trips (an enclosing bisection `while` loop can read the same literal bound).
    innermost = [lp for lp in sched.loops
                 if not any(o is not lp and lp.start <= o.start and o.end <= lp.end for o in sched.loops)]
    chunk_loops = [lp for lp in innermost if lp is not grid and lp.trip_count == chunks]
    from kernels.sampling.search import MAX_BISECTION_STEPS

    halvings = [loop_stats(sched, lp).weighted_bundles for lp in sorted(innermost, key=lambda lp: lp.start)
                if lp is not grid and lp.trip_count == MAX_BISECTION_STEPS and lp.trip_count != chunks]
    passes = []
    for i, lp in enumerate(sorted(chunk_loops, key=lambda lp: lp.start)):
        st = loop_stats(sched, lp)
        passes.append(dict(label=labels[i] if i < len(labels) else f"loop {i}", bundles=st.weighted_bundles,
                           spills=st.vector_spills, fills=st.vector_fills))
    estimate = blocks.vmem_bytes(vocab=vocab, logits_dtype=dtype, with_noise=False, greedy=not v.seeds,
                                 penalties="token_counts" in v.vocab_arrays, bias="logit_bias" in v.vocab_arrays,
                                 top_logprobs=options.get("logprobs") or 0)
    if v.function == "rejection_sample":  # two f32 streams, nothing resident
        estimate = blocks.vmem_bytes(vocab=vocab, logits_dtype=dtype, with_noise=True, greedy=True)
    return dict(scoped_vmem_bytes=child["scoped_vmem_bytes"], vmem_estimate_bytes=estimate, block_b=blocks.block_b, block_v=blocks.block_v, chunks=chunks, program_bundles=len(sched.bundles),
                grid_body_bundles=body.bundles, grid_spills=body.vector_spills, grid_fills=body.vector_fills,
                passes=passes, bracket_halving_bundles=halvings)


def hbm_floor_cycles(chip: str, chunk_bytes: int) -> float:
    """Core cycles to read ``chunk_bytes`` from HBM at one TensorCore's share of the chip's bandwidth."""
    from perfmodel.hw.registry import get_chip

    spec = get_chip(chip)
    share = spec.memory.hbm_bw_bytes_per_s_per_chip / spec.cores.cores_per_chip
    return chunk_bytes / share * spec.compute.clock_hz


def test_rows(kind: str, batch: int, vocab: int) -> "np.ndarray":
    """64 x vocab f32 rows: ``normal`` N(0, 2.5^2); ``spiky`` N(0, 1) with 30 tokens at N(12, 2^2) (a confident
    model); ``zipf`` 3 * -1.1 * log(rank) over a random permutation (a heavy-tailed one). Seeded."""
    import numpy as np

    rng = np.random.default_rng(0)
    if kind == "normal":
        return rng.normal(0, 2.5, (batch, vocab)).astype(np.float32)
    if kind == "spiky":
        rows = rng.normal(0, 1, (batch, vocab)).astype(np.float32)
        for r in range(batch):
            rows[r, rng.choice(vocab, 30, replace=False)] = rng.normal(12, 2, 30)
        return rows
    return np.stack([-3.3 * np.log1p(rng.permutation(vocab)) for _ in range(batch)]).astype(np.float32)


def search_cycles(r: dict, *, batch: int, vocab: int, floor: float) -> None:
    """Print the top-k + top-p searches' cycles per row block on three kinds of rows: as the kernel runs them, and
    without the capture pass, and without the brackets too."""
    from kernels.sampling.search import MAX_BISECTION_STEPS, search_passes

    capture, topk, mass, countmass = (p["bundles"] for p in r["passes"][:4])
    # Four selections of 32 halvings on small arrays (the k-th largest captured value, top-p on the captured values,
    # the top-k and top-p brackets), within a few bundles of each other; which loop is which is not read from the
    # schedule, so each counts at their mean.
    halving = sum(r["bracket_halving_bundles"]) / max(1, len(r["bracket_halving_bundles"]))
    chunks = r["chunks"]
    opts = VARIANTS["top-k+top-p"].kwargs
    for kind in ("normal", "spiky", "zipf"):
        rows = test_rows(kind, batch, vocab)
        for label, flags in (("as compiled", {}), ("no capture", dict(capture=False)),
                             ("neither", dict(capture=False, brackets=False))):
            _, passes = search_passes(rows, top_k=opts["top_k"], top_p=opts["top_p"],
                                      temperature=opts["temperature"], block_b=r["block_b"], **flags)
            cycles = []
            for k, p, captured_only in passes.tolist():
                c = 0.0
                if flags.get("capture", True):
                    c += chunks * capture + MAX_BISECTION_STEPS * 2 * halving
                    k -= 1
                if not captured_only:
                    c += chunks * (k * topk + mass + p * countmass)
                    if flags.get("brackets", True):
                        c += MAX_BISECTION_STEPS * 2 * halving
                cycles.append(c)
            print(f"    {kind:6s} rows, {label:11s}: top-k passes {passes[:, 0].min()}-{passes[:, 0].max()}, top-p "
                  f"{passes[:, 1].min()}-{passes[:, 1].max()}, {int(passes[:, 2].sum())}/{len(passes)} blocks from "
                  f"the captured values; searches {min(cycles) / 1e3:.1f}k-{max(cycles) / 1e3:.1f}k cycles per "
                  f"row block = {min(cycles) / (chunks * floor):.2f}-{max(cycles) / (chunks * floor):.2f}x one read "
                  f"of its logits ({chunks * floor / 1e3:.1f}k)")


def _variant_names(text: str) -> list[str]:
    """The variant names of a comma-separated list; a piece that is no name joins the next (names such as
    "penalties, bias and masks" hold commas)."""
    names, piece = [], ""
    for part in text.split(","):
        piece = f"{piece},{part}" if piece else part
        if piece.strip() in VARIANTS:
            names.append(piece.strip())
            piece = ""
    if piece:
        raise SystemExit(f"--variants: unknown variant {piece.strip()!r}; known: {', '.join(VARIANTS)}")
    return names


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--chips", default="tpu-v5e")
    ap.add_argument("--variants", default=",".join(VARIANTS),
                    help="comma-separated names of kernels/sampling/variants.py (names may contain commas)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.child:
        _child(json.loads(args.child))
        return
    rows = []
    for chip in args.chips.split(","):
        for variant in _variant_names(args.variants):
            r = measure(chip, variant, batch=args.batch, vocab=args.vocab)
            r.update(chip=chip, variant=variant)
            rows.append(r)
            if "error" in r:
                print(f"{chip:8s} {variant:12s} error: {r['error']}")
                continue
            floor = hbm_floor_cycles(chip, r["block_b"] * r["block_v"] * 4)
            for p in r["passes"]:
                print(f"{chip:8s} {variant:12s} {p['label']:24s} {p['bundles']:6d} bundles/chunk "
                      f"spills {p['spills']:4d} fills {p['fills']:4d}  vs HBM floor {floor:6.0f} cycles: "
                      f"{p['bundles'] / floor:.2f}x")
            if r["bracket_halving_bundles"]:
                print(f"{chip:8s} {variant:12s} small selections (brackets, captured values): "
                      f"{r['bracket_halving_bundles']} bundles per halving (32 halvings each)")
            if variant == "top-k+top-p" and len(r["passes"]) >= 4:
                search_cycles(r, batch=args.batch, vocab=args.vocab, floor=floor)
            if VARIANTS[variant].function == "rejection_sample":  # one grid step streams a target and a draft block
                print(f"{chip:8s} {variant:12s} grid step {r['grid_body_bundles']} bundles vs HBM floor of its 2 "
                      f"blocks {2 * floor:.0f} cycles: {r['grid_body_bundles'] / (2 * floor):.2f}x")
            print(f"{chip:8s} {variant:12s} grid body {r['grid_body_bundles']} bundles, spills {r['grid_spills']} "
                  f"fills {r['grid_fills']} (blocks {r['block_b']}x{r['block_v']}); VMEM Mosaic {r['scoped_vmem_bytes']} B, "
                  f"estimate {r['vmem_estimate_bytes']} B")
    if args.json:
        print(json.dumps(rows))


if __name__ == "__main__":
    main()
