"""`perfmodel measure`'s device timer on the CPU backend: a real jax.profiler trace of the timed calls, read with
xprof's converters (the CPU backend's XLA op events), per call device span, kernel events, wall clock and host
dispatch; the CLI's --timer and its error paths.

No timing is asserted against a number: only the orderings every trace must satisfy (kernel events <= device span
<= wall clock of the same call) and what the records say about their timers.
"""

from __future__ import annotations

import json
import sys

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.errors import InputError
from perfmodel.harness.measure import (
    CALL_MARK,
    DeviceTimerError,
    covered_s,
    device_timing,
    device_times,
    per_call_times,
)
from perfmodel.harness.profile_timeline import Timeline, TraceEvent, timeline_events
from perfmodel.harness.records import (
    DISPATCH_TIMER,
    KERNEL_TIMER,
    SPAN_TIMER,
    WALL_TIMER,
    from_json,
    read_records,
    to_json,
)

REPEAT = 3
#: Float slack for orderings of sums of trace durations (the trace rounds to 1 ns).
EPS_S = 1e-8
RMS = ["rms_norm", "--hw", "v5e", "--shape", "x=16x256:bf16", "--shape", "residual=16x256:bf16",
       "--shape", "weight=256:f32"]


@pytest.fixture(scope="module")
def traced():
    """A jitted matmul + elementwise epilogue timed by the device timer: 1 warm-up, REPEAT traced calls."""
    import jax
    import jax.numpy as jnp

    fn = jax.jit(lambda x, w: jnp.tanh(x @ w) * 2.0 + 1.0)
    x = jnp.full((256, 512), 0.5, jnp.float32)
    w = jnp.full((512, 128), 0.25, jnp.float32)
    return device_times(fn, (x, w), warmup=1, repeat=REPEAT)


def test_cpu_device_span_kernel_events_and_dispatch_per_call(traced):
    d = traced
    assert len(d.span_times_s) == len(d.kernel_times_s) == len(d.wall_times_s) == len(d.dispatch_times_s) == REPEAT
    assert "XLA:CPU op events" in d.events
    # no custom call in the module: every XLA op of the call is the kernel's
    assert d.kernel_ops == () and d.kernel_match.startswith("every XLA op")
    assert all(n >= 1 for n in d.ops_per_call)
    for span, kernel, wall, dispatch in zip(d.span_times_s, d.kernel_times_s, d.wall_times_s, d.dispatch_times_s):
        assert span > 0
        assert kernel <= span + EPS_S
        assert span <= wall
        assert dispatch == pytest.approx(wall - span)
    assert (d.span_timer, d.kernel_timer, d.wall_timer, d.dispatch_timer) == (SPAN_TIMER, KERNEL_TIMER,
                                                                             WALL_TIMER, DISPATCH_TIMER)


def test_device_timing_is_the_span_with_dispatch_apart(traced):
    t = device_timing(traced, warmup=1)
    assert t.timer == SPAN_TIMER and t.device_trace == traced
    assert t.times_s == traced.span_times_s and t.measured_s == traced.span_s
    assert t.min_s <= t.measured_s <= t.max_s
    assert not t.includes_dispatch and t.dispatch_s == traced.dispatch_s
    assert t.dispatch_source.startswith(DISPATCH_TIMER)


@pytest.fixture(scope="module")
def cli_device(tmp_path_factory):
    """`perfmodel measure rms_norm --timer device --out ... --json` on the CPU backend (interpret mode)."""
    path = tmp_path_factory.mktemp("device") / "r.jsonl"
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "2", "--timer", "device", "--out", str(path),
                                    "--json"])
    assert res.exit_code == 0, res.output
    return path, json.loads(res.output)


def test_cli_timer_device_writes_the_timer_fields(cli_device):
    path, [rec] = cli_device
    t = rec["timing"]
    assert t["timer"] == SPAN_TIMER and t["includes_dispatch"] is False
    d = t["device_trace"]
    assert (d["span_timer"], d["kernel_timer"], d["wall_timer"], d["dispatch_timer"]) == (
        SPAN_TIMER, KERNEL_TIMER, WALL_TIMER, DISPATCH_TIMER)
    assert t["times_s"] == d["span_times_s"] and t["measured_s"] == d["span_s"] and t["dispatch_s"] == d["dispatch_s"]
    for span, kernel, wall in zip(d["span_times_s"], d["kernel_times_s"], d["wall_times_s"]):
        assert 0 < span <= wall and kernel <= span + EPS_S
    assert rec["mode"] == "interpret" and rec["efficiency"] is None
    assert any("device timer on the cpu backend" in n for n in rec["notes"])
    # the file holds the same record, and it reads back with its device trace
    [back] = read_records(path).records
    assert to_json(back) == rec and back.timing.device_trace.span_times_s == tuple(d["span_times_s"])


def test_cli_timer_device_text_names_the_timers():
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "1", "--timer", "device"])
    assert res.exit_code == 0, res.output
    assert "interpret-mode xprof device span on the host (not TPU performance): median" in res.output
    assert "xprof kernel events" in res.output and "host dispatch (wall clock - xprof device span)" in res.output
    assert "wall clock" in res.output and "cross-check" in res.output


def test_cli_timer_wall_keeps_the_wall_clock_record():
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "1", "--timer", "wall", "--json"])
    assert res.exit_code == 0, res.output
    [rec] = json.loads(res.output)
    assert rec["timing"]["timer"] == WALL_TIMER and rec["timing"]["device_trace"] is None
    assert rec["timing"]["includes_dispatch"] is True


@pytest.fixture
def busy_profiler(tmp_path):
    """Another jax.profiler trace running in the process: the device timer cannot start its own."""
    import jax

    jax.profiler.start_trace(str(tmp_path / "other"))
    try:
        yield
    finally:
        jax.profiler.stop_trace()


def test_cli_timer_device_unreadable_is_a_one_line_error(busy_profiler):
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "1", "--timer", "device"])
    assert res.exit_code == 2, res.output
    err = res.output.strip()
    assert err.startswith("Error:") and "\n" not in err, err
    assert "--timer device: jax.profiler.trace failed: Profile has already been started" in err
    assert err.endswith("give --timer wall")


def test_cli_default_timer_falls_back_to_wall_and_says_why(busy_profiler):
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "1", "--json"])
    assert res.exit_code == 0, res.output
    [rec] = json.loads(res.output)
    assert rec["timing"]["timer"] == WALL_TIMER and rec["timing"]["device_trace"] is None
    assert any(n.startswith("timer: wall clock (the device timer could not be used: `timer` device: "
                            "jax.profiler.trace failed") for n in rec["notes"])


def test_timer_device_without_xprof_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "xprof.convert.raw_to_tool_data", None)  # import raises ImportError
    res = CliRunner().invoke(main, ["measure", *RMS, "--repeat", "1", "--timer", "device"])
    assert res.exit_code == 2, res.output
    assert res.output.strip().startswith("Error: --timer device: xprof is not importable"), res.output


def test_timer_choice_is_checked():
    res = CliRunner().invoke(main, ["measure", *RMS, "--timer", "cycles"])
    assert res.exit_code == 2 and "cycles" in res.output


# --------------------------------------------------------------------------- the trace arithmetic (synthetic)


def _ev(name, start_us, dur_us, thread="XLA Ops", process="/device:TPU:0"):
    return TraceEvent(name=name, process=process, thread=thread, start_s=start_us * 1e-6, duration_s=dur_us * 1e-6)


def test_per_call_times_windows_kernel_match_and_errors():
    # two calls marked at t=0 and t=100 us; call 0 runs a copy then the kernel, call 1 the kernel only
    marks = (_ev(f"{CALL_MARK}0", 0, 90, "python", "/host:CPU"), _ev(f"{CALL_MARK}1", 100, 50, "python", "/host:CPU"))
    ops = (_ev("copy.1", 10, 5), _ev("my_kernel", 20, 30), _ev("my_kernel", 110, 20))
    tl = Timeline(path="t", op_source="test", ops=ops, host=marks)
    d = per_call_times(tl, [0.0001, 0.00004], kernels=frozenset({"my_kernel"}), kernel_match="custom call")
    assert d.span_times_s == pytest.approx((40e-6, 20e-6))
    assert d.kernel_times_s == pytest.approx((30e-6, 20e-6))
    assert d.dispatch_times_s == pytest.approx((60e-6, 20e-6))
    assert d.ops_per_call == (2, 1) and d.kernel_ops == ("my_kernel",)
    # a kernel no event matches: span kept, kernel time null and said why
    d = per_call_times(tl, [1e-4, 1e-4], kernels=frozenset({"other"}), kernel_match="custom call")
    assert d.kernel_s is None and d.kernel_times_s == () and "no op event of the trace matched other" in d.kernel_match
    with pytest.raises(DeviceTimerError, match="holds 2 of the 3 call marks"):
        per_call_times(tl, [1e-4] * 3, kernels=frozenset(), kernel_match="x")
    empty = Timeline(path="t", op_source="test", ops=ops[:2], host=marks)
    with pytest.raises(DeviceTimerError, match="no op event in call 2's window") as info:
        per_call_times(empty, [1e-4, 1e-4], kernels=frozenset(), kernel_match="x")
    assert isinstance(info.value, InputError)


def test_covered_counts_overlaps_once():
    assert covered_s([_ev("a", 0, 10), _ev("b", 5, 10, thread="Stream 2"), _ev("c", 20, 5)]) == pytest.approx(20e-6)
    assert covered_s([]) == 0.0


def test_timeline_events_device_lines_nesting_and_inline_cpu_ops():
    meta = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
            {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "XLA Ops"}},
            {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 7, "args": {"name": "python"}},
            {"ph": "M", "name": "thread_name", "pid": 2, "tid": 8, "args": {"name": "tf_XLAEigen/1"}}]
    x = lambda pid, tid, name, ts, dur: {"ph": "X", "pid": pid, "tid": tid, "name": name, "ts": ts, "dur": dur}  # noqa
    host = [x(2, 7, "PjitFunction(f)", 0, 50), x(2, 7, "fusion.1", 5, 10), x(2, 7, "end: fusion.1", 14, 0.1),
            x(2, 8, "dot.2", 20, 10), x(2, 8, "ThreadpoolListener::Region", 20, 12)]
    device = [x(1, 1, "while.1", 100, 50), x(1, 1, "body_op", 110, 10), x(1, 1, "custom-call.3", 160, 5)]
    # with device op lines: those, the op nested in the while left out
    source, ops, rest = timeline_events({"traceEvents": meta + host + device})
    assert "XLA Ops" in source and [o.name for o in ops] == ["while.1", "custom-call.3"]
    assert ops[0].start_s == pytest.approx(100e-6) and ops[0].duration_s == pytest.approx(50e-6)
    assert "PjitFunction(f)" in [e.name for e in rest]
    # the CPU backend: tf_XLA* ops, and an op XLA:CPU ran inline on the Python thread (it has an end marker)
    source, ops, rest = timeline_events({"traceEvents": meta + host})
    assert "XLA:CPU" in source and [o.name for o in ops] == ["fusion.1", "dot.2"]
    assert {"PjitFunction(f)", "end: fusion.1", "ThreadpoolListener::Region"} <= {e.name for e in rest}


def test_records_refuse_an_unknown_timer(make_record):
    obj = to_json(make_record(expected_s=1e-3, device_s=1e-3))
    assert from_json(obj, "r.jsonl:1").timing.timer == WALL_TIMER
    obj["timing"]["timer"] = "sundial"
    with pytest.raises(InputError, match="r.jsonl:1: field 'timing.timer' is 'sundial'"):
        from_json(obj, "r.jsonl:1")
