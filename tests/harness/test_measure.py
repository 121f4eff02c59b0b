"""`perfmodel.harness.measure` on the CPU: interpret mode, predictions, chip choice, crash safety, published data.

Kernels run in Pallas TPU interpret mode at tiny shapes with 1-2 repeats; no
timing is asserted, only what the record says about it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest
import yaml

from perfmodel.errors import InputError
from perfmodel.harness.measure import (
    Backend,
    Case,
    MeasurementError,
    block_sets,
    choose_chip,
    run_cases,
)
from perfmodel.harness.records import INTERPRET_LABEL, read_records, to_json
from perfmodel.harness.sources import published_records
from perfmodel.schedule.catalog import get_entry

V5E_HBM_BYTES_PER_S = 819e9
ITEMSIZE = {"bf16": 2, "f32": 4}
YAML = os.path.join(os.path.dirname(__file__), "..", "..", "perfmodel", "data", "validation", "tpu_v5e_matmul.yaml")


def _rms_shapes(tokens: int, hidden: int, dtype: str) -> tuple[str, ...]:
    return (f"x={tokens}x{hidden}:{dtype}", f"residual={tokens}x{hidden}:{dtype}", f"weight={hidden}:f32")


@pytest.mark.parametrize("dtype", ["bf16", "f32"])
@pytest.mark.parametrize("tokens, hidden", [(16, 256), (50, 200)], ids=["aligned", "unaligned"])
def test_rms_norm_on_cpu_is_an_interpret_mode_record_without_efficiency(tmp_path, dtype, tokens, hidden):
    out = tmp_path / "r.jsonl"
    [r] = run_cases([Case(kernel="rms_norm", shapes=_rms_shapes(tokens, hidden, dtype))], hw="v5e", warmup=1,
                    repeat=2, out=out)
    assert (r.backend, r.device_kind, r.mode, r.device_chip) == ("cpu", "cpu", "interpret", None)
    assert r.efficiency is None and not r.is_real
    assert any(n.startswith(INTERPRET_LABEL) for n in r.notes)
    assert r.timing.repeats == 2 and len(r.timing.times_s) == 2 and r.timing.warmup == 1
    assert r.timing.min_s <= r.timing.measured_s <= r.timing.max_s
    assert [a.text for a in r.arrays] == [s.replace("bf16", "bfloat16").replace("f32", "float32") + "=random"
                                          for s in _rms_shapes(tokens, hidden, dtype)]
    # Floor on v5e, HBM-bound: read x and residual, write out and the new residual (4 x tokens x hidden x
    # itemsize) plus the f32 weight (hidden x 4 B), each once, at 819 GB/s.
    nbytes = 4 * tokens * hidden * ITEMSIZE[dtype] + 4 * hidden
    assert r.prediction.chip == "tpu-v5e" and r.prediction.op_floor_limiter == "hbm"
    assert r.prediction.ideal_hbm_bytes == nbytes
    assert r.prediction.op_floor_s == pytest.approx(nbytes / V5E_HBM_BYTES_PER_S, rel=1e-9)
    assert r.prediction.expected_s >= r.prediction.op_floor_s
    assert [to_json(x) for x in read_records(out).records] == [to_json(r)]


def test_matmul_block_sweep_writes_one_record_per_block_set(tmp_path):
    out = tmp_path / "r.jsonl"
    entry = get_entry("matmul")
    sets = block_sets(entry, {"bm": [16], "bk": [256], "bn": [128, 384]})
    records = run_cases([Case(kernel="matmul", shapes=("x=40x256:bf16", "w=256x384:bf16"), blocks=b) for b in sets],
                        hw="v5e", warmup=1, repeat=1, out=out)
    assert [r.blocks for r in records] == [{"bm": 16, "bk": 256, "bn": 128}, {"bm": 16, "bk": 256, "bn": 384}]
    # grid (ceil(40/16), 384/bn, 256/256); the w block is bk x bn
    assert [r.prediction.grid for r in records] == [(3, 3, 1), (3, 1, 1)]
    assert [r.prediction.operand_blocks["w_ref"] for r in records] == [(256, 128), (256, 384)]
    # Each byte once: x 40x256 + w 256x384 + out 40x384, bf16 = 2 x (10240 + 98304 + 15360) = 247808 B
    # -> 302.6 ns at 819 GB/s, above the MXU time (2 x 40 x 256 x 384 / 197 TFLOP/s = 40 ns): HBM-bound.
    for r in records:
        assert r.mode == "interpret" and r.efficiency is None
        assert r.prediction.op_floor_s == pytest.approx(247808 / V5E_HBM_BYTES_PER_S, rel=1e-9)
    assert len(read_records(out).records) == 2


def test_a_kernel_failing_mid_run_leaves_every_finished_record(tmp_path, monkeypatch):
    import kernels.rms_norm as rms

    real, calls = rms.rms_norm, []

    def flaky(*args, **kwargs):
        # Third block set: traced once for the prediction, then again by jit for the timed run -> fail there.
        if kwargs["block_sizes"].block_tokens == 48:
            calls.append(1)
            if len(calls) == 2:
                raise RuntimeError("simulated kernel failure")
        return real(*args, **kwargs)

    monkeypatch.setattr(rms, "rms_norm", flaky)
    out = tmp_path / "r.jsonl"
    cases = [Case(kernel="rms_norm", shapes=_rms_shapes(96, 128, "bf16"), blocks={"block_tokens": b})
             for b in (16, 32, 48)]
    with pytest.raises(MeasurementError, match=rf"^rms_norm case 3 of 3 \(blocks block_tokens=48\) failed: "
                                               rf"RuntimeError: simulated kernel failure; 2 finished record\(s\) "
                                               rf"are in {out}$"):
        run_cases(cases, hw="v5e", warmup=1, repeat=1, out=out)
    lines = out.read_bytes().split(b"\n")
    assert lines[-1] == b"" and len(lines) == 3  # two whole lines, nothing after the last newline
    assert [json.loads(line)["blocks"] for line in lines[:2]] == [{"block_tokens": 16}, {"block_tokens": 32}]


def test_a_killed_process_leaves_every_finished_record(tmp_path):
    """SIGKILL in the middle of the third measurement: no Python clean-up runs, yet both finished records are
    on disk, whole."""
    out = tmp_path / "r.jsonl"
    script = textwrap.dedent(f"""
        import os, signal
        import kernels.rms_norm as rms
        from perfmodel.harness.measure import Case, run_cases
        real, calls = rms.rms_norm, []
        def killer(*args, **kwargs):
            if kwargs["block_sizes"].block_tokens == 48:
                calls.append(1)
                if len(calls) == 2:  # traced for timing, after the third case's prediction
                    os.kill(os.getpid(), signal.SIGKILL)
            return real(*args, **kwargs)
        rms.rms_norm = killer
        cases = [Case(kernel="rms_norm", shapes=("x=96x128:bf16", "residual=96x128:bf16", "weight=128:f32"),
                      blocks={{"block_tokens": b}}) for b in (16, 32, 48)]
        run_cases(cases, hw="v5e", warmup=1, repeat=1, out={str(out)!r})
    """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    loaded = read_records(out)
    assert loaded.warnings == ()
    assert [r.blocks for r in loaded.records] == [{"block_tokens": 16}, {"block_tokens": 32}]


@pytest.fixture
def fake_tpu(monkeypatch):
    """A TPU v5e backend with a fake clock: the compiled-mode bookkeeping without a TPU (nothing is compiled).

    Timed repeats read 1.0, 1.2 and 1.1 ms (median 1.1 ms); a trivial jitted call 20 us.
    """
    import perfmodel.harness.measure as m

    monkeypatch.setattr(m, "current_backend", lambda: Backend(name="tpu", device_kind="TPU v5 lite", jax_version="x"))
    monkeypatch.setattr(m, "dispatch_round_trip", lambda **_: 20e-6)
    monkeypatch.setattr(m, "time_calls", lambda fn, args, *, warmup, repeat: [1.0e-3, 1.2e-3, 1.1e-3][:repeat])


@pytest.mark.parametrize("hw, device_chip_is_predicted", [(None, True), ("v5e", True), ("v6e", False)])
def test_compiled_mode_record_on_a_tpu(fake_tpu, tmp_path, hw, device_chip_is_predicted):
    out = tmp_path / "r.jsonl"
    [r] = run_cases([Case(kernel="rms_norm", shapes=_rms_shapes(16, 256, "bf16"))], hw=hw, repeat=3, out=out)
    assert (r.backend, r.device_kind, r.mode, r.device_chip) == ("tpu", "TPU v5 lite", "compiled", "tpu-v5e")
    assert r.is_real and not any(n.startswith(INTERPRET_LABEL) for n in r.notes)
    t = r.timing
    assert (t.statistic, t.measured_s, t.min_s, t.max_s) == ("median", 1.1e-3, 1.0e-3, 1.2e-3)
    assert t.iqr_s == pytest.approx(1.15e-3 - 1.05e-3)  # numpy's linear percentiles of (1.0, 1.1, 1.2) ms
    assert t.includes_dispatch and t.dispatch_s == 20e-6 and r.device_time_s == pytest.approx(1.08e-3)
    if device_chip_is_predicted:
        # 33792 B / 819 GB/s = 41.3 ns floor over 1.1 ms measured
        assert r.efficiency == pytest.approx(33792 / 819e9 / 1.1e-3)
    else:
        assert r.prediction.chip == "tpu-v6e" and r.efficiency is None
        assert r.notes[0] == "predictions are for tpu-v6e but the device is tpu-v5e: efficiency left null"
    # a 41 ns kernel against a 20 us round trip: a single-call timing is mostly dispatch
    assert r.prediction.dispatch_dominated
    assert read_records(out).records == (r,)


def test_interpret_mode_needs_explicit_shapes():
    with pytest.raises(InputError, match=r"^`shapes`: the cpu backend runs the kernel in interpret mode"):
        run_cases([Case(kernel="matmul", shapes=())], hw="v5e")


def test_kernel_argument_errors_become_one_line_input_errors():
    with pytest.raises(InputError, match=r"^tracing rms_norm failed: weight: expected shape \(256,\), got \(128,\)$"):
        run_cases([Case(kernel="rms_norm", shapes=("x=16x256:bf16", "residual=16x256:bf16", "weight=128:f32"))],
                  hw="v5e", repeat=1)


@pytest.mark.parametrize("sweep, message", [
    ({"bq": [128]}, r"^`blocks`: bq not a block field of matmul; fields: bm, bk, bn"),
    ({"bm": [128]}, r"^`blocks`: give every block field of matmul together; missing bk, bn"),
])
def test_block_sweep_errors(sweep, message):
    with pytest.raises(InputError, match=message):
        block_sets(get_entry("matmul"), sweep)


def test_block_sweep_is_a_cross_product_in_the_order_given():
    sets = block_sets(get_entry("matmul"), {"bm": [16, 32], "bk": [128], "bn": [128, 256]})
    assert sets == [{"bm": 16, "bk": 128, "bn": 128}, {"bm": 16, "bk": 128, "bn": 256},
                    {"bm": 32, "bk": 128, "bn": 128}, {"bm": 32, "bk": 128, "bn": 256}]
    assert block_sets(get_entry("matmul"), None) == [None]


# ----- which chip the predictions are for


@pytest.mark.parametrize("backend, device_kind, message", [
    ("cpu", "cpu", r"^`hw`: the cpu device 'cpu' is not a TPU perfmodel knows; give `hw` CHIP"),
    ("gpu", "NVIDIA H200", r"^`hw`: the gpu device 'NVIDIA H200' \(h200-sxm, not a TPU\) is not a TPU"),
])
def test_without_hw_a_non_tpu_device_asks_for_hw(backend, device_kind, message):
    with pytest.raises(InputError, match=message):
        choose_chip(None, Backend(name=backend, device_kind=device_kind, jax_version="0"))


def test_on_a_tpu_the_device_kind_picks_the_chip():
    choice = choose_chip(None, Backend(name="tpu", device_kind="TPU v5 lite", jax_version="0"))
    assert choice.chip.name == "tpu-v5e" and choice.device_chip == "tpu-v5e" and choice.notes == ()


def test_hw_for_another_chip_than_the_tpu_is_noted():
    choice = choose_chip("v6e", Backend(name="tpu", device_kind="TPU v5 lite", jax_version="0"))
    assert choice.chip.name == "tpu-v6e" and choice.device_chip == "tpu-v5e"
    assert choice.notes == ("predictions are for tpu-v6e but the device is tpu-v5e: efficiency left null",)


def test_hw_must_be_a_tpu():
    with pytest.raises(InputError, match=r"^--hw: h100-sxm is not a TPU"):
        choose_chip("h100-sxm", Backend(name="cpu", device_kind="cpu", jax_version="0"))


# ----- published measurements


def test_published_v5e_matmul_points_become_real_tpu_records():
    loaded = published_records(YAML)
    points = yaml.safe_load(open(YAML))["points"]
    assert len(loaded.items) == len(points) == 9
    text = open(YAML).read().splitlines()
    for item, point in zip(loaded.items, points):
        r = item.record
        line = int(item.where.rsplit(":", 1)[1])
        assert f"measured_ms: {point['measured_ms']}" in text[line - 1]  # file:line points at the point
        assert (r.backend, r.device_kind, r.mode, r.device_chip) == ("tpu", "TPU v5 lite", "compiled", "tpu-v5e")
        assert r.timing.statistic == "mean" and r.timing.includes_dispatch and r.timing.repeats == 100
        assert r.timing.measured_s == pytest.approx(point["measured_ms"] * 1e-3)
        # The guide's own utilization (2 M N K / measured / 197 TFLOP/s) is our efficiency (op floor / measured).
        assert r.efficiency == pytest.approx(point["util_pct_of_peak"] / 100, rel=2e-3)
        assert r.prediction.dispatch_dominated == (point["m"] == 1024)
        assert r.prediction.expected_source == ("schedule model" if point["kernel"] == "pallas" else "op model")
    by_blocks = {(i.record.kernel, i.record.blocks_text): i.record.prediction.limiting_unit for i in loaded.items}
    assert by_blocks[("jax-matmul", "bm=128,bk=128,bn=128")] == "overhead"
    assert by_blocks[("jax-matmul", "bm=512,bk=1024,bn=1024")] == "mxu"
    assert by_blocks[("xla-matmul", "default")] == "mxu"


def test_published_file_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("chip: tpu-v5e\npoints:\n  - {kernel: pallas, m: 1024, n: 1024, k: 1024, measured_ms: 1}\n"
                   "  - {kernel: cuda, m: 1024, n: 1024, k: 1024, measured_ms: 1}\n")
    with pytest.raises(InputError, match=rf"^{bad}:3: a pallas point needs bm, bk and bn"):
        published_records(bad)
    bad.write_text("chip: tpu-v5e\npoints:\n  - {kernel: cuda, m: 1024, n: 1024, k: 1024, measured_ms: 1}\n")
    with pytest.raises(InputError, match=rf"^{bad}:3: field 'kernel' is 'cuda'"):
        published_records(bad)
    bad.write_text("points: [\n")
    with pytest.raises(InputError, match=rf"^{bad}:2: not valid YAML"):
        published_records(bad)
