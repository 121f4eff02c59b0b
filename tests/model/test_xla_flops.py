"""The model's matrix FLOPs agree with XLA's own count (cost_analysis of the compiled reference on CPU)."""

import pytest

jax = pytest.importorskip("jax")
import jax.numpy as jnp  # noqa: E402

from perfmodel.model.attention import flash_attention  # noqa: E402
from perfmodel.model.gemm import gemm  # noqa: E402


def _xla_flops(fn, *shapes):
    args = [jax.ShapeDtypeStruct(s, jnp.float32) for s in shapes]
    analysis = jax.jit(fn).lower(*args).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax returns one dict per computation
        analysis = analysis[0]
    return analysis["flops"]


@pytest.mark.parametrize("batch,m,n,k", [(1, 64, 128, 256), (1, 100, 300, 200), (3, 17, 40, 9), (1, 1, 512, 384)])
def test_gemm_flops_match_xla(batch, m, n, k):
    # f32 operands: on CPU a bf16 dot also counts its conversions to f32, which are not matrix FLOPs.
    xla = _xla_flops(lambda a, b: jnp.einsum("bmk,bkn->bmn", a, b), (batch, m, k), (batch, k, n))
    assert gemm(m=m, n=n, k=k, batch=batch).useful_flops == xla


@pytest.mark.parametrize("b,s,hq,hkv,d", [(2, 64, 4, 4, 32), (1, 48, 8, 2, 16), (1, 40, 4, 1, 24)])
def test_attention_matmul_flops_match_xla(b, s, hq, hkv, d):
    group = hq // hkv

    def two_matmuls(q, k, v):
        k = jnp.repeat(k, group, axis=1)
        v = jnp.repeat(v, group, axis=1)
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        return jnp.einsum("bhqk,bhkd->bhqd", scores, v)

    xla = _xla_flops(two_matmuls, (b, hq, s, d), (b, hkv, s, d), (b, hkv, s, d))
    model = flash_attention(batch=b, q_len=s, kv_len=s, q_heads=hq, kv_heads=hkv, head_dim=d, causal=False)
    assert model.useful_flops == xla


@pytest.mark.parametrize("s,d", [(64, 32), (72, 16)])
def test_causal_reference_computes_the_whole_square(s, d):
    # A dense causal reference (mask applied to full scores) does the non-causal matrix work; the model's issued
    # FLOPs with one block covering the whole sequence are exactly that, and its useful FLOPs the triangle.
    def causal(q, k, v):
        scores = jnp.einsum("bhqd,bhkd->bhqk", q, k)
        mask = jnp.tril(jnp.ones((s, s), dtype=bool))
        p = jnp.where(mask, jax.nn.softmax(jnp.where(mask, scores, -1e30), axis=-1), 0.0)
        return jnp.einsum("bhqk,bhkd->bhqd", p, v)

    xla = _xla_flops(causal, (1, 1, s, d), (1, 1, s, d), (1, 1, s, d))
    model = flash_attention(batch=1, q_len=s, kv_len=s, q_heads=1, kv_heads=1, head_dim=d, block_q=s, block_kv=s)
    assert model.mxu_flops == 4 * s * s * d
    # XLA adds the softmax's elementwise FLOPs (a few per score) to the two matmuls
    assert model.mxu_flops <= xla <= model.mxu_flops + 10 * s * s
    assert model.useful_flops == 4 * d * s * (s + 1) // 2
