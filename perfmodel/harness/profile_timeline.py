"""The op timeline of a jax.profiler trace (what ``perfmodel measure``'s device timer reads): xprof's
``trace_viewer@`` converter's events, a device's "XLA Ops" line where the trace has one (TPU, GPU), else the
XLA:CPU op events, each with its start and duration (:func:`read_timeline`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from perfmodel.errors import ToolFailure
from perfmodel.harness.profile import XLA_THREAD_PREFIX, _is_runtime_event, _linked, _tool, find_xplanes
from perfmodel.inputcheck import short


#: The trace-viewer line of a TPU or GPU device's op events (xprof derives it from the device's kernels).
DEVICE_OPS_LINE = "XLA Ops"


@dataclass(frozen=True, kw_only=True)
class TraceEvent:
    """One complete event of xprof's trace viewer, in seconds of the trace's clock."""

    name: str
    #: The trace viewer's process and thread (line) names: "/host:CPU" / "python", "/device:TPU:0" / "XLA Ops".
    process: str
    thread: str
    start_s: float
    duration_s: float

    @property
    def end_s(self) -> float:
        return self.start_s + self.duration_s


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """What :func:`read_timeline` read: the op events and the other events of a trace, each by start."""

    path: str
    #: Where the op events are: the devices' "XLA Ops" lines or, on the CPU backend, the tf_XLA* threads.
    op_source: str
    #: Op events; one inside another op event of its line (a loop body's ops, the host work of a callback) is left
    #: out, so that summing durations counts each moment of a line once.
    ops: tuple[TraceEvent, ...]
    #: Every other complete event (host threads: Python, trace annotations, the runtime).
    host: tuple[TraceEvent, ...]




def _top_level(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """The events of one line that lie inside no other event of it (1 ns of slack for the trace's rounding)."""
    out: list[TraceEvent] = []
    end = -float("inf")
    for e in sorted(events, key=lambda e: (e.start_s, -e.duration_s)):
        if e.end_s <= end + 1e-9:
            continue
        out.append(e)
        end = max(end, e.end_s)
    return out


def _with_end_marker(events: Sequence[TraceEvent]) -> list[TraceEvent]:
    """The events of one line followed by their "end: <name>" marker (XLA:CPU writes one as each op finishes)
    before they end: XLA:CPU ops that ran inline on a host thread (the caller's, named "python" by jax's Python
    tracer), told from that thread's host events."""
    import bisect

    markers: dict[str, list[float]] = {}
    for e in events:
        if e.name.startswith("end: "):
            markers.setdefault(e.name[len("end: "):], []).append(e.start_s)
    for starts in markers.values():
        starts.sort()
    out = []
    for e in events:
        starts = markers.get(e.name)
        if starts and not _is_runtime_event(e.name):
            i = bisect.bisect_left(starts, e.start_s)
            if i < len(starts) and starts[i] <= e.end_s + 1e-6:
                out.append(e)
    return out


def timeline_events(trace: Mapping[str, Any]) -> tuple[str, list[TraceEvent], list[TraceEvent]]:
    """(op source, op events, other events) of a trace_viewer@ JSON trace: the devices' "XLA Ops" lines where the
    trace has device op events (TPU, GPU), else the XLA op events of the CPU backend: every event of its tf_XLA*
    threads (runtime events left out, as :func:`read_profile` does) and, on other threads, the events that have
    XLA:CPU's "end: <op>" marker (a program XLA:CPU ran inline on the calling thread)."""
    events = trace.get("traceEvents", []) if isinstance(trace, Mapping) else []
    procs = {e.get("pid"): str(e.get("args", {}).get("name", "")) for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e.get("pid"), e.get("tid")): str(e.get("args", {}).get("name", "")) for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device: list[TraceEvent] = []
    cpu: list[TraceEvent] = []
    rest: list[TraceEvent] = []
    for e in events:
        if e.get("ph") != "X":
            continue
        ev = TraceEvent(name=str(e.get("name", "")), process=procs.get(e.get("pid"), ""),
                        thread=threads.get((e.get("pid"), e.get("tid")), ""),
                        start_s=float(e.get("ts") or 0.0) * 1e-6, duration_s=float(e.get("dur") or 0.0) * 1e-6)
        if "/device:" in ev.process and ev.thread == DEVICE_OPS_LINE:
            device.append(ev)
        elif ev.thread.startswith(XLA_THREAD_PREFIX) and not _is_runtime_event(ev.name):
            cpu.append(ev)
        else:
            rest.append(ev)
    by_line: dict[tuple[str, str], list[TraceEvent]] = {}
    for ev in rest:
        by_line.setdefault((ev.process, ev.thread), []).append(ev)
    inline = {id(ev) for line in by_line.values() for ev in _with_end_marker(line)}
    cpu += [ev for ev in rest if id(ev) in inline]
    rest = [ev for ev in rest if id(ev) not in inline]
    if device:
        source, chosen = f"xprof trace_viewer@: the devices' {DEVICE_OPS_LINE!r} lines", device
        rest += cpu
    else:
        source, chosen = (f"xprof trace_viewer@: XLA:CPU op events (threads {XLA_THREAD_PREFIX}*, and ops run "
                          "inline on the calling thread)", cpu)
    lines: dict[tuple[str, str], list[TraceEvent]] = {}
    for ev in chosen:
        lines.setdefault((ev.process, ev.thread), []).append(ev)
    ops = [ev for line in lines.values() for ev in _top_level(line)]
    return source, sorted(ops, key=lambda e: e.start_s), sorted(rest, key=lambda e: e.start_s)


def read_timeline(path: str | os.PathLike) -> Timeline:
    """The op events (with start and duration) and the other events of the profile at ``path``, from xprof's
    trace_viewer@ converter (newest run, as :func:`read_profile`); ToolFailure when the converter has no trace."""
    xplanes = find_xplanes(path)
    with _linked(xplanes) as links:
        raw = _tool(links, "trace_viewer@")
    if not raw:
        raise ToolFailure(f"xprof's trace_viewer@ converter has no trace for {short(path)}")
    source, ops, rest = timeline_events(json.loads(raw))
    return Timeline(path=str(path), op_source=source, ops=tuple(ops), host=tuple(rest))
