"""Property tests: monotonicity in every size, more bandwidth never slows, floor <= expected <= no-overlap."""

import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.hw import get_chip
from perfmodel.model.attention import flash_attention
from perfmodel.model.collectives import all_gather, all_reduce, reduce_scatter
from perfmodel.model.core import UNITS, evaluate
from perfmodel.model.fused import dequant_gemm, rms_norm, rope, swiglu
from perfmodel.model.gemm import gemm
from perfmodel.model.kvcache import kv_cache_update, kv_gather
from perfmodel.model.paged_attention import mla_decode, paged_decode_attention, ragged_paged_attention
from perfmodel.model.sampling import sampling

CHIPS = ("tpu-v5e", "tpu-v6e")
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
size = st.integers(min_value=1, max_value=5000)
small = st.integers(min_value=1, max_value=64)
grow = st.integers(min_value=1, max_value=3000)
dtypes = st.sampled_from(["bf16", "fp8", "int8", "int4", "fp32"])


def _ops():
    """(name, builder(sizes dict, chip) -> OpCost, strategies of its sizes)."""
    return {
        "gemm": (lambda s, c, d: gemm(m=s["m"], n=s["n"], k=s["k"], batch=s["b"], rhs_dtype=d, chip=c),
                 dict(m=size, n=size, k=size, b=st.integers(1, 4))),
        "flash": (lambda s, c, d: flash_attention(batch=s["b"], q_len=s["q"], kv_len=s["q"] + s["extra"],
                                                  q_heads=s["g"] * s["kv"], kv_heads=s["kv"], head_dim=s["d"],
                                                  chip=c),
                  dict(b=st.integers(1, 4), q=size, extra=size, g=st.integers(1, 8), kv=st.integers(1, 8),
                       d=st.integers(16, 300))),
        "decode": (lambda s, c, d: paged_decode_attention(context_lens=s["ctx"], batch=s["b"], q_heads=s["g"] * s["kv"],
                                                          kv_heads=s["kv"], head_dim=s["d"], page_size=s["p"],
                                                          kv_dtype=d, chip=c),
                   dict(ctx=size, b=st.integers(1, 512), g=st.integers(1, 8), kv=st.integers(1, 8),
                        d=st.integers(16, 300), p=st.integers(1, 64))),
        "mla": (lambda s, c, d: mla_decode(context_lens=s["ctx"], batch=s["b"], q_heads=s["h"], page_size=s["p"],
                                           chip=c),
                dict(ctx=size, b=st.integers(1, 256), h=st.integers(1, 128), p=st.integers(1, 64))),
        "sampling": (lambda s, c, d: sampling(batch=s["b"], vocab=s["v"] + s["k"], top_k=s["k"], top_p=0.9, chip=c),
                     dict(b=st.integers(1, 256), v=size, k=st.integers(1, 100))),
        "rms_norm": (lambda s, c, d: rms_norm(tokens=s["t"], hidden=s["h"], chip=c), dict(t=size, h=size)),
        "swiglu": (lambda s, c, d: swiglu(tokens=s["t"], intermediate=s["i"], fused=False, chip=c),
                   dict(t=size, i=size)),
        "rope": (lambda s, c, d: rope(tokens=s["t"], heads=s["h"], head_dim=2 * s["d"], chip=c),
                 dict(t=size, h=small, d=small)),
        "dequant_gemm": (lambda s, c, d: dequant_gemm(m=s["m"], n=s["n"], k=s["k"], fused=False, chip=c),
                         dict(m=size, n=size, k=size)),
        "kv_update": (lambda s, c, d: kv_cache_update(num_tokens=s["t"], kv_heads=s["h"], head_dim=s["d"],
                                                      page_size=16, kv_dtype=d, chip=c),
                      dict(t=size, h=small, d=st.integers(1, 300))),
        "kv_gather": (lambda s, c, d: kv_gather(context_lens=s["ctx"], batch=s["b"], kv_heads=s["h"],
                                                head_dim=s["d"], page_size=16, chip=c),
                      dict(ctx=size, b=small, h=small, d=st.integers(1, 300))),
        # A named layout: the chip's own ("auto") is not monotone in the group size by design (7 chips are a
        # line of 1 link, 8 a 2x4 block of 2); tests/model/test_collectives.py checks it per topology.
        "all_gather": (lambda s, c, d: all_gather(bytes_per_chip=s["x"], num_chips=s["n"], topology="ring", chip=c),
                       dict(x=st.integers(1, 10**9), n=st.integers(1, 64))),
        "all_reduce": (lambda s, c, d: all_reduce(bytes_per_chip=s["x"], num_chips=s["n"], topology="line", chip=c),
                       dict(x=st.integers(1, 10**9), n=st.integers(1, 64))),
        "reduce_scatter": (lambda s, c, d: reduce_scatter(bytes_per_chip=s["x"], num_chips=s["n"], topology="torus",
                                                          chip=c),
                           dict(x=st.integers(1, 10**9), n=st.integers(1, 64))),
    }


OPS = _ops()
#: Layout parameters rather than problem sizes: a bigger page shrinks the page table, so they are not grown.
LAYOUT = {"p"}


def _draw(data, op):
    build, strategies = OPS[op]
    sizes = {k: data.draw(s, label=k) for k, s in strategies.items()}
    chip = get_chip(data.draw(st.sampled_from(CHIPS), label="chip"))
    dtype = data.draw(dtypes, label="dtype") if op in ("gemm", "decode", "kv_update") else "bf16"
    if op == "decode" and dtype == "fp32":
        dtype = "bf16"
    return build, sizes, chip, dtype


@pytest.mark.parametrize("op", sorted(OPS))
@SETTINGS
@given(data=st.data())
def test_floor_never_decreases_when_a_size_grows(op, data):
    build, sizes, chip, dtype = _draw(data, op)
    base = evaluate(build(sizes, chip, dtype), chip).floor_s
    dim = data.draw(st.sampled_from(sorted(set(sizes) - LAYOUT)), label="dim")
    bigger = dict(sizes, **{dim: sizes[dim] + data.draw(grow, label="delta")})
    assert evaluate(build(bigger, chip, dtype), chip).floor_s >= base * (1 - 1e-12)


@pytest.mark.parametrize("op", sorted(OPS))
@SETTINGS
@given(data=st.data())
def test_doubling_hbm_bandwidth_never_slows(op, data):
    build, sizes, chip, dtype = _draw(data, op)
    fast = dataclasses.replace(chip, memory=dataclasses.replace(
        chip.memory, hbm_bw_bytes_per_s_per_chip=2 * chip.memory.hbm_bw_bytes_per_s_per_chip))
    cost = build(sizes, chip, dtype)
    slow_r, fast_r = evaluate(cost, chip), evaluate(build(sizes, fast, dtype), fast)
    for field in ("floor_s", "expected_s", "no_overlap_s"):
        assert getattr(fast_r, field) <= getattr(slow_r, field) * (1 + 1e-12)


@pytest.mark.parametrize("op", sorted(OPS))
@SETTINGS
@given(data=st.data())
def test_bounds_are_ordered(op, data):
    build, sizes, chip, dtype = _draw(data, op)
    cost = build(sizes, chip, dtype)
    r = evaluate(cost, chip)
    total = sum(r.unit_s[u] for u in UNITS) + float(cost.fixed_s)
    # the ceiling: every unit at its achievable rate (the MXU's scaled by the shape's ramp and waves), one after
    # another, plus the launch, DMA-latency and op fixed costs (serial dequantization is VPU time moved, not added)
    shares = {u: r.achievable_share[u] * (float(np.mean(cost.mxu_efficiency)) if u == "mxu" else 1.0) for u in UNITS}
    fixed = sum(float(r.fixed_parts_s[k]) for k in ("launch", "dma_latency", "op"))
    ceiling = sum(r.unit_s[u] / shares[u] for u in UNITS) + fixed
    assert r.floor_s <= r.expected_s * (1 + 1e-12)
    assert r.expected_s <= r.no_overlap_s * (1 + 1e-12)
    assert total <= r.no_overlap_s * (1 + 1e-12)
    assert r.no_overlap_s == pytest.approx(ceiling, rel=1e-12)
    # every part's floor fits under the whole op's no-overlap time
    for part in cost.parts:
        assert evaluate(part, chip).floor_s <= r.no_overlap_s * (1 + 1e-12)
    assert 0 <= cost.padding_waste < 1 and 0 <= cost.vpu_padding_waste < 1


@SETTINGS
@given(q=st.lists(st.integers(1, 600), min_size=1, max_size=6), extra=st.lists(st.integers(0, 3000), min_size=6,
                                                                                 max_size=6))
def test_ragged_parts_add_up(q, extra):
    chip = get_chip("tpu-v5e")
    ctx = [a + b for a, b in zip(q, extra)]
    cost = ragged_paged_attention(query_lens=q, context_lens=ctx, q_heads=16, kv_heads=4, head_dim=128,
                                  page_size=16, chip=chip)
    prefill, decode = cost.parts
    assert cost.useful_flops == pytest.approx(prefill.useful_flops + decode.useful_flops)
    assert decode.metrics["sequences"] == sum(1 for x in q if x == 1)
