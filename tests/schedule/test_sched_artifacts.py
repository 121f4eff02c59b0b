"""Lowering for TPU (Mosaic MLIR out of the StableHLO) and XLA's cost analysis next to the models."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.tpu import matmul as jmm

from perfmodel.schedule.artifacts import DISAGREEMENT, CostCount, compare_costs, lower_for_tpu, xla_cost


@pytest.fixture(scope="module")
def lowered():
    x = jax.ShapeDtypeStruct((256, 256), jnp.bfloat16)
    return lower_for_tpu(lambda a, b: jmm.matmul(a, b, block_shape=(128, 128), block_k=128), x, x)


def test_stablehlo_holds_the_mosaic_custom_call(lowered):
    assert "tpu_custom_call" in lowered.stablehlo
    assert len(lowered.kernels) == 1


def test_mosaic_mlir_is_decoded_from_the_custom_call(lowered):
    k = lowered.kernels[0]
    assert k.name == "matmul_kernel"
    assert "tpu.matmul" in k.mlir
    assert "memref<128x128xbf16, #tpu.memory_space<vmem>>" in k.mlir
    assert k.body_bytes > 0


def test_elided_stablehlo_drops_the_base64_body(lowered):
    text = lowered.stablehlo_elided()
    assert "<Mosaic body:" in text
    assert len(text) < len(lowered.stablehlo)


def test_xla_cost_of_a_plain_matmul():
    # jnp.matmul of [64, 128] x [128, 32] bf16: 2*64*128*32 FLOPs before optimization; bytes = the three arrays.
    a = jax.ShapeDtypeStruct((64, 128), jnp.bfloat16)
    b = jax.ShapeDtypeStruct((128, 32), jnp.bfloat16)
    compiled, unoptimized = xla_cost(jnp.matmul, a, b)
    assert unoptimized.flops == 2 * 64 * 128 * 32
    assert unoptimized.hbm_bytes == (64 * 128 + 128 * 32 + 64 * 32) * 2
    assert compiled.flops >= 2 * 64 * 128 * 32
    assert unoptimized.transcendentals == 0


def test_disagreements_over_five_percent_are_flagged():
    xla = CostCount(source="xla", flops=100.0, transcendentals=0.0, hbm_bytes=1000.0)
    close = CostCount(source="close", flops=104.0, transcendentals=0.0, hbm_bytes=1000.0)
    far = CostCount(source="far", flops=100.0, transcendentals=0.0, hbm_bytes=900.0)
    cmp = compare_costs(xla, [close, far])
    assert DISAGREEMENT == 0.05
    assert cmp.disagreements == (("far", "hbm_bytes", pytest.approx(-0.1)),)
    assert [r.source for r in cmp.rows] == ["xla", "close", "far"]
