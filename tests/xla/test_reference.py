"""The reference step traced on the CPU (no compiler): MLP layouts, per-layer arrays, refusals, cache keys."""

import pytest

from perfmodel.errors import InputError
from perfmodel.model.configs import get_model, mlp_params
from perfmodel.model.transformer import make_step

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
    # caches donated: k and v of each of the 2 layers, each its own [kv_heads, pages, page, head_dim] array;
    # 40 tokens in 16-token pages = 3 pages per sequence, 2 sequences = 6 pages
    assert len(donate) == 4 and all(args[i].shape == (4, 6, 16, 32) for i in donate)
    out = jax.eval_shape(fn, *args)
    assert out[0].shape == (2,) and [o.shape for o in out[1:]] == [(4, 6, 16, 32)] * 4


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
