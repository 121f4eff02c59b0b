"""KV cache: update with quantize-on-write, gather, capacity."""

import pytest

from perfmodel.errors import InputError
from perfmodel.model.kvcache import kv_bytes_per_token, kv_cache_update, kv_capacity, kv_gather


def test_update_same_dtype_is_a_copy(v5e):
    t, h, d = 256, 8, 128
    cost = kv_cache_update(num_tokens=t, kv_heads=h, head_dim=d, page_size=16, chip=v5e)
    # read new K and V (bf16) + one int32 slot per token, write K and V
    assert cost.hbm_read_bytes == 2 * t * h * d * 2 + t * 4
    assert cost.hbm_write_bytes == 2 * t * h * d * 2
    assert cost.vpu_ops == 0


def test_update_quantizes_on_write(v5e):
    t, h, d = 256, 8, 128
    cost = kv_cache_update(num_tokens=t, kv_heads=h, head_dim=d, page_size=16, kv_dtype="int8", chip=v5e)
    # int8 K and V + one f32 scale per token, kv head and K/V
    assert cost.hbm_write_bytes == 2 * t * h * d + 2 * t * h * 4
    # absmax, max, scale, round, cast per element; one reciprocal per row
    assert cost.vpu_ops == 5 * 2 * t * h * d
    assert cost.eup_ops == 2 * t * h


def test_gather_reads_whole_pages(v5e):
    cost = kv_gather(context_lens=[100, 17], kv_heads=8, head_dim=128, page_size=16, chip=v5e)
    pages = 7 + 2
    assert cost.hbm_read_bytes == 2 * 8 * 128 * 2 * pages * 16 + pages * 4
    assert cost.hbm_write_bytes == 2 * 8 * 128 * 2 * 117


def test_kv_bytes_per_token():
    # Llama-3.1-8B: 32 layers, 8 kv heads of 128, bf16: 2 * 32 * 8 * 128 * 2 = 128 KiB per token
    assert kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128) == 131072


def test_capacity_hand_worked(v5e):
    per_token = 131072
    weights = 8.0e9  # 8B parameters in int8
    cap = kv_capacity(chip=v5e, weight_bytes=weights, kv_bytes_per_token=per_token, page_size=16, context_len=4096)
    free = 0.9 * 16 * 2**30 - weights
    pages = free // (per_token * 16)
    assert cap.free_bytes == pytest.approx(free)
    assert cap.tokens == pages * 16
    assert cap.sequences == pages // 256  # 4096 tokens = 256 pages
    assert cap.weights_fit


def test_capacity_weights_do_not_fit(v5e):
    cap = kv_capacity(chip=v5e, weight_bytes=16.0e9, kv_bytes_per_token=131072)
    assert not cap.weights_fit and cap.tokens == 0
    assert cap.free_bytes == pytest.approx(0.9 * 16 * 2**30 - 16.0e9)


def test_capacity_tensor_parallel_shards_both(v5e):
    one = kv_capacity(chip=v5e, weight_bytes=4e9, kv_bytes_per_token=131072)
    four = kv_capacity(chip=v5e, weight_bytes=16e9, kv_bytes_per_token=131072, num_chips=4)
    # each chip holds 4 GB of weights and a quarter of every token: 4x the tokens
    assert four.tokens == pytest.approx(4 * one.tokens, rel=1e-3)


@pytest.mark.parametrize("fn,kwargs,match", [
    (kv_cache_update, dict(num_tokens=0, kv_heads=8, head_dim=128, page_size=16), r"^`num_tokens` must be >= 1"),
    (kv_cache_update, dict(num_tokens=4, kv_heads=8, head_dim=128, page_size=16, kv_scale="per-page",
                           kv_dtype="int8"), r"^`kv_scale`: got 'per-page'"),
    (kv_cache_update, dict(num_tokens=4, kv_heads=8, head_dim=128, page_size=16, kv_scale="per-token"),
     r"^`kv_scale` per-token: a bf16 KV cache has no scales"),
    (kv_gather, dict(context_lens=[4, -1], kv_heads=8, head_dim=128, page_size=16), r"^`context_lens` must be >= 1"),
    (kv_capacity, dict(weight_bytes=1e9, kv_bytes_per_token=0), r"^`kv_bytes_per_token` must be > 0"),
    (kv_capacity, dict(weight_bytes=-1, kv_bytes_per_token=10), r"^`weight_bytes` must be >= 0"),
    (kv_capacity, dict(weight_bytes=1, kv_bytes_per_token=10, hbm_utilization=1.5), r"^`hbm_utilization` must be"),
    (kv_capacity, dict(weight_bytes=1, kv_bytes_per_token=10, reserved_bytes=-1),
     r"^`reserved_bytes` must be >= 0 \(bytes kept free per chip\), got -1$"),
    (kv_capacity, dict(weight_bytes=float("nan"), kv_bytes_per_token=10),
     r"^`weight_bytes` must be a finite number of bytes, got nan$"),
    (kv_capacity, dict(weight_bytes=1, kv_bytes_per_token=float("inf")), r"^`kv_bytes_per_token` must be a finite"),
    # the CLI flag for the sequence length is --context
    (kv_capacity, dict(weight_bytes=1, kv_bytes_per_token=10, context_len=0), r"^`context` must be >= 1, got 0$"),
])
def test_bad_input(v5e, fn, kwargs, match):
    with pytest.raises(InputError, match=match):
        fn(chip=v5e, **kwargs)


@pytest.mark.parametrize("kwargs,match", [
    (dict(kv_scale="per-token"), r"^`kv_scale` per-token: a bf16 KV cache has no scales"),
    (dict(kv_scale="per-page", kv_dtype="int8"), r"^`kv_scale`: got 'per-page'"),
])
def test_kv_bytes_per_token_bad_scale(kwargs, match):
    with pytest.raises(InputError, match=match):
        kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, **kwargs)


def test_kv_bytes_per_token_int8_with_scales():
    # Llama-3.1-8B int8 KV with per-token f32 scales: 2 (K, V) * 32 layers * 8 heads * (128 * 1 + 4) = 67584 B
    assert kv_bytes_per_token(layers=32, kv_heads=8, head_dim=128, kv_dtype="int8", kv_scale="per-token") == 67584
