"""Text, JSON records and the roofline plot of a compiled program and of a step comparison (pure functions)."""

from __future__ import annotations

from typing import Any, Sequence

from perfmodel.xla.program import Program, source_label


def _ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}x"


def program_text(p: Program, *, title: str, top: int | None = None) -> str:
    from perfmodel.units import nbytes, seconds, si, table

    ops = sorted(p.ops, key=lambda o: -o.total_s)
    shown = ops[:top] if top else ops
    rows = [[o.hlo_name, o.kind, source_label(o), f"{o.count}", si(o.total_flops, "FLOP"), nbytes(o.total_hbm_bytes),
             "-" if o.bundles is None else f"{o.bundles:,.0f}", seconds(o.total_s), o.bound,
             f"{100 * p.share(o):.1f}%"] for o in shown]
    head = (f"{title} on {p.chip.name} ({p.topology}, {p.chips} chip(s); the program of one chip): "
            + ("from cache" if p.from_cache else f"compiled in {p.compile_s:.1f} s"))
    lines = [head, "", table(["op", "kind", "source", "runs", "FLOPs", "HBM bytes", "bundles", "time", "bound",
                              "share"], rows, align="lllrrrrrlr")]
    if top and len(ops) > top:
        rest = ops[top:]
        lines.append(f"... {len(rest)} more ops, {seconds(sum(o.total_s for o in rest))} together")
    ca = p.cost_analysis
    lines += ["", f"step {seconds(p.step_s)} (sum of op times {seconds(p.serial_s)} less {seconds(p.dma_hidden_s)} of "
              "DMAs under other ops); bounds: "
              + ", ".join(f"{k} {100 * v:.0f}%" for k, v in p.bound_shares().items()),
              f"work {si(p.flops, 'FLOP')} and {nbytes(p.hbm_bytes)} from HBM by op; the compiler's cost analysis: "
              f"{si(ca.get('flops'), 'FLOP')}, {nbytes(ca.get('bytes accessed'))} accessed "
              "(it counts a while loop's body once and VMEM traffic too)",
              f"HBM footprint {nbytes(p.hbm_footprint_bytes)} per chip (memory_analysis: arguments "
              f"{nbytes(p.memory.get('argument_size_in_bytes'))}, outputs {nbytes(p.memory.get('output_size_in_bytes'))}"
              f" ({nbytes(p.memory.get('alias_size_in_bytes'))} aliased to arguments), temporaries "
              f"{nbytes(p.memory.get('temp_size_in_bytes'))}, code {nbytes(p.memory.get('generated_code_size_in_bytes'))})",
              f"time per op: max(stall {p.stall_factor:.2f} x bundles / {p.chip.compute.clock_hz / 1e9:.2f} GHz, HBM bytes"
              " / achievable HBM rate); collectives: ring model over ICI"]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def program_record(p: Program) -> dict[str, Any]:
    from perfmodel.jsonable import to_jsonable

    return {"chip": p.chip.name, "topology": p.topology, "chips": p.chips, "step_s": p.step_s,
            "serial_s": p.serial_s, "dma_hidden_s": p.dma_hidden_s, "flops": p.flops,
            "hbm_bytes": p.hbm_bytes, "hbm_footprint_bytes": p.hbm_footprint_bytes, "memory": p.memory,
            "cost_analysis": p.cost_analysis, "compile_s": p.compile_s, "from_cache": p.from_cache,
            "bound_shares": p.bound_shares(), "notes": list(p.notes),
            "ops": [{**to_jsonable(o), "total_s": o.total_s, "share": p.share(o)} for o in p.ops]}


def comparison_text(c: Any) -> str:
    from perfmodel.units import nbytes, seconds, table

    pred, p = c.prediction, c.program
    step = pred.step
    head = (f"{pred.model.display_name} {step.phase} batch {step.batch}, context {step.context_tokens}"
            + (f", chunk {step.chunk_tokens}" if step.phase == "prefill" else "")
            + f", TP {step.tp} on {pred.chip.name} ({p.topology}); reference step: {c.kv_layout} KV cache, "
              f"{c.kernels} attention; compiled " + ("(from cache)" if p.from_cache else f"in {p.compile_s:.1f} s"))
    rows = []
    for r in c.rows:
        rows.append([r.name, "-" if r.analytic_s is None else seconds(r.analytic_s), seconds(r.compiled_s),
                     _ratio(r.ratio), r.analytic_bound or "-", r.compiled_bound or "-", "!" if r.flagged else "",
                     "; ".join(r.reasons)])
    lines = [head, "", table(["op", "analytic", "compiled", "ratio", "analytic bound", "compiled bound", "", "why"],
                             rows, align="lrrrllll")]
    total_ratio = c.compiled_s / c.analytic_s if c.analytic_s else None
    m = pred.memory
    lines += ["", f"step: analytic {seconds(c.analytic_s)} (expected), compiled {seconds(c.compiled_s)} "
              f"({_ratio(total_ratio)}; the rows' sum {seconds(p.serial_s)} less {seconds(p.dma_hidden_s)} of DMAs "
              "under other ops); rows flagged '!' differ by more than 15%",
              f"HBM per chip: compiler footprint {nbytes(p.hbm_footprint_bytes)} vs analytic weights + KV "
              f"{nbytes(c.analytic_hbm_need_bytes)} ({'fits' if m.fits else 'does not fit'} in "
              f"{nbytes(m.usable_bytes)} usable)"]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def comparison_record(point: dict[str, Any], c: Any) -> dict[str, Any]:
    from perfmodel.jsonable import to_jsonable

    return {"point": point, "model": c.prediction.model.name, "chip": c.prediction.chip.name,
            "topology": c.program.topology, "kv_layout": c.kv_layout, "kernels": c.kernels,
            "analytic_s": c.analytic_s, "compiled_s": c.compiled_s, "compiled_serial_s": c.program.serial_s,
            "compiled_dma_hidden_s": c.program.dma_hidden_s,
            "compiled_hbm_footprint_bytes": c.program.hbm_footprint_bytes,
            "analytic_hbm_need_bytes": c.analytic_hbm_need_bytes, "analytic_fits": c.prediction.memory.fits,
            "rows": [{**to_jsonable(r), "ratio": r.ratio} for r in c.rows], "notes": list(c.program.notes)}


def roofline_figure(p: Program, *, title: str) -> Any:
    """Ops of a program on the chip's roofline: arithmetic intensity (FLOP per HBM byte) against attained
    FLOP/s, marker area by share of the step, colour by bound; the HBM slope and the bf16 peak drawn."""
    from perfmodel.harness.plots import BOUND_COLOURS, _figure

    fig = _figure(7.5, 5.0)
    ax = fig.subplots()
    chip = p.chip
    peak = chip.matmul_rate("bf16") or 1.0
    bw = chip.memory.hbm_bw_bytes_per_s_per_chip
    colours = {"compute": BOUND_COLOURS["mxu"], "hbm": BOUND_COLOURS["hbm"], "ici": BOUND_COLOURS["ici"]}
    pts = [o for o in p.ops if o.total_s > 0 and o.flops > 0]
    lo = min([o.flops / max(o.hbm_bytes, 1.0) for o in pts] + [0.1])
    hi = max([o.flops / max(o.hbm_bytes, 1.0) for o in pts] + [peak / bw * 10])
    import numpy as np

    x = np.logspace(np.log10(lo / 2), np.log10(hi * 2), 200)
    ax.plot(x, np.minimum(peak, x * bw), "k-", lw=1, label=f"roofline ({chip.name}: bf16 peak, HBM)")
    for bound in ("compute", "hbm", "ici"):
        sel = [o for o in pts if o.bound == bound]
        if not sel:
            continue
        ax.scatter([o.flops / max(o.hbm_bytes, 1.0) for o in sel], [o.flops / o.time_s for o in sel],
                   s=[20 + 600 * p.share(o) for o in sel], color=colours[bound], alpha=0.7,
                   label=f"{bound}-bound ops", zorder=3)
    for o in sorted(pts, key=lambda o: -o.total_s)[:6]:
        ax.annotate(source_label(o, 1), (o.flops / max(o.hbm_bytes, 1.0), o.flops / o.time_s), fontsize=7,
                    xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP / HBM byte)")
    ax.set_ylabel("attained FLOP/s (FLOPs / op time)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    return fig


def save_plot(p: Program, path: str, *, title: str) -> str:
    from perfmodel.harness.plots import save

    return str(save(roofline_figure(p, title=title), path, field="plot"))


def sweep_text(items: Sequence[tuple[dict[str, Any], Any]]) -> str:
    return "\n\n".join(comparison_text(c) for _, c in items)
