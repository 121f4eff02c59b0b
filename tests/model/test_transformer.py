"""Whole-transformer steps: composition, hand-worked floors, TP, MoE routing, HBM fit, errors."""

from __future__ import annotations

import dataclasses
import json
import math
import subprocess
import sys

import pytest

from perfmodel.errors import InputError
from perfmodel.hw import get_chip
from perfmodel.model import sharding, transformer as tf
from perfmodel.model.configs import get_model
from perfmodel.model.hf_config import load_hf_config
from perfmodel.model.schema import parameter_counts
from perfmodel.model.step import make_step
from perfmodel.model.transformer import predict_step
from perfmodel.predict.step_render import prediction_record

V5E = get_chip("tpu-v5e")
# TPU v5e: 819 GB/s HBM, 197 TFLOP/s bf16, 16 GiB HBM (hwspecs/tpu-v5e.yaml)
V5E_HBM_BW = 8.19e11
V5E_BF16 = 1.97e14
V5E_HBM = 16 * 2**30

#: Relative tolerance of hand-worked totals that leave out the small ops (norms, RoPE, sampling, activations).
SMALL_OPS_REL = {"bf16": 0.01, "int8": 0.01}


def _op(p, name):
    return next(op for op in p.ops if op.name == name)


def _decode(model="llama-3.1-8b", chip=V5E, **kw):
    return predict_step(get_model(model), make_step(phase="decode", **kw), chip)


# --------------------------------------------------------------------------- hand-worked decode


def test_llama_8b_decode_batch1_v5e_hand_worked():
    # Weight matrices read per decode step (bf16, 2 bytes each), the embedding table excepted (only 1 row is read):
    #   per layer qkv 4096*(32+2*8)*128 = 25,165,824 + o 16,777,216 + gate_up 4096*2*14336 = 117,440,512
    #             + down 58,720,256 = 218,103,808 params; 32 layers = 6,979,321,856; lm_head 128256*4096 = 525,336,576
    #   -> 7,504,658,432 params = 15,009,316,864 bytes (~ 2 * 8.03e9 minus the embedding)
    # KV read: 32 layers * 1024 tokens * 2 (K,V) * 8 heads * 128 * 2 B = 134,217,728 bytes
    # floor ~ (15,009,316,864 + 134,217,728) / 819e9 = 18.49 ms, every op HBM-bound
    p = _decode(batch=1, context=1024)
    gemm_bytes = sum(_op(p, n).hbm_bytes for n in ("qkv_proj", "o_proj", "gate_up", "down", "lm_head"))
    assert gemm_bytes == pytest.approx(15_009_316_864, rel=1e-3)
    # plus, per layer, q and the output (32 heads * 128 * 2 B = 8,192 B each) and the page table
    # (1024/16 = 64 int32 entries + 2 int32 scalars = 264 B): 32 * 16,648 = 532,736 B
    assert _op(p, "attention").hbm_bytes == 134_217_728 + 532_736
    assert p.floor_s == pytest.approx((15_009_316_864 + 134_217_728) / V5E_HBM_BW, rel=SMALL_OPS_REL["bf16"])
    assert p.bound == "HBM-bound" and p.bound_shares["HBM-bound"] > 0.99
    assert p.mbu_at_floor > 0.99
    # useful FLOPs ~ 2 per weight + attention 4*128*1024*32 heads*32 layers = 537M; MFU = FLOPs / (floor * 197T)
    assert p.mfu_at_floor == pytest.approx(p.useful_flops / (p.floor_s * V5E_BF16))
    assert p.useful_flops == pytest.approx(2 * 7_504_658_432 + 4 * 128 * 1024 * 32 * 32, rel=1e-3)
    # one token per step, one chip
    assert p.tokens_per_s == pytest.approx(1 / p.expected_s) == p.tokens_per_s_per_chip
    assert p.tokens_per_s_at_floor == pytest.approx(1 / p.floor_s)
    assert p.tokens_per_s_at_floor >= p.tokens_per_s


def test_llama_8b_weight_footprint_is_2_bytes_per_param():
    # every matrix (embedding included) and norm in bf16: 2 * 8,030,261,248 = 16,060,522,496 bytes
    p = _decode(batch=1, context=1024)
    assert p.memory.weight_bytes == 2 * parameter_counts(get_model("llama-3.1-8b")).total == 16_060_522_496


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-32b", "mixtral-8x7b", "deepseek-v3", "gemma-3-27b"])
def test_footprint_matches_param_count_at_tp1(model):
    cfg = get_model(model)
    sh = sharding.shard(cfg, 1)
    # bf16 footprint = 2 bytes x every parameter (qk-norm weights are the only ones it leaves out: < 0.01%)
    assert sharding.weight_bytes_per_chip(cfg, sh, "bf16", "bf16") == pytest.approx(2 * parameter_counts(cfg).total,
                                                                               rel=1e-4)


def test_int8_weights_halve_the_decode_floor():
    bf16 = _decode(batch=1, context=256)
    int8 = _decode(batch=1, context=256, weight_dtype="int8")
    # weights dominate: int8 (1 B/param + f32 per-channel scales) ~ half of bf16
    assert int8.floor_s == pytest.approx(bf16.floor_s / 2, rel=0.02)
    assert int8.memory.weight_bytes == pytest.approx(bf16.memory.weight_bytes / 2, rel=SMALL_OPS_REL["int8"])


def test_blockwise_weight_scales_add_their_bytes_hand_worked():
    per_channel = _op(_decode(batch=1, context=256, weight_dtype="int8"), "qkv_proj").cost
    per_block = _op(_decode(batch=1, context=256, weight_dtype="int8", weight_scale="per-block"), "qkv_proj").cost
    # Llama-3.1-8B qkv: k = 4096, n = 4096 + 2 x 8 x 128 = 6144. Per channel: 6144 f32 scales = 24,576 B; per
    # 128-row block: 4096 / 128 = 32 scales per column = 786,432 B; 761,856 B more
    assert per_block.hbm_read_bytes - per_channel.hbm_read_bytes == 786_432 - 24_576
    coarse = _op(_decode(batch=1, context=256, weight_dtype="int8", weight_scale="per-block", scale_block=512),
                 "qkv_proj").cost
    # 4096 / 512 = 8 per column: 196,608 B
    assert coarse.hbm_read_bytes - per_channel.hbm_read_bytes == 196_608 - 24_576


def test_quantized_activations_run_prefill_gemms_at_the_int8_rate():
    def prefill(**kw):
        return predict_step(get_model("llama-3.1-8b"), make_step(phase="prefill", prefill_len=2048, **kw), V5E)

    w8 = _op(prefill(weight_dtype="int8"), "gate_up")
    w8a8 = _op(prefill(weight_dtype="int8", quantize_activations=True), "gate_up")
    # gate_up at 2048 tokens is MXU-bound; v5e's int8 MXU rate (394 TOP/s) is twice its bf16 rate (197 TFLOP/s)
    assert w8.bound == w8a8.bound == "MXU-bound"
    assert w8a8.floor_s == pytest.approx(w8.floor_s / 2, rel=0.01)
    # the activations are still read once in bf16 (quantized inside the kernel): 2048 x 4096 x 2 B
    assert w8a8.cost.hbm_read_bytes - w8.cost.hbm_read_bytes == pytest.approx(0, abs=2048 * 4 + 1)
    # the MoE experts keep float activations: no in-kernel quantization in grouped_matmul
    def experts(**kw):
        return _op(predict_step(get_model("mixtral-8x7b"), make_step(phase="prefill", prefill_len=2048,
                                                                    weight_dtype="int8", **kw), V5E), "experts_gate_up")

    assert experts(quantize_activations=True).floor_s == experts().floor_s
    assert _op(prefill(weight_dtype="int8", quantize_activations=True), "qkv_proj").floor_s < \
        _op(prefill(weight_dtype="int8"), "qkv_proj").floor_s


def test_w4a8_runs_int4_weight_gemms_at_the_int8_rate_reading_int4_bytes():
    def step(phase, **kw):
        extra = dict(prefill_len=2048) if phase == "prefill" else dict(batch=64)
        return predict_step(get_model("llama-3.1-8b"), make_step(phase=phase, weight_dtype="int4", **extra, **kw),
                            V5E)

    w4, w4a8 = _op(step("prefill"), "gate_up"), _op(step("prefill", quantize_activations=True), "gate_up")
    # prefill: bf16 x int4 widens the codes to bf16 (197 TFLOP/s on v5e); w4a8 feeds int8 codes to the int8 MXU
    # (394 TOP/s), reading the same int4 weight bytes and the bf16 activations
    assert w4a8.floor_s < w4.floor_s
    assert w4a8.cost.hbm_read_bytes == pytest.approx(w4.cost.hbm_read_bytes, abs=2048 * 4 + 1)
    # decode at 64 sequences: both read 4096 x 28672 / 2 B of gate_up weights once, HBM-bound at the same floor
    d4, d4a8 = _op(step("decode"), "gate_up"), _op(step("decode", quantize_activations=True), "gate_up")
    assert d4.bound == d4a8.bound == "HBM-bound" and d4a8.floor_s == pytest.approx(d4.floor_s, rel=0.01)


@pytest.mark.parametrize("kw, match", [
    (dict(quantize_activations=True), "`quantize_activations`: int8 x int8 / int8 x int4 GEMMs quantize float "
                                      "activations .* `weight_dtype` bf16"),
    (dict(weight_dtype="fp8", quantize_activations=True), "for int8 or int4 weights; got `weight_dtype` fp8"),
    (dict(weight_dtype="int8", act_dtype="int8", quantize_activations=True), "`act_dtype` int8"),
    (dict(weight_scale="per-block"), "weights of dtype bf16 are not quantized; drop the flag or pick `weight_dtype`"),
    (dict(weight_dtype="int8", scale_block=64), "`scale_block` applies only with `weight_scale` per-block"),
])
def test_weight_gemm_options_are_checked(kw, match):
    with pytest.raises(InputError, match=match):
        make_step(**kw)


def test_fp8_weights_on_v5e_convert_on_vpu():
    p = _decode(batch=1, context=256, weight_dtype="fp8")
    notes = " ".join(_op(p, "gate_up").cost.notes)
    assert "no native" in notes and "bf16" in notes
    assert p.compute_dtype == "bf16"


# --------------------------------------------------------------------------- prefill


def test_llama_8b_prefill_is_mxu_bound_hand_worked():
    # 2048-token prompt: GEMM FLOPs 2 * 7,504,658,432 weights... but lm_head runs on the last token only:
    #   2 * 6,979,321,856 * 2048 + 2 * 525,336,576 * 1 = 2.8588e13
    # causal attention: 2048*2049/2 = 2,098,176 visible pairs * 4*128 FLOPs * 32 heads * 32 layers = 1.1001e12
    # floor >= 2.9688e13 / 197e12 = 150.7 ms
    p = predict_step(get_model("llama-3.1-8b"), make_step(phase="prefill", prefill_len=2048), V5E)
    useful = 2 * 6_979_321_856 * 2048 + 2 * 525_336_576 + 2_098_176 * 4 * 128 * 32 * 32
    assert p.useful_flops == pytest.approx(useful, rel=1e-3)
    assert p.bound == "MXU-bound" and p.mfu_at_floor > 0.85
    assert p.floor_s >= useful / V5E_BF16
    # the layer GEMMs (all dims multiples of 128: no padding) run at the bf16 peak:
    # 2 * 6,979,321,856 * 2048 / 197e12 = 145.1 ms
    layer_gemms = sum(_op(p, n).floor_s for n in ("qkv_proj", "o_proj", "gate_up", "down"))
    assert layer_gemms == pytest.approx(2 * 6_979_321_856 * 2048 / V5E_BF16, rel=1e-6)
    # the HBM-bound norms / RoPE / SwiGLU / KV writes and the masked attention tiles add < 15%
    assert p.floor_s < 1.15 * useful / V5E_BF16
    assert p.tokens_per_step == 2048


def test_prefill_with_cached_prefix_reads_more_kv():
    cfg = get_model("llama-3.1-8b")
    fresh = predict_step(cfg, make_step(phase="prefill", prefill_len=512), V5E)
    chunk = predict_step(cfg, make_step(phase="prefill", prefill_len=512, context=1536), V5E)
    assert _op(chunk, "attention").useful_flops > _op(fresh, "attention").useful_flops
    assert chunk.memory.kv_bytes_per_sequence == 4 * fresh.memory.kv_bytes_per_sequence  # 2048 vs 512 tokens


# --------------------------------------------------------------------------- tensor parallelism


def test_tp_splits_weights_and_adds_ici():
    one = _decode("llama-3.1-70b", batch=1, context=1024)
    four = _decode("llama-3.1-70b", batch=1, context=1024, tp=4)
    # matrices split 4 ways (8 KV heads -> 2 per chip); only the norm weights are replicated
    assert four.memory.weight_bytes == pytest.approx(one.memory.weight_bytes / 4, rel=1e-3)
    assert four.floor_s < one.floor_s / 3
    assert one.ici_bytes == 0 and not [op for op in one.ops if op.block == "tp"]
    # per layer 2 all-reduces of [1 token, 8192] bf16 = 16,384 B; a ring sends 2*(4-1)/4 of it: 24,576 B each
    # 160 all-reduces -> 3,932,160 B, and one more of the same size for the vocab-split embedding lookup;
    # logits all-gather: (4-1) shards of 128256/4 f32 = 3 * 32,064 * 4 = 384,768 B
    assert four.ici_bytes == pytest.approx(161 * 24_576 + 384_768)
    assert _op(four, "all_reduce(attn)").bound == "ICI-bound"
    assert four.tokens_per_s_per_chip == pytest.approx(four.tokens_per_s / 4)


def test_tp_beyond_kv_heads_replicates_kv():
    cfg = get_model("llama-3.1-8b")  # 8 KV heads
    sh = sharding.shard(cfg, 16)
    assert (sh.q_heads, sh.kv_heads, sh.kv_replicas) == (2, 1, 2)


@pytest.mark.parametrize(("tp", "message"), [
    (3, r"`tp` 3 must divide llama-3.1-8b's 32 query heads"),
    (0, r"`tp` must be a whole number >= 1, got 0"),
])
def test_tp_errors(tp, message):
    with pytest.raises(InputError, match=message):
        _decode(tp=tp)


def test_tp_kv_heads_that_neither_split_nor_replicate(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"model_type": "llama", "hidden_size": 1536, "num_hidden_layers": 2, "num_attention_heads": 48,
                             "num_key_value_heads": 12, "intermediate_size": 4096, "vocab_size": 1000}))
    with pytest.raises(InputError, match=r"`tp` 8: .*12 KV heads neither split over nor replicate evenly"):
        predict_step(load_hf_config(f), make_step(tp=8), V5E)


# --------------------------------------------------------------------------- MoE


@pytest.mark.parametrize(("tokens", "experts", "top_k", "touched", "light", "heavy"), [
    # 64 tokens x top-2 of 8: 128 assignments, 16 per expert; 8*(1-(6/8)^64) ~ 8 experts touched
    (64, 8, 2, 8, 16, 0),
    # 1 token x top-8 of 256: exactly 8 experts, 1 token each
    (1, 256, 8, 8, 1, 0),
    # 4 tokens x top-8 of 256: 256*(1-(31/32)^4) = 30.54 -> 31 experts for 32 assignments: one gets 2 tokens
    (4, 256, 8, 31, 1, 1),
    # 1000 tokens x top-8 of 128: every expert, 8000/128 = 62.5 tokens each -> 64 experts of 63, 64 of 62
    (1000, 128, 8, 128, 62, 64),
])
def test_moe_routing(tokens, experts, top_k, touched, light, heavy):
    r = tf.routing(tokens, experts, top_k)
    assert r.tokens_per_expert == tokens * top_k / experts
    assert (r.experts_touched, r.light_tokens, r.heavy_experts) == (touched, light, heavy)
    assert heavy * (light + 1) + (touched - heavy) * light == tokens * top_k


def test_mixtral_decode_reads_only_touched_experts():
    # batch 1, top-2: 2 experts' gate_up read: 2 * 4096 * (2*14336) * 2 B = 469,762,048 bytes,
    # and 2 * 1 token * 4096 * 28672 * 2 FLOPs = 469,762,048 useful FLOPs per layer
    p = _decode("mixtral-8x7b", batch=1, context=128)
    gate_up = _op(p, "experts_gate_up")
    assert gate_up.cost.hbm_bytes == pytest.approx(469_762_048, rel=1e-3)
    assert gate_up.cost.useful_flops == 469_762_048
    assert gate_up.count == 32
    # a batch of 512 touches all 8 experts: 4x the weight bytes, 512x the FLOPs
    big = _decode("mixtral-8x7b", batch=512, context=128)
    assert _op(big, "experts_gate_up").cost.useful_flops == 512 * 469_762_048
    # + activations: 1024 token-expert rows in (1024 * 4096 * 2 B = 8,388,608) and out (1024 * 28672 * 2 B = 58,720,256)
    assert _op(big, "experts_gate_up").cost.hbm_bytes == 4 * 469_762_048 + 8_388_608 + 58_720_256
    assert big.routing.experts_touched == 8 and big.routing.tokens_per_expert == 128


def test_moe_active_weights_much_less_than_total():
    p = _decode("qwen3-235b-a22b", batch=1, context=128, tp=8, weight_dtype="int8")
    moe_bytes = sum(op.hbm_bytes for op in p.ops if op.name.startswith("experts_"))
    all_expert_bytes = sum(m.layers * m.copies * sharding.matrix_bytes(m, "int8", "bf16")
                           for m in sharding.weight_matrices(get_model("qwen3-235b-a22b"), sharding.shard(get_model(
                               "qwen3-235b-a22b"), 8)) if m.name.startswith("experts_"))
    # 8 of 128 experts per layer
    assert moe_bytes == pytest.approx(all_expert_bytes * 8 / 128, rel=0.01)


def test_deepseek_decode_uses_mla_and_shared_expert():
    p = _decode("deepseek-v3", batch=8, context=2048, tp=8, weight_dtype="fp8", kv_dtype="fp8")
    names = [op.name for op in p.ops]
    for name in ("qkv_down", "q_up", "q_absorb", "mla_attention", "v_absorb", "shared_gate_up", "gate_up"):
        assert name in names
    assert _op(p, "gate_up").count == 3 and _op(p, "experts_gate_up").count == 58
    # latent cache: 61 layers * (512 + 64) * 1 B (fp8) + 4 B per-token scale, whole pages of 16
    assert p.memory.kv_bytes_per_sequence == 61 * 2048 * (576 + 4)


def test_deepseek_prefill_expands_latents():
    p = predict_step(get_model("deepseek-v3"), make_step(phase="prefill", prefill_len=256, tp=8), V5E)
    assert "kv_up" in [op.name for op in p.ops] and "mla_attention" not in [op.name for op in p.ops]


# --------------------------------------------------------------------------- HBM fit


def test_capacity_hand_worked():
    # bf16 Llama-8B weights 16,060,522,496 B;
    # KV per sequence at 1024 tokens: 32 * 1024 * 2 * 8 * 128 * 2 = 134,217,728 B
    # all of the 17,179,869,184 B usable: (17,179,869,184 - 16,060,522,496) / 134,217,728 = 8.34 -> 8 sequences
    cfg = get_model("llama-3.1-8b")
    fit8 = sharding.memory_fit(cfg, make_step(batch=8, context=1024), V5E, hbm_utilization=1.0)
    assert fit8.fits and fit8.max_batch == 8 and fit8.shortfall_bytes == 0
    fit9 = sharding.memory_fit(cfg, make_step(batch=9, context=1024), V5E, hbm_utilization=1.0)
    assert not fit9.fits
    assert fit9.shortfall_bytes == 16_060_522_496 + 9 * 134_217_728 - V5E_HBM  # 88,612,864
    # at the default 90% usable the weights alone do not fit
    default = sharding.memory_fit(cfg, make_step(batch=1, context=1024), V5E)
    assert default.usable_bytes == pytest.approx(0.9 * V5E_HBM)
    assert not default.fits and default.max_batch == 0


@pytest.mark.parametrize(("context", "page", "tokens"), [(1000, 16, 1008), (1000, 256, 1024), (1024, 16, 1024),
                                                         (1, 64, 64)])
def test_kv_counts_whole_pages(context, page, tokens):
    cfg = get_model("llama-3.1-8b")
    fit = sharding.memory_fit(cfg, make_step(context=context, page_size=page), V5E)
    assert fit.kv_bytes_per_sequence == 32 * tokens * 2 * 8 * 128 * 2


def test_sliding_window_layers_keep_only_the_window():
    # Gemma-3 27B, 32768-token context: 10 global layers keep 32768 tokens, 52 local layers 1024;
    # per token and layer 2 * 16 kv heads * 128 * 2 B = 8192 B -> 8192 * (10*32768 + 52*1024) = 3,120,562,176 B
    fit = sharding.memory_fit(get_model("gemma-3-27b"), make_step(context=32768), V5E)
    assert fit.kv_bytes_per_sequence == 3_120_562_176
    p = _decode("gemma-3-27b", batch=1, context=32768)
    glob, local = _op(p, "attention(global)"), _op(p, "attention(window 1024)")
    assert (glob.count, local.count) == (10, 52)
    assert glob.cost.hbm_bytes > 20 * local.cost.hbm_bytes


def test_quantized_kv_footprint_with_scales():
    # int8 KV: 128 B per head row + one f32 scale per (token, head) for K and V: 2 * 8 * (128 + 4) = 2112 B/token/layer
    fit = sharding.memory_fit(get_model("llama-3.1-8b"), make_step(context=1024, kv_dtype="int8"), V5E)
    assert fit.kv_bytes_per_sequence == 32 * 1024 * 2112


# --------------------------------------------------------------------------- invariants


@pytest.mark.parametrize("model", ["llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-32b", "gemma-3-27b",
                                   "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"])
@pytest.mark.parametrize("phase", ["decode", "prefill"])
def test_every_preset_composes(model, phase):
    cfg = get_model(model)
    step = make_step(phase=phase, batch=3, context=300 if phase == "decode" else 100,
                     prefill_len=None if phase == "decode" else 77, tp=4, page_size=16)
    p = predict_step(cfg, step, V5E)
    assert p.floor_s == pytest.approx(sum(op.floor_s for op in p.ops))
    assert sum(p.share(op) for op in p.ops) == pytest.approx(1.0)
    assert p.overlapped_floor_s <= p.floor_s * (1 + 1e-9)
    assert p.floor_s <= p.expected_s <= p.no_overlap_s * (1 + 1e-9)
    assert sum(p.bound_shares.values()) == pytest.approx(1.0)
    assert 0 < p.mbu_at_floor <= 1 + 1e-9 and 0 < p.mfu_at_floor <= 1 + 1e-9
    json.dumps(prediction_record(p))  # JSON-serializable


@pytest.mark.parametrize("field", ["batch", "context"])
def test_decode_floor_grows_with_batch_and_context(field):
    base = dict(batch=4, context=512)
    small = _decode(**base)
    large = _decode(**{**base, field: base[field] * 8})
    assert large.floor_s > small.floor_s


def test_faster_hbm_never_slows_a_step():
    fast = dataclasses.replace(V5E, memory=dataclasses.replace(V5E.memory, hbm_bw_bytes_per_s_per_chip=2 * V5E_HBM_BW))
    for kw in (dict(batch=1, context=1024), dict(batch=256, context=4096)):
        assert _decode(chip=fast, **kw).floor_s <= _decode(**kw).floor_s
    slow_decode = _decode(batch=1, context=1024)
    # batch 1 decode is all HBM: doubling the bandwidth halves it (up to the VPU/EUP-bound small ops)
    assert _decode(chip=fast, batch=1, context=1024).floor_s == pytest.approx(slow_decode.floor_s / 2, rel=0.01)


# --------------------------------------------------------------------------- input errors


@pytest.mark.parametrize(("kw", "message"), [
    (dict(phase="train"), r"`phase`: got 'train'; use prefill or decode"),
    (dict(batch=0), r"`batch` must be a whole number >= 1, got 0"),
    (dict(batch=2.5), r"`batch` must be a whole number >= 1, got 2.5"),
    (dict(context=0), r"`context` must be a whole number >= 1, got 0"),
    (dict(prefill_len=128), r"`prefill_len` applies to `phase` prefill"),
    (dict(phase="prefill", prefill_len=0), r"`prefill_len` must be a whole number >= 1, got 0"),
    (dict(phase="prefill", context=-1), r"`context` must be >= 0 for prefill"),
    (dict(page_size=0), r"`page_size` must be a whole number >= 1, got 0"),
    (dict(weight_dtype="int3"), r"`weight_dtype`: unknown dtype 'int3'"),
    (dict(act_dtype="bf17"), r"`act_dtype`: unknown dtype 'bf17'"),
    (dict(kv_dtype="q4"), r"`kv_dtype`: unknown dtype 'q4'"),
])
def test_make_step_errors(kw, message):
    with pytest.raises(InputError, match=message):
        make_step(**kw)


def test_bad_hbm_utilization():
    with pytest.raises(InputError, match=r"`hbm_utilization` must be in \(0, 1\], got 1.5"):
        sharding.memory_fit(get_model("llama-3.1-8b"), make_step(), V5E, hbm_utilization=1.5)


def test_defaults():
    d = make_step()
    assert (d.phase, d.batch, d.context_tokens, d.chunk_tokens, d.kv_dtype, d.tp) == ("decode", 1, 1024, 1, "bf16", 1)
    p = make_step(phase="prefill", act_dtype="bf16")
    assert (p.context_tokens, p.chunk_tokens, p.kv_tokens, p.tokens) == (0, 2048, 2048, 2048)
    assert make_step(kv_dtype="fp8").kv_dtype == "fp8"


def test_no_jax_import():
    code = ("import sys; from perfmodel.model import transformer as t, configs as c, step as s; "
            "from perfmodel.hw import get_chip; "
            "t.predict_step(c.get_model('deepseek-v3'), s.make_step(tp=8), get_chip('tpu-v5e')); "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_math_helpers():
    # the expected-distinct-experts formula at its edges
    assert tf.routing(10**6, 64, 4).experts_touched == 64
    assert math.isclose(tf.routing(3, 64, 4).tokens_per_expert, 12 / 64)


# --------------------------------------------------------------------------- mixed context lengths


def test_context_lens_hand_worked():
    # two sequences of 1000 and 24 tokens, pages of 16: 63 + 2 = 65 pages = 1040 token slots
    # KV per slot and layer: 2 * 8 heads * 128 * 2 B = 4096 B -> 32 layers * 1040 * 4096 = 136,314,880 B
    p = _decode(context_lens=[1000, 24])
    assert (p.step.batch, p.step.context_tokens) == (2, 1000)
    assert p.memory.kv_bytes == 136_314_880
    assert p.memory.kv_bytes_per_sequence == 136_314_880 / 2
    # attention reads those pages plus q, out and the page tables: q/out 2 seqs * 2 * 8,192 B,
    # page tables 2 * 63 int32 (padded to the longest) + 2 * 2 scalars
    assert _op(p, "attention").hbm_bytes == pytest.approx(136_314_880 + 32 * (2 * 2 * 8192 + 4 * (2 * 63 + 4)),
                                                         rel=1e-6)


def test_uniform_context_lens_equal_shared_context():
    same = _decode(context_lens=[512] * 4)
    shared = _decode(batch=4, context=512)
    assert same.floor_s == pytest.approx(shared.floor_s)
    assert same.memory.kv_bytes == shared.memory.kv_bytes


def test_context_lens_on_window_and_mla_models():
    g = _decode("gemma-3-27b", context_lens=[100, 5000])
    # local layers keep min(len, 1024): 100 + 1024 tokens; global layers 100 + 5000
    per_token = 2 * 16 * 128 * 2
    assert g.memory.kv_bytes == per_token * (10 * (112 + 5008) + 52 * (112 + 1024))
    d = _decode("deepseek-v3", context_lens=[64, 4096], tp=8)
    assert d.memory.kv_bytes == 61 * 1152 * (64 + 4096)


@pytest.mark.parametrize(("kw", "message"), [
    (dict(phase="prefill", context_lens=[4, 5]), r"`context_lens` / `context_dist` apply to `phase` decode"),
    (dict(context=5, context_lens=[4, 5]), r"give `context` or `context_lens` / `context_dist`, not both"),
    (dict(batch=3, context_lens=[4, 5]), r"`batch` 3 disagrees with the 2 `context_lens` given"),
    (dict(context_lens=[4, 0]), r"`context_lens`: give whole numbers >= 1"),
    (dict(context_lens=[]), r"`context_lens`: give whole numbers >= 1"),
])
def test_context_lens_errors(kw, message):
    with pytest.raises(InputError, match=message):
        make_step(**kw)


# --------------------------------------------------------------------------- MLP layouts and TP collectives (issue 10)


def _variant(**change):
    return dataclasses.replace(get_model("llama-3.1-8b"), **change)


@pytest.mark.parametrize("act,epilogue", [("relu", "relu"), ("gelu", "gelu"), ("gelu_tanh", "gelu")])
@pytest.mark.parametrize("bias", [False, True])
def test_non_gated_mlp_is_up_then_down(act, epilogue, bias):
    cfg = _variant(mlp_gated=False, mlp_activation=act, mlp_bias=bias)
    p = predict_step(cfg, make_step(phase="prefill", prefill_len=128), V5E)
    names = [op.name for op in p.ops if op.block == "mlp"]
    # no gate and no GLU kernel: norm, up (activation fused as its epilogue), down
    assert names == ["mlp_norm", "up", "down"]
    up = _op(p, "up").cost
    # up: [128, 4096] x [4096, 14336] = 2 * 128 * 4096 * 14336 = 15,032,385,536 FLOPs (GeGLU's gate_up is twice)
    assert up.useful_flops == 2 * 128 * 4096 * 14336
    epilogues = [n for n in up.notes if "epilogue" in n]
    assert epilogues and epilogue in epilogues[0] and (("bias" in epilogues[0]) == bias)
    # weights: 2 matrices of 4096 x 14336 per layer instead of 3
    llama = get_model("llama-3.1-8b")
    gated = sharding.weight_bytes_per_chip(llama, sharding.shard(llama, 1), "bf16", "bf16")
    plain = sharding.weight_bytes_per_chip(cfg, sharding.shard(cfg, 1), "bf16", "bf16")
    # 32 layers x 4096 x 14336 x 2 B = 3,758,096,384 B fewer; biases add 32 x (14336 + 4096) x 2 B = 1,179,648 B
    assert gated - plain == 32 * 4096 * 14336 * 2 - (32 * (14336 + 4096) * 2 if bias else 0)


def test_gated_gelu_stays_geglu_and_bias_rides_on_the_projections():
    p = predict_step(_variant(mlp_activation="gelu", mlp_bias=True), make_step(phase="prefill", prefill_len=128), V5E)
    assert [op.name for op in p.ops if op.block == "mlp"] == ["mlp_norm", "gate_up", "geglu", "down"]
    assert any("bias" in n for n in _op(p, "down").cost.notes if "epilogue" in n)


def test_tp_all_reduce_follows_the_topology():
    # TP 8 decode, batch 8: each all-reduce moves the [8, 4096] bf16 activations = 65,536 B per chip.
    # H100 (NVSwitch): 2 x 7/8 x 65,536 B at 450 GB/s; v5e: 2x4 block of lines, 2 links of 50 GB/s
    step = make_step(phase="decode", batch=8, context=1024, tp=8)
    h100 = predict_step(get_model("llama-3.1-8b"), step, get_chip("h100-sxm"))
    v5e = predict_step(get_model("llama-3.1-8b"), step, V5E)
    assert _op(h100, "all_reduce(mlp)").roofline.floor_s == pytest.approx(2 * 7 / 8 * 65_536 / 4.5e11)
    assert _op(v5e, "all_reduce(mlp)").roofline.floor_s == pytest.approx(2 * 7 / 8 * 65_536 / (2 * 5e10))
