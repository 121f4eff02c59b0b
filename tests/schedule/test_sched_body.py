"""Work counting in kernel bodies: MXU padding, VPU / EUP ops, per-step predicates and loops.

Small hand-written kernels whose counts are worked out by hand.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl

from perfmodel.schedule.analyze import analyze

STEPS = 3


def _run(body, x_shape, w_shape, chip="tpu-v5e", dtype=jnp.bfloat16):
    """pallas_call over STEPS steps of (x block, w) -> f32 output block; returns the KernelAnalysis."""
    x = jax.ShapeDtypeStruct((STEPS * x_shape[0], x_shape[1]), dtype)
    w = jax.ShapeDtypeStruct(w_shape, dtype)
    out = jax.ShapeDtypeStruct((STEPS * x_shape[0], w_shape[1]), jnp.float32)
    call = pl.pallas_call(
        body, grid=(STEPS,),
        in_specs=[pl.BlockSpec(x_shape, lambda i: (i, 0)), pl.BlockSpec(w_shape, lambda i: (0, 0))],
        out_specs=pl.BlockSpec((x_shape[0], w_shape[1]), lambda i: (i, 0)), out_shape=out)
    return analyze(call, x, w, chip=chip).kernels[0]


def _dot_exp(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32) + jnp.exp(
        x_ref[...].astype(jnp.float32))[:, : o_ref.shape[1]]


@pytest.mark.parametrize("chip,mxu", [("tpu-v5e", 128), ("tpu-v6e", 256)])
def test_dot_pads_k_and_n_to_the_mxu_and_m_to_the_sublanes(chip, mxu):
    # x (12, 64) @ w (64, 64): useful 2*12*64*64; issued pads M 12 -> 16 (sublanes of 8), K and N 64 -> mxu.
    kern = _run(_dot_exp, (12, 64), (64, 64), chip=chip)
    assert kern.work.mxu_useful_flops == STEPS * 2 * 12 * 64 * 64
    assert kern.work.mxu_issued_flops == STEPS * 2 * 16 * mxu * mxu
    assert kern.work.dot_generals == 1


def test_transcendentals_and_vector_ops_per_element():
    # Per step: exp over the (12, 64) x block -> 768 EUP ops. VPU: convert bf16->f32 of 768, the add of
    # two (12, 64) f32 -> 768; the slice is layout only. 3 steps.
    kern = _run(_dot_exp, (12, 64), (64, 64))
    assert kern.work.eup_ops == STEPS * 12 * 64
    assert kern.work.vpu_ops == STEPS * (12 * 64 + 12 * 64)


def _when_first(x_ref, w_ref, o_ref):
    o_ref[...] = jnp.zeros_like(o_ref)

    @pl.when(pl.program_id(0) == 0)
    def _():
        o_ref[...] = jnp.exp(x_ref[...].astype(jnp.float32))[:, : o_ref.shape[1]]


def test_pl_when_on_program_id_counts_only_the_steps_that_run():
    # exp of a (16, 128) block runs at step 0 only: 2048 EUP ops in total, not 3 * 2048.
    kern = _run(_when_first, (16, 128), (128, 128))
    assert kern.work.eup_ops == 16 * 128


def _loop3(x_ref, w_ref, o_ref):
    def body(t, acc):
        return acc + jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    o_ref[...] = jax.lax.fori_loop(0, 3, body, jnp.zeros(o_ref.shape, jnp.float32))


def test_loops_multiply_their_body_by_the_trip_count():
    # 3 dots of (16, 128) x (128, 128) per step: 3 * 2*16*128*128 useful FLOPs per step.
    kern = _run(_loop3, (16, 128), (128, 128))
    assert kern.work.mxu_useful_flops == STEPS * 3 * 2 * 16 * 128 * 128
    assert kern.work.dot_generals == 1  # one equation, counted per iteration


def _row_sum(x_ref, w_ref, o_ref):
    s = jnp.sum(x_ref[...].astype(jnp.float32), axis=1, keepdims=True)
    o_ref[...] = jnp.broadcast_to(s, o_ref.shape)


def test_reductions_count_their_input_elements():
    # Per step: convert (16, 128) -> 2048 VPU; reduce_sum over 2048 inputs -> 2048 VPU; broadcast free.
    kern = _run(_row_sum, (16, 128), (128, 128))
    assert kern.work.vpu_ops == STEPS * (2048 + 2048)
    assert kern.work.eup_ops == 0
    assert kern.work.dot_generals == 0


@pytest.mark.parametrize("chip", ["tpu-v5e", "tpu-7x"])
@pytest.mark.parametrize("precision, passes", [
    (None, 1), (jax.lax.Precision.DEFAULT, 1), (jax.lax.Precision.HIGH, 3), (jax.lax.Precision.HIGHEST, 6),
    ((jax.lax.Precision.DEFAULT, jax.lax.Precision.HIGHEST), 6),  # the higher of the pair
    (jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X3, 3), (jax.lax.DotAlgorithmPreset.BF16_BF16_F32_X6, 6),
])
def test_f32_dots_cost_the_bf16_passes_of_their_precision(chip, precision, passes):
    # x (128, 128) @ w (128, 128) f32 per step: useful 2*128^3; issued = useful x passes, and on 7x (256-wide MXU)
    # K and N pad 128 -> 256: 4x more issued.
    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32, precision=precision)

    kern = _run(body, (128, 128), (128, 128), chip=chip, dtype=jnp.float32)
    assert kern.work.mxu_useful_flops == STEPS * 2 * 128**3
    assert kern.work.mxu_issued_flops == STEPS * 2 * 128**3 * passes * (1 if chip == "tpu-v5e" else 4)


def test_default_matmul_precision_config_applies_to_dots_without_one():
    def body(x_ref, w_ref, o_ref):
        o_ref[...] = jnp.dot(x_ref[...], w_ref[...], preferred_element_type=jnp.float32)

    with jax.default_matmul_precision("float32"):
        kern = _run(body, (128, 128), (128, 128), dtype=jnp.float32)
    assert kern.work.mxu_issued_flops == STEPS * 2 * 128**3 * 6
