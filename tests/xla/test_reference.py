"""The reference step traced on the CPU (no compiler): MLP layouts, per-layer arrays, refusals, cache keys."""

import pytest

from perfmodel.errors import InputError
from perfmodel.model.configs import get_model
from perfmodel.model.schema import mlp_params
from perfmodel.model.step import make_step

GELU_BIAS = "tests/xla/data/tiny-gelu-bias.json"
TINY = "tests/xla/data/tiny-llama.json"


def _build(model, **kw):
    import jax

    from perfmodel.xla.reference import build_step

    layout, kernels = kw.pop("kv_layout", "paged"), kw.pop("kernels", "jnp")
    cfg = get_model(model)
    return cfg, build_step(cfg, make_step(**kw), jax.devices("cpu")[:1], kv_layout=layout, kernels=kernels)


def test_non_gated_biased_mlp_has_the_configs_weights_and_traces():
    import jax

    cfg, (fn, args, donate) = _build(GELU_BIAS, batch=2, context=40)
    assert not cfg.mlp_gated and cfg.mlp_bias and cfg.mlp_activation == "gelu"
    # Per layer: up [256, 1024] + down [1024, 256] + biases 1024 + 256 = 525,568 = mlp_params (2 layers)
    mlp = [a for a in args if a.shape in ((256, 1024), (1024, 256), (1024,))]
    down_bias = [a for a in args if a.shape == (256,)]  # norms (attn, mlp per layer; final) and the down biases
    assert len(mlp) == 2 * 3 and len(down_bias) == 2 * 3 + 1
    assert sum(a.size for a in mlp) + 2 * 256 == 2 * mlp_params(cfg, 256, 1024) == 2 * 525_568
    # caches donated: one K/V cache per layer (2 layers), [kv_heads, pages, K|V, page, head_dim];
    # 40 tokens in 16-token pages = 3 pages per sequence, 2 sequences = 6 pages
    assert len(donate) == 2 and all(args[i].shape == (4, 6, 2, 16, 32) for i in donate)
    out = jax.eval_shape(fn, *args)
    assert out[0].shape == (2,) and [o.shape for o in out[1:]] == [(4, 6, 2, 16, 32)] * 2


def test_gated_mlp_gate_and_up_are_separate_per_layer_arrays():
    cfg, (_, args, donate) = _build(TINY, batch=1, context=8, kv_layout="contiguous")
    # tiny-llama: hidden 256, intermediate 512, 2 layers: gate and up [256, 512] and down [512, 256] per layer
    assert sum(a.shape == (256, 512) for a in args) == 2 * 2 and sum(a.shape == (512, 256) for a in args) == 2
    # contiguous decode cache: [batch 1, kv_heads 4, 8 tokens, head_dim 64] per layer, no [layers, ...] stack
    assert [args[i].shape for i in donate] == [(1, 4, 8, 64)] * 4


def test_reference_refuses_what_it_cannot_build():
    import dataclasses

    from perfmodel.xla.reference import layer_groups

    cfg = get_model(TINY)
    with pytest.raises(InputError, match="`mlp_activation` 'swish'"):
        layer_groups(dataclasses.replace(cfg, mlp_activation="swish"))
    moe = get_model("tests/xla/data/tiny-moe.json")
    with pytest.raises(InputError, match="`mlp_bias` True with MoE layers"):
        layer_groups(dataclasses.replace(moe, mlp_bias=True))
    with pytest.raises(InputError, match="`mlp_gated` False with MoE layers"):
        layer_groups(dataclasses.replace(moe, mlp_gated=False))


def test_same_step_same_compile_key_from_cli_and_library():
    from perfmodel.compiler.api import cache_key
    from perfmodel.compiler.toolchain import Toolchain
    from perfmodel.xla.compare import compile_step_call

    tools = Toolchain(jax_version="j", jaxlib_version="jl", libtpu_version="t")
    lib = make_step(batch=8, context=256, tp=4)
    cli = make_step(phase="decode", batch=8, context=256, prefill_len=None, weight_dtype="bf16", act_dtype="BF16",
                    kv_dtype=None, tp=4, page_size=16)
    a = compile_step_call(TINY, lib, topology=None, kv_layout="paged", kernels="jnp")
    b = compile_step_call(TINY, cli, topology=None, kv_layout="paged", kernels="jnp")
    assert a.to_request() == b.to_request()
    other = compile_step_call(TINY, make_step(batch=8, context=256, tp=4, kv_dtype="int8"), topology=None,
                              kv_layout="paged", kernels="jnp")
    assert other.to_request() != a.to_request()
    assert cache_key(a, "tpu-v5e", tools) == cache_key(b, "tpu-v5e", tools)


def test_analytic_step_all_reduces_the_vocab_sharded_embedding():
    from perfmodel.hw.registry import get_chip
    from perfmodel.model.transformer import predict_step

    cfg = get_model(TINY)
    p = predict_step(cfg, make_step(batch=8, context=256, tp=4), get_chip("v5e"))
    names = [o.name for o in p.ops]
    assert names[:2] == ["embed", "all_reduce(embed)"]
    ar = p.ops[1]
    # 8 tokens x hidden 256 x 2 B (bf16) = 4,096 B per chip; a ring all-reduce over 4 chips sends
    # 2 x (4 - 1) / 4 x 4,096 = 6,144 B per chip, once per step
    assert ar.count == 1 and ar.ici_bytes == 6144 and ar.block == "tp"
    one = predict_step(cfg, make_step(batch=8, context=256, tp=1), get_chip("v5e"))
    assert "all_reduce(embed)" not in [o.name for o in one.ops]  # one chip holds the whole table


def test_bundled_kernels_refuse_what_they_cannot_run():
    with pytest.raises(InputError, match="`kernels` bundled: decode over a contiguous KV cache"):
        _build(TINY, batch=1, context=8, kv_layout="contiguous", kernels="bundled")
    with pytest.raises(InputError, match="`kernels` bundled with `kv_dtype` int8"):
        _build(TINY, batch=1, context=8, kv_dtype="int8", kernels="bundled")
    import dataclasses

    from perfmodel.xla.reference import build_step

    odd = dataclasses.replace(get_model(TINY), head_dim=96)
    with pytest.raises(InputError, match="`kernels` bundled: ragged_paged_attention needs `head_dim` 64 or a "
                                         "multiple of 128 .* has 96"):
        import jax

        build_step(odd, make_step(batch=1, context=8), jax.devices("cpu")[:1], kv_layout="paged", kernels="bundled")


def test_bundled_decode_takes_head_dim_64():
    import jax

    # TINY: 4 q heads, 2 KV heads of head_dim 64; the kernel pairs two 64-lane heads per 128-lane window.
    cfg, (fn, args, _) = _build(TINY, batch=2, context=40, kernels="bundled")
    assert cfg.head_dim == 64
    out = jax.eval_shape(fn, *args)
    assert jax.tree_util.tree_leaves(out)[0].shape[0] == 2  # one next token per sequence


def test_prefetch_dma_belongs_to_the_op_reading_its_copy():
    from perfmodel.xla import hlo
    from perfmodel.xla.program import _consumer_op_name

    text = """HloModule m

ENTRY %main (w: bf16[256,512], x: bf16[8,256]) -> bf16[8,512] {
  %w = bf16[256,512]{1,0} parameter(0)
  %x = bf16[8,256]{1,0} parameter(1)
  %copy-start = (bf16[256,512]{1,0:S(1)}, bf16[256,512]{1,0}, u32[]) copy-start(%w)
  %copy-done = bf16[256,512]{1,0:S(1)} copy-done(%copy-start)
  %b = bf16[256,512]{1,0:S(1)} bitcast(%copy-done)
  ROOT %d = bf16[8,512]{1,0} dot(%x, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}, metadata={op_name="jit(step)/gate_up/dot_general"}
}
"""
    comps = hlo.parse_module(text)
    main_ = hlo.entry(comps)
    start = main_.by_name()["copy-start"]
    # copy-start -> copy-done -> bitcast -> the dot under gate_up: the DMA is gate_up's weight read
    assert _consumer_op_name(comps, main_, start, {}) == "jit(step)/gate_up/dot_general"
    assert _consumer_op_name(comps, main_, main_.by_name()["d"], {}) == ""  # nothing reads the root


@pytest.mark.slow  # ~6 s: two tiny steps jitted and run on the CPU
def test_paged_cache_decodes_like_the_contiguous_one():
    """The same decode step over the same K/V held contiguously and in the paged cache (pages in a
    shuffled order) writes the same new rows and samples the same tokens (CPU, real numbers)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    f32 = dict(weight_dtype="fp32", act_dtype="fp32")  # the CPU has no bf16 x bf16 -> f32 dot
    _, (fn_c, args_c, donate_c) = _build(TINY, batch=2, context=40, kv_layout="contiguous", **f32)
    _, (fn_p, args_p, donate_p) = _build(TINY, batch=2, context=40, **f32)
    rng = np.random.default_rng(0)
    B, S, NKV, D, page = 2, 40, 4, 64, 16  # 40 cache tokens: 3 pages of 16 per sequence
    positions = np.array([39, 23], np.int32)  # sequence 1 is shorter: its later slots are never read
    page_table = np.array([[4, 0, 2], [1, 5, 3]], np.int32)

    def value(a):
        if a.dtype == jnp.int32:
            return jnp.zeros(a.shape, a.dtype)
        if a.dtype == jnp.uint32:
            return jnp.array([0, 7], jnp.uint32)
        return jnp.asarray(rng.normal(0, 0.5, a.shape), a.dtype)

    vals_c = [value(a) for a in args_c]
    names = ["tokens", "positions", "embedding", "final_norm", "rng", "lm_head"]
    vals_c[1] = jnp.asarray(positions)
    vals_c[0] = jnp.array([[3], [9]], jnp.int32)
    # the paged step: the same non-cache arrays, page_table after the named ones, each layer's K/V pages
    kv_paged = []
    for i in range(0, len(donate_c), 2):
        k, v = (np.asarray(vals_c[donate_c[i]], np.float32), np.asarray(vals_c[donate_c[i + 1]], np.float32))
        pages = np.zeros((NKV, 6, 2, page, D), np.float32)
        for b in range(B):
            for t in range(S):
                pages[:, page_table[b, t // page], 0, t % page] = k[b, :, t]
                pages[:, page_table[b, t // page], 1, t % page] = v[b, :, t]
        kv_paged.append(jnp.asarray(pages))
    vals_p, ci, li = [], 0, 0
    non_cache_c = [v for i, v in enumerate(vals_c) if i not in donate_c]
    for i, a in enumerate(args_p):
        if i in donate_p:
            vals_p.append(kv_paged[ci])
            ci += 1
        elif a.shape == (B, 3) and a.dtype == jnp.int32:
            vals_p.append(jnp.asarray(page_table))
        else:
            vals_p.append(non_cache_c[li])
            li += 1
    assert len(names) <= li == len(non_cache_c)
    out_c, out_p = jax.jit(fn_c)(*vals_c), jax.jit(fn_p)(*vals_p)
    assert np.array_equal(np.asarray(out_c[0]), np.asarray(out_p[0]))  # the same sampled tokens
    # the new token's K row of layer 0, sequence 0 (position 39: page_table[0, 39 // 16] = page 2, row 39 % 16 = 7)
    np.testing.assert_allclose(np.asarray(out_p[1][:, 2, 0, 7], np.float32),
                               np.asarray(out_c[1][0, :, 39], np.float32), rtol=1e-5, atol=1e-5)
