"""analyze() on Pallas TPU kernels from other packages: Google's tokamax (grouped matmul, linear-softmax
cross-entropy forward and backward, splash attention forward and backward) and vLLM tpu-inference's ragged
paged attention v3. Each runs at two shapes; block fetches and manual DMA bytes are checked against an
instrumented TPU interpret-mode run (tests/schedule/recorder.py), or by hand where interpret mode cannot run
the kernel.

The packages are not perfmodel dependencies: ``make thirdparty-checks`` installs them into ``.thirdparty/``
(ignored) and runs this file with it on the path; elsewhere these tests skip, saying so.
"""

from __future__ import annotations

import importlib
import math
import os
import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from perfmodel.schedule.analyze import analyze_call
from perfmodel.schedule.device_kind import as_device
from perfmodel.schedule.extract import find_pallas_calls, trace
from tests.schedule.recorder import record_traffic

INSTALL = "make thirdparty-checks installs it into .thirdparty/"


def _tokamax(module: str):
    pytest.importorskip("tokamax", reason=f"tokamax is not installed ({INSTALL})")
    return importlib.import_module(f"tokamax._src.ops.{module}")


def _model_and_record(chip, fn, *args):
    """(the kernel's analysis in the recorded step order, the interpret-mode recording); one pallas_call."""
    with as_device(chip):  # tokamax's pipelines ask the chip for its tiling while tracing
        rec = record_traffic(fn, *args)
        calls = find_pallas_calls(trace(fn, *args), args)
    assert len(calls) == 1
    return analyze_call(calls[0], chip, order=np.array(rec.grid_points)), rec


def _assert_traffic_matches(kern, rec):
    assert kern.steps == len(rec.grid_points)
    for o in kern.operands:
        if o.pipelined:
            assert (o.transfers, o.hbm_bytes) == rec.count(o.role, o.name), o.name
    assert kern.work.manual_dma_bytes == rec.manual_hbm_bytes


def _randn(rng, shape, dtype=jnp.bfloat16):
    return jnp.asarray(rng.standard_normal(shape), dtype)


@pytest.mark.parametrize("sizes", [[128, 128, 128, 128], [100, 200, 12, 200]])
def test_tokamax_grouped_matmul(v5e, sizes):
    # tokamax's gmm runs its own pipeline (emit_pipeline) over the (group, row tile) pairs read from the group
    # sizes: no grid, all operands in HBM, every byte a manual DMA.
    rd = _tokamax("ragged_dot.pallas_mosaic_tpu_kernel")
    rng = np.random.default_rng(0)
    lhs, rhs = _randn(rng, (512, 256)), _randn(rng, (len(sizes), 256, 256))

    def fn(lhs, rhs, group_sizes):
        return rd.gmm(lhs, rhs, group_sizes, precision=jax.lax.Precision.DEFAULT, out_dtype=jnp.bfloat16,
                      tiling=(128, 128, 128))

    kern, rec = _model_and_record(v5e, fn, lhs, rhs, jnp.asarray(sizes, jnp.int32))
    _assert_traffic_matches(kern, rec)
    # At least the output (512 x 256 bf16 = 262,144 B) and every row of lhs once are moved.
    assert kern.work.manual_dma_bytes >= 2 * 512 * 256 * 2


@pytest.mark.parametrize("b, h, v", [(256, 256, 1024), (512, 128, 2048)])
def test_tokamax_linear_softmax_cross_entropy_forward_and_backward(v5e, b, h, v):
    ls = _tokamax("linear_softmax_cross_entropy_loss.pallas_mosaic_tpu_kernel")
    rng = np.random.default_rng(0)
    x, w = _randn(rng, (b, h)), _randn(rng, (h, v))
    labels = jnp.asarray(rng.integers(0, v, b), jnp.int32)
    blocks = dict(b_block_size=128, h_block_size=128, v_block_size=512)

    def fwd(x, labels, w):
        return ls.linear_softmax_cross_entropy_loss_fwd_pallas_mosaic_tpu(x, labels, w, **blocks)

    kern, rec = _model_and_record(v5e, fwd, x, labels, w)
    _assert_traffic_matches(kern, rec)
    # grid (b/128, v/512, h/128); w's block (h, v) changes every step: every step fetches 128 x 512 bf16.
    w_op = next(o for o in kern.operands if o.name == "w_ref")
    assert w_op.transfers == kern.steps == (b // 128) * (v // 512) * (h // 128)

    from jax.experimental.pallas import tpu as pltpu

    with as_device(v5e), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        _, lse = fwd(x, labels, w)

    def bwd(dout, lse, x, labels, w):
        return ls.linear_softmax_cross_entropy_loss_bwd_pallas_mosaic_tpu(dout, lse, x, labels, w, **blocks)

    # The backward kernel reads and writes its gradient tiles with DMAs whose sizes it computes from the
    # program ids (pl.multiple_of of a min): counted per step, exactly.
    kern, rec = _model_and_record(v5e, bwd, jnp.float32(1.0), lse, x, labels, w)
    _assert_traffic_matches(kern, rec)
    assert not any("slice size is computed at run time" in n for n in kern.notes)


@pytest.mark.parametrize("seq, block", [(512, 128), (768, 256)])
def test_tokamax_splash_attention_forward_and_backward(v5e, seq, block):
    sk = _tokamax("experimental.tpu.splash_attention.splash_attention_kernel")
    sm = _tokamax("experimental.tpu.splash_attention.splash_attention_mask")
    from jax.experimental.pallas import tpu as pltpu

    heads, dim = 2, 128
    cfg = sk.SplashConfig(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                          block_kv_dkv=block, block_kv_dkv_compute=block)
    kernel = sk.make_splash_mha(sm.CausalMask((seq, seq)), config=cfg, q_seq_shards=1)
    rng = np.random.default_rng(1)
    q, k, v = (_randn(rng, (heads, seq, dim)) for _ in range(3))
    kern, rec = _model_and_record(v5e, lambda q, k, v: kernel(q, k, v), q, k, v)
    _assert_traffic_matches(kern, rec)
    n = seq // block
    # Causal: q block row i needs kv blocks 0..i, n(n+1)/2 per head, fewer than the n^2 (q, kv) pairs.
    assert kern.steps == heads * n * (n + 1) // 2 < heads * n * n

    with as_device(v5e), pltpu.force_tpu_interpret_mode(pltpu.InterpretParams()):
        out, vjp = jax.vjp(lambda q, k, v: kernel(q, k, v), q, k, v)
    kern, rec = _model_and_record(v5e, vjp, jnp.ones_like(out))  # the fused dq/dk/dv kernel
    _assert_traffic_matches(kern, rec)
    dk = next(o for o in kern.operands if o.name == "dk_ref")
    assert dk.hbm_bytes == heads * seq * dim * 2  # each dk block written once


# ----- vLLM tpu-inference: ragged paged attention v3 -----

def _rpa_v3():
    """tpu-inference's RPA v3 kernel module, loaded without the package's __init__ (which imports vLLM)."""
    root = os.environ.get("PERFMODEL_TPU_INFERENCE_ROOT") or _site_root("tpu_inference")
    if root is None:
        pytest.skip(f"tpu-inference is not installed ({INSTALL})")
    parts = "tpu_inference.kernels.ragged_paged_attention.v3".split(".")
    for i in range(len(parts)):
        name = ".".join(parts[: i + 1])
        if name not in sys.modules or not hasattr(sys.modules[name], "__path__"):
            pkg = types.ModuleType(name)
            pkg.__path__ = [str(Path(root, *parts[: i + 1]))]
            sys.modules[name] = pkg
    return importlib.import_module("tpu_inference.kernels.ragged_paged_attention.v3.kernel")


def _site_root(package: str) -> str | None:
    for entry in sys.path:
        if entry and Path(entry, package, "kernels").is_dir():
            return entry
    return None


PAGE, KV_HEADS, Q_HEADS, DIM, PAGES_PER_SEQ = 16, 2, 4, 128, 8
#: Bytes of one token of the combined K/V cache: 2 KV heads x (K and V) x 128 x 2 B.
KV_TOKEN_BYTES = KV_HEADS * 2 * DIM * 2
#: Bytes of one token of q (or of the output): 4 query heads x 128 x 2 B.
Q_TOKEN_BYTES = Q_HEADS * DIM * 2


@pytest.mark.parametrize("kv_lens, cu_q_lens, decode", [
    ([40, 17, 128, 3], [0, 1, 2, 3, 4], True),
    ([64, 100, 0, 0], [0, 32, 48, 48, 48], False),
])
def test_tpu_inference_ragged_paged_attention_v3(v5e, monkeypatch, kv_lens, cu_q_lens, decode):
    rpa = _rpa_v3()
    # It reads the TPU generation from jax.devices() (a CPU here): say v5e, as analyze traces for v5e.
    monkeypatch.setattr(rpa, "get_tpu_version", lambda: 5)
    seqs, ntok = len(kv_lens), 64
    rng = np.random.default_rng(0)
    cache = jnp.zeros(rpa.get_kv_cache_shape(seqs * PAGES_PER_SEQ, PAGE, KV_HEADS, DIM, jnp.bfloat16), jnp.bfloat16)
    active = sum(1 for i in range(seqs) if kv_lens[i] > 0)
    args = (_randn(rng, (ntok, Q_HEADS, DIM)), _randn(rng, (ntok, KV_HEADS, DIM)), _randn(rng, (ntok, KV_HEADS, DIM)),
            cache, jnp.asarray(kv_lens, jnp.int32), jnp.asarray(rng.permutation(seqs * PAGES_PER_SEQ), jnp.int32),
            jnp.asarray(cu_q_lens, jnp.int32),
            jnp.asarray([active] * 3 if decode else [0, 0, active], jnp.int32))

    def fn(q, k, v, cache, kv_lens, pages, cu_q_lens, distribution):
        return rpa.ragged_paged_attention(q, k, v, cache, kv_lens, pages, cu_q_lens, distribution, sm_scale=0.1,
                                          d_block_sizes=(8, 32, 8, 32), p_block_sizes=(16, 32, 16, 32),
                                          m_block_sizes=(16, 32, 16, 32))

    with as_device(v5e):
        calls = find_pallas_calls(trace(fn, *args), args)
    # One kernel per case the wrapper compiles (decode and mixed here); only one has sequences to run.
    kerns = [analyze_call(c, v5e) for c in calls]
    moved = sum(k.work.manual_dma_bytes for k in kerns)
    q_tokens = cu_q_lens[-1]
    # The KV tokens each sequence attends to, the step's new K/V written into the cache, q read, output written.
    exact = sum(kv_lens) * KV_TOKEN_BYTES + q_tokens * (KV_TOKEN_BYTES + 2 * Q_TOKEN_BYTES)
    if decode:
        # 188 tokens x 1,024 B + 4 new tokens x (1,024 + 2 x 1,024) B = 192,512 + 12,288 = 204,800 B.
        assert moved == exact == 204_800
    else:
        # Prefill: 2 q blocks of sequence 0 each fetch the KV it needs up to their last row, in 32-token KV
        # blocks; at least the exact bytes, at most twice them.
        assert exact <= moved <= 2 * exact
    assert all(k.steps == math.prod(k.grid) for k in kerns)
