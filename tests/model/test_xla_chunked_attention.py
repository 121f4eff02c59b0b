"""XLA's chunked attention (tokamax's xla_chunked): the tile-cycle line, the loop's cost, the passes around it."""

import numpy as np
import pytest

from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.model import efficiency, xla_chunked_attention as chunked
from perfmodel.model.core import evaluate
from perfmodel.model.xla_chunked_attention import tile_cycles, xla_chunked_attention


@pytest.fixture(scope="module")
def core7x():
    return get_chip("tpu-7x/core")


def test_tile_cycles_hand_worked():
    # d = dv = 128, no bias, batch x heads 1024: 95.88 + 17.21 x 1 + 56.16 x 1 + 0 - 3.9 x log2(1024) = 130.25
    assert float(tile_cycles(head_dim=128, v_head_dim=128, bias_and_mask=False, batch_heads=1024)) == \
        pytest.approx(130.25)
    # AlphaFold's 768 x 768 x 4 heads x 64 with bias and mask: 95.88 + 17.21 / 2 + 56.16 / 2 + 36.91
    # - 3.9 x log2(3072) = 124.26
    assert float(tile_cycles(head_dim=64, v_head_dim=64, bias_and_mask=True, batch_heads=3072)) == \
        pytest.approx(95.88 + 8.605 + 28.08 + 36.91 - 3.9 * np.log2(3072))


@pytest.mark.parametrize("bh, same_as", [(1, 32), (8, 32), (1 << 20, 8192)])
def test_batch_heads_term_is_clamped_to_the_compiled_range(bh, same_as):
    def at(n):
        return float(tile_cycles(head_dim=128, v_head_dim=128, bias_and_mask=False, batch_heads=n))
    assert at(bh) == at(same_as)


def test_head_dims_flatten_past_the_cap():
    # 192 and 256 compile alike (179.9 and 179.3 bundles): the line caps both dims at 192
    a = tile_cycles(head_dim=256, v_head_dim=256, bias_and_mask=False, batch_heads=128)
    b = tile_cycles(head_dim=192, v_head_dim=192, bias_and_mask=False, batch_heads=128)
    assert float(a) == float(b)
    assert float(tile_cycles(head_dim=128, v_head_dim=128, bias_and_mask=False, batch_heads=128)) < float(b)


def test_loop_time_is_its_cycles_at_the_clock(core7x, rtol):
    # batch 1, 256 x 256, 32 heads (batch x heads 32: log2 = 5), d = 128: 95.88 + 17.21 + 56.16 - 19.5
    # = 149.75 cycles a tile; 2 x 2 chunk pairs x 32 (batch, head) tiles = 128 tiles = 19,168 cycles, at
    # tpu-7x/core's 1.9 GHz 10.09 us of issue (the VPU's time at peak)
    cost = xla_chunked_attention(batch=1, q_len=256, kv_len=256, q_heads=32, kv_heads=32, head_dim=128,
                                 chip=core7x)
    loop, outside = cost.parts
    assert cost.metrics["iterations"] == 4
    r = evaluate(loop, core7x)
    assert r.unit_s["vpu"] == pytest.approx(149.75 * 128 / 1.9e9, rel=rtol["time"])
    # at the VPU's achievable share (0.80): expected 10.09 / 0.8 us plus the launch
    assert r.expected_s == pytest.approx(149.75 * 128 / 1.9e9 / 0.8 + r.fixed_parts_s["launch"]
                                         + r.fixed_parts_s["dma_latency"], rel=1e-9)
    # the two dots' MXU work, K and N padded to 256: 2 x 128 rows x 256 x 256 each, per tile
    assert loop.mxu_flops == pytest.approx(128 * 2 * (2 * 128 * 256 * 256), rel=rtol["count"])
    assert loop.useful_flops == pytest.approx(2 * 32 * 256 * 256 * 256, rel=rtol["count"])


def test_gqa_repeats_k_and_v_before_the_loop(core7x):
    # 8 kv heads for 32 q heads: k and v ([1, 1024, 8, 128] bf16, 2 MiB each) read once and written 4x as large;
    # the output ([1, 1024, 32, 128] bf16, 8 MiB) written per chunk and re-laid (read and written again)
    kv, out = 2 * 1024 * 8 * 128 * 2, 1024 * 32 * 128 * 2
    gqa = xla_chunked_attention(batch=1, q_len=1024, kv_len=1024, q_heads=32, kv_heads=8, head_dim=128,
                                chip=core7x)
    mha = xla_chunked_attention(batch=1, q_len=1024, kv_len=1024, q_heads=32, kv_heads=32, head_dim=128,
                                chip=core7x)
    assert gqa.parts[1].hbm_read_bytes == kv + out and gqa.parts[1].hbm_write_bytes == 4 * kv + 2 * out
    assert mha.parts[1].hbm_read_bytes == out and mha.parts[1].hbm_write_bytes == 2 * out
    # the loop itself does the same work either way (k and v are repeated before it)
    assert gqa.parts[0].vpu_ops == mha.parts[0].vpu_ops


@pytest.mark.parametrize("dtype", ["bf16", "f16", "f32"])
@pytest.mark.parametrize("q_len, kv_len", [(128, 128), (300, 200), (4096, 4096)])
def test_bound_by_the_loop_and_ordered(core7x, dtype, q_len, kv_len):
    r = evaluate(xla_chunked_attention(batch=2, q_len=q_len, kv_len=kv_len, q_heads=16, kv_heads=16, head_dim=64,
                                       dtype=dtype, chip=core7x), core7x)
    assert r.floor_s <= r.expected_s <= r.no_overlap_s
    # unaligned lengths compute whole chunks: 300 x 200 is 3 x 2 chunk pairs
    assert r.cost.metrics["iterations"] == -(-q_len // 128) * -(-kv_len // 128)


def test_notes_say_where_it_is_a_guess(core7x):
    at7x = xla_chunked_attention(batch=1, q_len=512, kv_len=512, q_heads=8, kv_heads=8, head_dim=128, chip=core7x)
    assert not any("unmeasured" in n for n in at7x.notes)
    v5e = xla_chunked_attention(batch=1, q_len=512, kv_len=512, q_heads=8, kv_heads=8, head_dim=128,
                                chip=get_chip("tpu-v5e"))
    assert any("read on TPU7x" in n for n in v5e.notes)
    wide = xla_chunked_attention(batch=1, q_len=512, kv_len=512, q_heads=8, kv_heads=8, head_dim=128, chunk=256,
                                 chip=core7x)
    assert any("scale the tile's cycles by area" in n for n in wide.notes)
    # a 256 chunk: a quarter of the iterations, each four tiles' cycles
    assert wide.metrics["iterations"] * 4 == at7x.metrics["iterations"]
    assert wide.parts[0].vpu_ops == pytest.approx(at7x.parts[0].vpu_ops)


@pytest.mark.parametrize("kwargs, match", [
    ({"chip": "h100-sxm"}, "not a TPU"),
    ({"kv_heads": 5}, "must divide"),
    ({"chunk": 0}, "chunk"),
    ({"head_dim": -1}, "head_dim"),
    ({"dtype": "int3"}, "dtype"),
])
def test_bad_input(core7x, kwargs, match):
    args = {"batch": 1, "q_len": 256, "kv_len": 256, "q_heads": 8, "kv_heads": 8, "head_dim": 64, "chip": core7x,
            **kwargs}
    if isinstance(args["chip"], str):
        args["chip"] = get_chip(args["chip"])
    with pytest.raises(InputError, match=match):
        xla_chunked_attention(**args)


@pytest.mark.parametrize("bad, match", [
    ({"base": 1.0}, "give exactly"),
    ({**{"base": 95.88, "per_head_dim": 17.21, "per_v_head_dim": 56.16, "bias_and_mask": 36.91,
         "per_log2_batch_heads": -3.9, "head_dim_cap": 192}, "batch_heads_range": [64, 32]}, "batch_heads_range"),
])
def test_the_calibration_line_is_read_strictly(monkeypatch, bad, match):
    monkeypatch.setattr(efficiency, "_table", lambda: {"xla_chunked_attention_tile_cycles": bad})
    with pytest.raises(ValueError, match=match):
        chunked.tile_cycle_line()
