"""Pictures of serve results (matplotlib, Agg): pure functions from results to figures, and a writer."""

from __future__ import annotations

from pathlib import Path

from perfmodel.errors import InputError
from perfmodel.serve.run import ServeResult, ServeSweep


def timeline_figure(r: ServeResult):
    """Running and waiting requests and KV use over the run (replica 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tl = r.run.timeline
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 5), sharex=True)
    ax1.step(tl.t_s, tl.running, where="post", label="running")
    ax1.step(tl.t_s, tl.waiting, where="post", label="waiting")
    ax1.set_ylabel("requests")
    ax1.legend(loc="upper right")
    ax2.step(tl.t_s, 100 * tl.kv_usage, where="post", color="tab:red")
    ax2.set_ylabel("KV blocks in use (%)")
    ax2.set_xlabel("time (s)")
    c = r.engine
    fig.suptitle(f"{c.model.name} on {c.chip.name} x{c.tp}: {c.engine} engine timeline")
    fig.tight_layout()
    return fig


def curve_figure(sw: ServeSweep):
    """Throughput against TPOT and TTFT over a sweep (the faster run's curve too, when there is one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for label, pick in (("as is", lambda p: p.base), ("faster", lambda p: p.faster)):
        res = [pick(p) for p in sw.points]
        if any(x is None for x in res):
            continue
        thr = [x.metrics.output_throughput for x in res]
        ax1.plot(thr, [x.metrics.distributions["tpot"].mean_ms for x in res], "o-", label=label)
        ax2.plot(thr, [x.metrics.distributions["ttft"].median_ms for x in res], "o-", label=label)
    ax1.set_xlabel("output throughput (tok/s)")
    ax1.set_ylabel("mean TPOT (ms)")
    ax2.set_xlabel("output throughput (tok/s)")
    ax2.set_ylabel("median TTFT (ms)")
    ax2.set_yscale("log")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend()
    base = sw.points[0].base.engine
    fig.suptitle(f"{base.model.name} on {base.chip.name}: latency against throughput ({sw.swept})")
    fig.tight_layout()
    return fig


def write_plots(directory: str, *, result: ServeResult | None = None, sweep: ServeSweep | None = None,
                force: bool = False) -> list[str]:
    """Write timeline.png (a run) and/or curve.png (a sweep) into ``directory``; refuses to overwrite without
    ``force``."""
    import matplotlib.pyplot as plt

    out = Path(directory)
    if out.exists() and not out.is_dir():
        raise InputError(f"`plot` {directory}: not a directory; give a directory for the PNG files")
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    if result is not None:
        figures.append(("timeline.png", timeline_figure(result)))
    if sweep is not None:
        figures.append(("curve.png", curve_figure(sweep)))
    written = []
    for name, fig in figures:
        path = out / name
        if path.exists() and not force:
            plt.close(fig)
            raise InputError(f"`plot`: {path} exists; pass --force to overwrite it or pick another directory")
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(str(path))
    return written
