"""Hand-built records for the harness tests (no jax, no kernel runs).

TPU v5e figures used in the arithmetic of the tests: bf16 peak 197 TFLOP/s,
HBM 819 GB/s; the model's achievable factors are 0.92 (MXU) and 0.85 (HBM).
"""

from __future__ import annotations

import pytest

from perfmodel.harness.records import ArraySpec, CallPrediction, Record, Timing

V5E_BF16_FLOPS_PER_S = 197e12
V5E_HBM_BYTES_PER_S = 819e9
DISPATCH_S = 20e-6


def build_record(*, kernel: str = "matmul", unit: str = "mxu", expected_s: float, device_s: float,
                floor_s: float | None = None, mode: str = "compiled", chip: str = "tpu-v5e",
                device_chip: str | None = "tpu-v5e", dispatch_s: float | None = DISPATCH_S,
                dispatch_dominated: bool = False, useful_flops: float | None = None,
                ideal_hbm_bytes: float = 1e6) -> Record:
    """A record whose timing is device_s + dispatch_s (dispatch included), predicted as given."""
    factor = {"mxu": 0.92, "hbm": 0.85}.get(unit)
    floor = floor_s if floor_s is not None else expected_s * (factor or 1.0)
    flops = useful_flops if useful_flops is not None else (floor * V5E_BF16_FLOPS_PER_S if unit == "mxu" else 0.0)
    measured = device_s + (dispatch_s or 0.0)
    pred = CallPrediction(chip=chip, op_floor_s=floor, op_floor_limiter=unit if unit != "overhead" else "mxu",
                      expected_s=expected_s, expected_source="schedule model",
                      schedule_limiter={"mxu": "compute", "hbm": "dma"}.get(unit, "overhead"), limiting_unit=unit,
                      model_factor=factor, useful_flops=flops, mxu_dtype="bf16", ideal_hbm_bytes=ideal_hbm_bytes,
                      dispatch_dominated=dispatch_dominated)
    timing = Timing(statistic="median", measured_s=measured, min_s=measured, max_s=measured, iqr_s=0.0,
                    times_s=(measured,), repeats=1, warmup=1, includes_dispatch=True,
                    dispatch_s=dispatch_s if mode == "compiled" else None)
    eff = floor / measured if mode == "compiled" and device_chip == chip else None
    return Record(kernel=kernel, arrays=(ArraySpec(name="x", shape=(256, 256), dtype="bfloat16", fill="random"),),
                  backend="tpu" if mode == "compiled" else "cpu",
                  device_kind="TPU v5 lite" if mode == "compiled" else "cpu",
                  device_chip=device_chip if mode == "compiled" else None, mode=mode, jax_version="0.10.2",
                  timestamp="2025-01-01T00:00:00+00:00", source="test", timing=timing, prediction=pred,
                  efficiency=eff)


@pytest.fixture
def make_record():
    """The record builder (tests cannot import conftest under --import-mode=importlib)."""
    return build_record


@pytest.fixture
def synthetic_records() -> list[Record]:
    """Nine records; the implied factor of each usable one is model factor x expected / device time:

    MXU (factor 0.92): 0.92 x 1.0 / 1.1 = 0.8364; 0.92 x 2.0 / 2.0 = 0.92; 0.92 x 4.0 / 3.68 = 1.0
      -> median 0.92 over 3 points.
    HBM (factor 0.85): 0.85 x 1.0 / 1.25 = 0.68; 0.85 x 2.0 / 2.0 = 0.85 -> median (0.68 + 0.85) / 2 = 0.765.
    Left out: an overhead-limited point, a dispatch-dominated one, one predicted for tpu-v6e, and one
    interpret-mode record.
    """
    ms = 1e-3
    return [
        build_record(unit="mxu", expected_s=1.0 * ms, device_s=1.1 * ms),
        build_record(unit="mxu", expected_s=2.0 * ms, device_s=2.0 * ms),
        build_record(unit="mxu", expected_s=4.0 * ms, device_s=3.68 * ms),
        build_record(kernel="rms_norm", unit="hbm", expected_s=1.0 * ms, device_s=1.25 * ms),
        build_record(kernel="rms_norm", unit="hbm", expected_s=2.0 * ms, device_s=2.0 * ms),
        build_record(unit="overhead", expected_s=1.0 * ms, device_s=1.0 * ms),
        build_record(unit="mxu", expected_s=0.01 * ms, device_s=0.01 * ms, dispatch_dominated=True),
        build_record(unit="mxu", chip="tpu-v6e", expected_s=1.0 * ms, device_s=1.0 * ms),
        build_record(unit="mxu", mode="interpret", expected_s=1.0 * ms, device_s=50 * ms),
    ]
