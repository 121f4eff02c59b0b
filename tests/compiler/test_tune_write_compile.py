"""`tune --write --compile N`: stored defaults chosen by the compiler-backed time among candidates Mosaic accepts."""

import dataclasses
import json

import pytest

from kernels.spec import TunedConfig
from perfmodel.schedule.catalog import get_tuned_kernel
from perfmodel.schedule.tuned import write_tuned_defaults

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]


def test_write_with_compile_stores_the_compilers_figures(tmp_path):
    # A small rms_norm problem on one chip: two candidates compiled (two deviceless compiles, cached after).
    small = TunedConfig(key="bf16", shapes=("x=1024x1024:bf16", "residual=1024x1024:bf16", "weight=1024:f32"))
    spec = dataclasses.replace(get_tuned_kernel("rms_norm"), configs=(small,))
    path = write_tuned_defaults(spec, tmp_path / "rms_norm.json", chips=["tpu-v5e", "tpu-v3"], compile_top=2)
    data = json.loads(path.read_text())
    assert data["compiler"]["compile_top"] == 2 and data["compiler"]["libtpu"]
    assert "--compile 2" in data["about"]
    v5e = data["defaults"]["tpu-v5e"]["bf16"]
    assert v5e["candidates_compiled"] == 2 and v5e["compiled_s"] > 0
    assert 0 < v5e["vmem_allocated_bytes"] <= 16 << 20  # within v5e's default scoped limit
    # v3 has no deviceless target: the schedule model's choice, without compiler figures
    assert "compiled_s" not in data["defaults"]["tpu-v3"]["bf16"]
