"""ragged_paged_attention beyond the shared contract (tests/kernels/test_contract.py: lowering, cost estimate,
tuned defaults, a small call vs the reference): mixed batches in interpret mode vs the jnp reference (and JAX's own
reference), the lengths the cost estimate assumes, block sizes and input errors."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.ragged_paged_attention import RaggedPagedAttentionBlockSizes as Blocks
from kernels.ragged_paged_attention import (
    DEFAULT_BLOCK_SIZES,
    default_block_sizes,
    ragged_paged_attention,
    ragged_paged_attention_reference,
)
from kernels.ragged_paged_attention.blocks import kv_row_layout
from kernels.ragged_paged_attention.plan import assumed_lengths, scalar_prefetch_bytes
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.shapes import parse_shape
from kernels.tuned import load_tuned_file

#: assert_allclose tolerances by dtype. bf16: probabilities are rounded to bf16 before the PV
#: matmul and the output carries one bf16 rounding (rel 2^-8) of O(1) values.
TOL = {
    jnp.dtype(jnp.float32): dict(rtol=1e-5, atol=1e-5),
    jnp.dtype(jnp.bfloat16): dict(rtol=2e-2, atol=2e-2),
}
HEAD_DIM = 128
SLOW = pytest.mark.slow


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    q: jax.Array
    kv_pages: jax.Array
    kv_lens: jax.Array
    page_table: jax.Array
    cu_q_lens: jax.Array
    num_seqs: jax.Array

    def args(self) -> tuple:
        return (self.q, self.kv_pages, self.kv_lens, self.page_table, self.cu_q_lens, self.num_seqs)


def make_batch(seed: int, q_lens: list[int], kv_lens: list[int], *, q_heads: int, kv_heads: int, page_size: int,
               dtype, total_tokens: int | None = None, spare_seqs: int = 2, pages_per_seq: int | None = None,
               head_dim: int = HEAD_DIM) -> Batch:
    """Random ragged batch. Slots past num_seqs and page-table entries past each context hold garbage
    (out-of-range page ids, huge lengths), so reading any of them would fail or show in the output."""
    rng = np.random.default_rng(seed)
    n = len(q_lens)
    max_seqs = n + spare_seqs
    needed = [-(-kv // page_size) for kv in kv_lens]
    pages_per_seq = pages_per_seq or max(needed) + 1
    num_pages = sum(needed) + 3
    total = sum(q_lens)
    total_tokens = total_tokens or total
    cu = np.full(max_seqs + 1, 10**6, np.int32)  # garbage past num_seqs
    cu[: n + 1] = np.concatenate([[0], np.cumsum(q_lens)])
    lens = np.full(max_seqs, 10**6, np.int32)
    lens[:n] = kv_lens
    table = np.full((max_seqs, pages_per_seq), num_pages + 999, np.int32)  # out of the cache
    ids = rng.permutation(num_pages).astype(np.int32)
    start = 0
    for s, count in enumerate(needed):
        table[s, :count] = ids[start:start + count]
        start += count
    return Batch(
        q=jnp.asarray(rng.standard_normal((total_tokens, q_heads, head_dim)), dtype),
        kv_pages=jnp.asarray(rng.standard_normal((num_pages, page_size, 2 * kv_heads, head_dim)), dtype),
        kv_lens=jnp.asarray(lens),
        page_table=jnp.asarray(table),
        cu_q_lens=jnp.asarray(cu),
        num_seqs=jnp.asarray([n], jnp.int32),
    )


def assert_matches(out: jax.Array, ref: jax.Array, live_tokens: int) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    out32, ref32 = np.asarray(out, np.float32), np.asarray(ref, np.float32)
    # Interpret mode fills fresh buffers with NaN, so a row the kernel never wrote shows up here.
    assert np.isfinite(out32).all()
    np.testing.assert_allclose(out32[:live_tokens], ref32[:live_tokens], **TOL[jnp.dtype(out.dtype)])
    assert not out32[live_tokens:].any(), "padding rows must be zero"


# (name, q_lens, kv_lens): partial last pages everywhere; "mixed" has decode tokens, a prefill
# chunk with cached context (37 new of 60) and a fresh prefill (5 of 5) in one call.
CASES = {
    "mixed": ([1, 37, 1, 5, 1], [17, 60, 100, 5, 33]),
    "decode": ([1, 1, 1, 1, 1, 1], [1, 16, 17, 64, 129, 40]),
    "prefill": ([23, 40], [23, 40]),
    "empty": ([2, 0, 1, 0, 9], [30, 12, 1, 5, 9]),  # sequences with no new token in between
}
# (case, (q_heads, kv_heads), dtype, page_size, block_q, block_kv, total_tokens or None). Every case in bf16, f32
# on the smallest call (decode, 8 rows) and on "empty" (f32 only); the other f32 rows: -m slow.
MATRIX = [
    pytest.param("mixed", (8, 2), jnp.float32, 16, 16, 128, 48,  # 3 padding rows; q blocks straddle sequences
                 marks=SLOW, id="mixed-gqa4-f32-48rows"),
    pytest.param("mixed", (8, 2), jnp.bfloat16, 16, 16, 128, None,  # 45 tokens: partial last q block
                 id="mixed-gqa4-bf16"),
    pytest.param("decode", (2, 2), jnp.float32, 8, 8, 128, 8,  # GQA 1, 16 pages per KV block, 2 padding rows
                 id="decode-gqa1-f32-8rows"),
    pytest.param("decode", (8, 1), jnp.bfloat16, 32, 16, 128, None, id="decode-gqa8-bf16"),
    pytest.param("decode", (16, 8), jnp.bfloat16, 16, 16, 128, None,  # 8 KV heads: padded 9-word token rows
                 id="decode-gqa2-bf16-8kv"),
    pytest.param("prefill", (8, 1), jnp.float32, 16, 16, 256, 64,  # GQA 8, one KV block spans 16 pages
                 marks=SLOW, id="prefill-gqa8-f32-64rows"),
    pytest.param("prefill", (2, 2), jnp.bfloat16, 16, 32, 128, None, id="prefill-gqa1-bf16"),  # GQA 1
    pytest.param("empty", (8, 2), jnp.float32, 16, 8, 128, 16, id="empty-gqa4-f32-16rows"),  # 4 padding rows
]


@pytest.mark.parametrize("case,heads,dtype,page_size,block_q,block_kv,total_tokens", MATRIX)
def test_matches_reference(case, heads, dtype, page_size, block_q, block_kv, total_tokens):
    q_lens, kv_lens = CASES[case]
    batch = make_batch(len(q_lens) + block_q, q_lens, kv_lens, q_heads=heads[0], kv_heads=heads[1],
                       page_size=page_size, dtype=dtype, total_tokens=total_tokens)
    out = ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=block_q, block_kv=block_kv),
                                 interpret=True)
    assert_matches(out, ragged_paged_attention_reference(*batch.args()), sum(q_lens))


# Head dim 64: two q heads share each 128-lane window of q and the output. (case, (q_heads, kv_heads), dtype,
# page_size, block_q): decode rows (one-row path) crossing page and KV-block boundaries (129, 64 = 4 whole 16-token
# pages), a prefill chunk and a fresh prefill (block path); odd q heads (GQA 3 leaves the last window half full).
HEAD_DIM_64 = [
    pytest.param("mixed", (8, 2), jnp.bfloat16, 16, 16, id="mixed-gqa4-bf16"),
    pytest.param("decode", (4, 4), jnp.float32, 16, 8, id="decode-gqa1-f32"),
    pytest.param("prefill", (3, 1), jnp.bfloat16, 16, 16, id="prefill-gqa3-bf16"),
]


@pytest.mark.parametrize("case,heads,dtype,page_size,block_q", HEAD_DIM_64)
def test_head_dim_64_matches_reference(case, heads, dtype, page_size, block_q):
    q_lens, kv_lens = CASES[case]
    batch = make_batch(64 + len(q_lens), q_lens, kv_lens, q_heads=heads[0], kv_heads=heads[1],
                       page_size=page_size, dtype=dtype, head_dim=64)
    out = ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=block_q, block_kv=128), interpret=True)
    assert out.shape == (sum(q_lens), heads[0], 64)
    assert_matches(out, ragged_paged_attention_reference(*batch.args()), sum(q_lens))


def test_head_dim_64_features_match_reference():
    """Window, soft cap and sinks at head dim 64 and GQA 2 (each window holds one group): decode and prefill."""
    kw = dict(sliding_window=50, soft_cap=2.0, sinks=jnp.linspace(-1.0, 2.0, 4, dtype=jnp.float32))
    q_lens, kv_lens = [1, 23, 1], [130, 140, 70]
    batch = make_batch(23, q_lens, kv_lens, q_heads=4, kv_heads=2, page_size=16, dtype=jnp.bfloat16, head_dim=64)
    out = ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=16, block_kv=128), interpret=True, **kw)
    assert_matches(out, ragged_paged_attention_reference(*batch.args(), **kw), sum(q_lens))


FEATURES = {
    "window": dict(sliding_window=20),  # 130-token decode: its first KV block is skipped, the second masked
    "softcap": dict(soft_cap=2.0),
    "sinks": dict(sinks=np.linspace(-3.0, 3.0, 16, dtype=np.float32)),
    "all": dict(sliding_window=50, soft_cap=2.0, sinks=np.linspace(-1.0, 2.0, 16, dtype=np.float32)),
}


@pytest.mark.parametrize("feature", sorted(FEATURES))
def test_features_match_reference_gqa16(feature):
    """Sliding window, soft cap and sinks, 16 q heads on one KV head (GQA 16): decode tokens (one-row path) and a
    prefill chunk (block path) across KV blocks and page boundaries."""
    kw = {k: jnp.asarray(v) if isinstance(v, np.ndarray) else v for k, v in FEATURES[feature].items()}
    q_lens, kv_lens = [1, 23, 1, 1], [130, 140, 1, 70]
    batch = make_batch(21, q_lens, kv_lens, q_heads=16, kv_heads=1, page_size=16, dtype=jnp.bfloat16)
    out = ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=16, block_kv=128), interpret=True, **kw)
    ref = ragged_paged_attention_reference(*batch.args(), **kw)
    assert_matches(out, ref, sum(q_lens))
    plain = np.asarray(ragged_paged_attention_reference(*batch.args()), np.float32)
    assert np.abs(np.asarray(ref, np.float32) - plain).max() > 0.05, "the feature must change the result"


@pytest.mark.parametrize("kwargs,match", [
    (dict(sliding_window=0), "sliding_window=0 must be a positive int"),
    (dict(soft_cap=-1.0), "soft_cap=-1.0 must be a positive number"),
    (dict(sinks=jnp.zeros(3)), r"sinks shape \(3,\) must be \(4,\)"),
])
def test_bad_features_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ragged_paged_attention(*_good().args(), block_sizes=Blocks(block_q=8, block_kv=128), interpret=True, **kwargs)


def test_no_live_sequences_gives_zeros():
    batch = make_batch(9, [3, 1], [5, 20], q_heads=2, kv_heads=2, page_size=16, dtype=jnp.float32)
    out = ragged_paged_attention(*dataclasses.replace(batch, num_seqs=jnp.array([0], jnp.int32)).args(),
                                 block_sizes=Blocks(block_q=8, block_kv=128), interpret=True)
    assert out.shape == (4, 2, 128) and not np.asarray(out).any()


def test_under_an_outer_jit_with_traced_lengths_and_custom_scale():
    q_lens, kv_lens = [3, 1, 12], [40, 7, 12]
    batch = make_batch(7, q_lens, kv_lens, q_heads=4, kv_heads=1, page_size=16, dtype=jnp.float32)
    blocks = Blocks(block_q=8, block_kv=128)
    fn = jax.jit(lambda *a: ragged_paged_attention(*a, sm_scale=0.05, block_sizes=blocks, interpret=True))
    out = fn(*batch.args())
    assert_matches(out, ragged_paged_attention_reference(*batch.args(), sm_scale=0.05), sum(q_lens))


def test_agrees_with_jax_reference_implementation():
    """JAX ships its own ragged paged attention (jax.experimental.pallas.ops.tpu.ragged_paged_attention) in the
    same combined layout. Its kernel does not run in TPU interpret mode in this jax (its reshaped-ref DMAs are
    not interpretable), so our kernel is compared with its reference function on the same batch."""
    from jax.experimental.pallas.ops.tpu import ragged_paged_attention as jax_rpa

    q_lens, kv_lens = [1, 20, 3], [40, 30, 3]  # decode, chunk with context, fresh prefill (JAX's reference
    batch = make_batch(11, q_lens, kv_lens, q_heads=8, kv_heads=2, page_size=16, dtype=jnp.float32,  # is eager:
                       spare_seqs=0)  # few sequences keep it quick)
    out = ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=16, block_kv=128), interpret=True)
    num_pages = batch.kv_pages.shape[0]
    table = jnp.where(batch.page_table < num_pages, batch.page_table, 0)  # its reference reads every entry
    theirs = jax_rpa.ref_ragged_paged_attention(batch.q, batch.kv_pages, batch.kv_lens, table, batch.cu_q_lens,
                                                batch.num_seqs, sm_scale=1 / np.sqrt(HEAD_DIM))
    np.testing.assert_allclose(np.asarray(out)[: sum(q_lens)], np.asarray(theirs), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("heads", [(4, 4), (16, 4), (16, 2)], ids=["gqa1", "gqa4", "gqa8"])
@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32], ids=["bf16", "f32"])
def test_matches_reference_larger(heads, dtype):
    rng = np.random.default_rng(heads[0] + heads[1])
    q_lens = [int(x) for x in rng.integers(1, 4, 20)] + [97, 150]
    kv_lens = [q + int(rng.integers(0, 300)) for q in q_lens]
    batch = make_batch(3, q_lens, kv_lens, q_heads=heads[0], kv_heads=heads[1], page_size=16, dtype=dtype,
                       total_tokens=320)
    out = ragged_paged_attention(*batch.args(), interpret=True)  # tpu-v5e defaults: 32 x 256
    assert_matches(out, ragged_paged_attention_reference(*batch.args()), sum(q_lens))


# ----- the lengths the cost estimate assumes (tests/kernels/test_contract.py: it equals the op model's) -----


def test_assumed_lengths_share_tokens_and_cache_evenly():
    # 512 tokens over min(64 seqs, 512) = 64 sequences: 8 each; cache share min(128, 4096 // 64 = 64) pages
    # of 16 tokens = 1024 tokens of context each.
    q_lens, kv_lens = assumed_lengths(total_tokens=512, max_seqs=64, pages_per_seq=128, num_pages=4096,
                                      page_size=16)
    assert q_lens.tolist() == [8] * 64 and kv_lens.tolist() == [1024] * 64
    # 10 tokens over min(4, 10) = 4 sequences: 3, 3, 2, 2; share min(2, 5 // 4 = 1) page of 8 = 8 tokens,
    # raised to the query length where that is longer (a context includes its queries).
    q_lens, kv_lens = assumed_lengths(total_tokens=10, max_seqs=4, pages_per_seq=2, num_pages=5, page_size=8)
    assert q_lens.tolist() == [3, 3, 2, 2] and kv_lens.tolist() == [8, 8, 8, 8]


# ----- block sizes -----


@pytest.mark.parametrize("chip", sorted(DEFAULT_BLOCK_SIZES))
def test_defaults_fit_every_chip(chip):
    blocks = default_block_sizes(chip, q_dtype=jnp.bfloat16, page_size=16)
    assert blocks == DEFAULT_BLOCK_SIZES[chip]
    blocks.validate(q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16, page_size=16, q_heads_per_kv_head=4, kv_heads=8,
                    head_dim=128, chip=chip)


def test_defaults_round_to_dtype_and_page_size(monkeypatch):
    import kernels.ragged_paged_attention.blocks as rb

    # The fitting rule on a hand-picked table (the stored one comes from the advisor): block_q 24 -> 32 for
    # bf16 (sublane tile 16), 24 for f32 (tile 8); block_kv 256 -> lcm(128, 384) = 384 for 384-token pages.
    monkeypatch.setattr(rb, "default_block_table", lambda: {"tpu-v5e": {"bf16": Blocks(block_q=24, block_kv=256)}})
    assert default_block_sizes("tpu-v5e", q_dtype=jnp.bfloat16, page_size=384) == Blocks(block_q=32, block_kv=384)
    assert default_block_sizes("tpu-v5e", q_dtype=jnp.float32, page_size=16) == Blocks(block_q=24, block_kv=256)
    # A chip the table lacks takes tpu-v5e's defaults.
    assert default_block_sizes("tpu-v6e", q_dtype=jnp.float32, page_size=16) == Blocks(block_q=24, block_kv=256)


def test_untuned_chips_take_the_v5e_defaults():
    # The stored defaults themselves: tests/kernels/test_contract.py. Chips before tpu-v4 are not tuned: they take
    # tpu-v5e's defaults.
    stored = load_tuned_file("ragged_paged_attention")["defaults"]
    assert "tpu-v3" not in stored
    assert default_block_sizes("tpu-v3", q_dtype=jnp.bfloat16, page_size=16) == DEFAULT_BLOCK_SIZES["tpu-v5e"]


@pytest.mark.parametrize("chip", sorted(DEFAULT_BLOCK_SIZES))
def test_stored_defaults_pass_validation_for_f32_at_the_tuned_shape(chip):
    # bf16, the tuned dtype, lowers at the tuned shape with the stored blocks in tests/kernels/test_contract.py
    # (the wrapper validates them). f32, not tuned separately, fits too (raises over the default scoped VMEM limit).
    data = load_tuned_file("ragged_paged_attention")
    shapes = {parse_shape(t).name: parse_shape(t).shape for t in data["shapes"]["bf16"]}
    page_size, kv_heads = shapes["kv_pages"][1], shapes["kv_pages"][2] // 2
    blocks = default_block_sizes(chip, q_dtype=jnp.float32, page_size=page_size)
    blocks.validate(q_dtype=jnp.float32, kv_dtype=jnp.float32, page_size=page_size, kv_heads=kv_heads,
                    q_heads_per_kv_head=shapes["q"][1] // kv_heads, head_dim=shapes["q"][2], chip=chip)


def test_vmem_bytes_by_hand():
    # block_q 16, block_kv 128, G 2, one KV head, head_dim 128, f32 q and KV: rows = 32, q_heads = 2.
    # q+out blocks 2*2*16*(2*128)*4 = 65536; sink rows 2 * [2, 128] f32 (2 rows stay 2) = 2048;
    # KV slots 2 * (128 tokens * 2 rows) * 128 * 4 = 262144; acc 32*128*4 = 16384; max/sum 2*32*128*4 = 32768;
    # temporaries: the f32 score tile 32*128*4 = 16384 (x1 with a bf16 VPU, x1.375 = 22528 without, or with no
    # chip given) + a [32, 128] f32 tile 16384 + one head's K and V widened, 2*128*128*4 = 131072.
    blocks = Blocks(block_q=16, block_kv=128)
    kw = dict(q_heads_per_kv_head=2, head_dim=128, q_dtype=jnp.float32, kv_dtype=jnp.float32)
    fixed = 65536 + 2048 + 262144 + 16384 + 32768 + 16384 + 131072
    assert blocks.vmem_bytes(**kw) == fixed + 22528
    assert blocks.vmem_bytes(**kw, chip=get_chip("tpu-v5e")) == fixed + 16384
    assert blocks.vmem_bytes(**kw, chip=get_chip("tpu-v4")) == blocks.vmem_bytes(**kw)
    # Two KV heads: the q/out blocks, sinks, KV slots and state double; the temporaries (one head at a time) do not.
    assert blocks.vmem_bytes(**kw, kv_heads=2) == fixed + 22528 + 65536 + 2048 + 262144 + 16384 + 32768


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_q=0, block_kv=128), "block_q must be a positive int"),
    (dict(block_q=16, block_kv=-128), "block_kv must be a positive int"),
    (dict(block_q=16, block_kv=200), r"block_kv=200 must be a multiple of 128.*try 256"),
])
def test_block_sizes_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Blocks(**kwargs)


@pytest.mark.parametrize("blocks,page_size,match", [
    (Blocks(block_q=8, block_kv=128), 16, r"block_q=8 must be a multiple of 16 for bfloat16"),
    (Blocks(block_q=16, block_kv=128), 48, r"block_kv=128 must be a multiple of page_size=48"),
    (Blocks(block_q=256, block_kv=8192), 16, r"block_sizes \(block_q=256, block_kv=8192\) need .* of VMEM, over the 16(\.0)? MiB scoped limit of tpu-v5e"),
])
def test_block_sizes_validate_against_the_call(blocks, page_size, match):
    with pytest.raises(ValueError, match=match):
        blocks.validate(q_dtype=jnp.bfloat16, kv_dtype=jnp.bfloat16, page_size=page_size, q_heads_per_kv_head=4,
                        head_dim=128, chip="tpu-v5e")


def test_block_sizes_for_a_gpu_chip_are_refused():
    with pytest.raises(ValueError, match="chip: 'h100-sxm'"):
        Blocks(block_q=16, block_kv=128).validate(q_dtype=jnp.float32, kv_dtype=jnp.float32, page_size=16,
                                                      q_heads_per_kv_head=1, head_dim=128, chip="h100-sxm")


# ----- input errors -----


def _good() -> Batch:
    return make_batch(5, [2, 1], [20, 9], q_heads=4, kv_heads=2, page_size=16, dtype=jnp.float32)


def _replace(**changes) -> tuple:
    return dataclasses.replace(_good(), **changes).args()


@pytest.mark.parametrize("make_args,match", [
    (lambda: _replace(q=jnp.zeros((3, 4))), r"q must be \[total_tokens, q_heads, head_dim\]"),
    (lambda: _replace(kv_pages=_good().kv_pages[:, :, :-1]), r"kv_pages: dimension 2 \(3\) must be 2 \* kv_heads"),
    (lambda: _replace(kv_pages=_good().kv_pages[..., 0]), r"kv_pages: expected rank 4"),
    (lambda: _replace(kv_pages=_good().kv_pages.astype(jnp.bfloat16)), "kv_pages dtype bfloat16 must equal q's float32"),
    (lambda: _replace(kv_pages=_good().kv_pages.astype(jnp.float16)), r"kv_pages: dtype float16 is not supported"),
    (lambda: _replace(q=jnp.ones((3, 3, 128))), r"kv_heads=2 must divide q's q_heads=3"),
    (lambda: _replace(q=jnp.ones((3, 4, 256))), "kv_pages: head_dim 128 does not match q's head_dim 256"),
    (lambda: _replace(q=jnp.ones((3, 4, 96)), kv_pages=jnp.ones((4, 16, 4, 96))),
     "head_dim=96 must be 64 or a multiple of 128.*pad the heads to 128"),
    (lambda: _replace(kv_pages=jnp.ones((8, 3, 2, 128)), q=jnp.ones((3, 4, 128))),
     r"page_size \* 2 \* kv_heads = 6 rows must be a multiple of 8 for float32 pages.*page_size a multiple of 4"),
    (lambda: _replace(kv_lens=_good().kv_lens[:-1]), r"kv_lens shape .* must be \(4,\)"),
    (lambda: _replace(cu_q_lens=_good().cu_q_lens[:-1]), r"cu_q_lens shape .* must be \(5,\)"),
    (lambda: _replace(kv_lens=_good().kv_lens.astype(jnp.float32)), "kv_lens must be int32"),
    (lambda: _replace(num_seqs=jnp.array([1, 2], jnp.int32)), "num_seqs must be an int or a \\[1\\] array"),
    (lambda: _replace(num_seqs=jnp.array([5], jnp.int32)), r"num_seqs=5 must be in \[0, 4\]"),
    (lambda: _replace(page_table=_good().page_table.at[1, 0].set(1000)),
     r"page_table\[1, 0\]=1000 points outside the cache"),
    (lambda: _replace(page_table=_good().page_table.at[0, 1].set(-1)), r"page_table\[0, 1\]=-1 points outside"),
    (lambda: _replace(kv_lens=_good().kv_lens.at[1].set(0)), r"kv_lens\[1\]=0 is smaller than .* query length 1"),
    (lambda: _replace(kv_lens=_good().kv_lens.at[0].set(100)), r"kv_lens\[0\]=100 needs more than pages_per_seq"),
    (lambda: _replace(cu_q_lens=_good().cu_q_lens.at[0].set(1)), r"cu_q_lens\[0\] must be 0"),
    (lambda: _replace(cu_q_lens=_good().cu_q_lens.at[2].set(1)), "cu_q_lens must be non-decreasing"),
    (lambda: _replace(cu_q_lens=_good().cu_q_lens.at[2].set(9)), r"cu_q_lens\[num_seqs\]=9 exceeds q's total"),
])
def test_bad_inputs_raise_naming_the_argument(make_args, match):
    with pytest.raises(ValueError, match=match):
        ragged_paged_attention(*make_args(), block_sizes=Blocks(block_q=8, block_kv=128), interpret=True)


def test_bad_block_sizes_raise_before_running():
    with pytest.raises(ValueError, match="block_kv=128 must be a multiple of page_size=48"):
        batch = make_batch(5, [2], [20], q_heads=2, kv_heads=2, page_size=48, dtype=jnp.float32)
        ragged_paged_attention(*batch.args(), block_sizes=Blocks(block_q=8, block_kv=128), interpret=True)


def test_scalar_prefetch_bytes_by_hand():
    # kv_lens 64 + page table 64 * 128 + cu_q_lens 65 + two ranges of 512 / 32 = 16 q blocks:
    # 64 + 8192 + 65 + 32 = 8353 int32 = 33412 bytes.
    assert scalar_prefetch_bytes(max_seqs=64, pages_per_seq=128, total_tokens=512, block_q=32) == 33412


def test_a_page_table_too_big_for_smem_is_refused():
    # 4096 x 128 int32 = 2 MiB of page table alone; tpu-v5e has 1 MiB of SMEM.
    q = jnp.ones((16, 2, 128), jnp.float32)
    pages = jnp.ones((8, 16, 4, 128), jnp.float32)
    table = jnp.zeros((4096, 128), jnp.int32)
    with pytest.raises(ValueError, match=r"page_table \[4096, 128\] .* SMEM, over the 1048576 B of tpu-v5e"):
        ragged_paged_attention(q, pages, jnp.zeros(4096, jnp.int32), table, jnp.zeros(4097, jnp.int32), 1,
                               block_sizes=Blocks(block_q=8, block_kv=128), interpret=True)


# ----- int8 / fp8 KV pages with scales -----

from kernels.ragged_paged_attention import dequantize_kv_pages, quantize_kv_pages  # noqa: E402

#: Kernel vs the reference on the same codes and scales, by cache dtype: the reference dequantizes in f32, the kernel
#: widens the codes exactly to bf16 and rounds the V-scaled probabilities to bf16 (as on the bf16 path).
QUANT_TOL = {"int8": dict(rtol=2e-2, atol=2e-2), "float8_e4m3fn": dict(rtol=2e-2, atol=2e-2)}
#: Largest |difference| from the unquantized bf16 reference (the quantization error) at these O(1) outputs, by cache
#: dtype: int8 keeps ~7 bits of each row's range, e4m3 3 mantissa bits.
QUANT_ERROR = {"int8": 0.06, "float8_e4m3fn": 0.25}


def quantized(batch: Batch, dtype, layout: str) -> tuple[Batch, jax.Array, jax.Array]:
    """(batch over the quantized cache, the scales, the same scales with NaN wherever the kernel must not look: the
    rows past each context in its last page (per-token) and every page no live sequence owns)."""
    codes, scales = quantize_kv_pages(batch.kv_pages, dtype=dtype, layout=layout)
    num_pages, page_size = batch.kv_pages.shape[:2]
    lens, table, n = np.asarray(batch.kv_lens), np.asarray(batch.page_table), int(batch.num_seqs[0])
    live = np.zeros((num_pages, page_size), bool)
    for s in range(n):
        for t in range(int(lens[s])):
            live[table[s, t // page_size], t % page_size] = True
    mask = live if layout == "per-token" else live.any(axis=1)
    poisoned = jnp.where(jnp.asarray(mask)[..., None], scales, jnp.nan)
    return dataclasses.replace(batch, kv_pages=codes), scales, poisoned


# (case, (q_heads, kv_heads), cache dtype, scale layout, page_size, block_q, chip). The default run keeps one int8
# and one fp8 call; the rest is -m slow.
QUANT_MATRIX = [
    pytest.param("mixed", (8, 2), jnp.int8, "per-token", 16, 16, "tpu-v5e", id="mixed-gqa4-int8-per-token"),
    pytest.param("decode", (4, 2), jnp.int8, "per-page", 32, 16, "tpu-v5e", marks=SLOW, id="decode-gqa2-int8-per-page"),
    pytest.param("empty", (8, 2), jnp.int8, "per-page", 16, 16, "tpu-v5e", marks=SLOW, id="empty-gqa4-int8-per-page"),
    pytest.param("prefill", (4, 4), jnp.float8_e4m3fn, "per-page", 16, 16, "tpu-v6e", marks=SLOW,
                 id="prefill-gqa1-fp8-per-page"),
    pytest.param("decode", (8, 2), jnp.float8_e4m3fn, "per-token", 16, 16, "tpu-v6e", id="decode-gqa4-fp8-per-token"),
    # One KV head: a 32-bit word holds two tokens, the block is scored evens first (kernel.token_order).
    pytest.param("mixed", (8, 1), jnp.int8, "per-token", 16, 16, "tpu-v5e", marks=SLOW, id="mixed-gqa8-kv1-int8"),
    pytest.param("decode", (4, 1), jnp.float8_e4m3fn, "per-page", 16, 16, "tpu-v6e", marks=SLOW,
                 id="decode-gqa4-kv1-fp8-per-page"),
]


@pytest.mark.parametrize("case,heads,dtype,layout,page_size,block_q,chip", QUANT_MATRIX)
def test_quantized_cache_matches_reference(case, heads, dtype, layout, page_size, block_q, chip):
    """Ragged lengths, partial last pages, KV blocks of several pages, garbage page-table entries past each context
    (make_batch) and NaN scales wherever no live token is: the kernel equals the reference on the clean scales."""
    q_lens, kv_lens = CASES[case]
    batch = make_batch(40 + len(q_lens), q_lens, kv_lens, q_heads=heads[0], kv_heads=heads[1], page_size=page_size,
                       dtype=jnp.bfloat16)
    quant, scales, poisoned = quantized(batch, dtype, layout)
    out = ragged_paged_attention(*quant.args(), kv_scales=poisoned, block_sizes=Blocks(block_q=block_q, block_kv=128),
                                 chip=chip, interpret=True)
    ref = ragged_paged_attention_reference(*quant.args(), kv_scales=scales)
    name = jnp.dtype(dtype).name
    live = sum(q_lens)
    out32 = np.asarray(out, np.float32)
    assert np.isfinite(out32).all() and not out32[live:].any()
    np.testing.assert_allclose(out32[:live], np.asarray(ref, np.float32)[:live], **QUANT_TOL[name])
    plain = np.asarray(ragged_paged_attention_reference(*batch.args()), np.float32)[:live]
    assert np.abs(out32[:live] - plain).max() < QUANT_ERROR[name]


@SLOW
@pytest.mark.parametrize("kv_heads", [1, 2])
def test_quantized_cache_with_window_soft_cap_and_sinks(kv_heads):
    """The window masks by position: with one KV head the block's tokens are scored evens first."""
    kw = dict(sliding_window=50, soft_cap=2.0, sinks=jnp.linspace(-1.0, 2.0, 8, dtype=jnp.float32))
    q_lens, kv_lens = [1, 23, 1], [130, 140, 70]
    batch = make_batch(31, q_lens, kv_lens, q_heads=8, kv_heads=kv_heads, page_size=16, dtype=jnp.bfloat16)
    quant, scales, poisoned = quantized(batch, jnp.int8, "per-token")
    out = ragged_paged_attention(*quant.args(), kv_scales=poisoned, block_sizes=Blocks(block_q=16, block_kv=128),
                                 interpret=True, **kw)
    ref = ragged_paged_attention_reference(*quant.args(), kv_scales=scales, **kw)
    assert_matches(out, ref, sum(q_lens))


def test_quantize_kv_pages_by_hand():
    # One page of 2 tokens, K and V of one head, head_dim 4. Token 0's K row [1, -2, 0.5, 0.25]: max |x| 2, int8
    # scale 2 / 127, codes round(x * 63.5) = [64 (63.5 to even), -127, 32 (31.75), 16 (15.875)]; fp8: scale 2 / 448,
    # codes x * 224 = [224, -448, 112, 56], all exact in e4m3.
    pages = jnp.asarray([[[[1.0, -2.0, 0.5, 0.25], [0.0, 0.0, 0.0, 0.0]],
                          [[4.0, 0.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]]]], jnp.float32)  # [1, 2, 2, 4]
    codes, scales = quantize_kv_pages(pages, dtype=jnp.int8, layout="per-token")
    assert codes.dtype == jnp.int8 and scales.shape == (1, 2, 2)
    assert codes[0, 0, 0].tolist() == [64, -127, 32, 16] and codes[0, 0, 1].tolist() == [0, 0, 0, 0]
    np.testing.assert_allclose(np.asarray(scales), [[[2 / 127, 0.0], [4 / 127, 1 / 127]]], rtol=1e-6)
    codes, scales = quantize_kv_pages(pages, dtype=jnp.float8_e4m3fn, layout="per-token")
    assert np.asarray(codes[0, 0, 0], np.float32).tolist() == [224.0, -448.0, 112.0, 56.0]
    # Per page: K's slice is both tokens' K rows (max |x| 4: scale 4 / 127), V's both V rows (max 1).
    codes, scales = quantize_kv_pages(pages, dtype=jnp.int8, layout="per-page")
    assert scales.shape == (1, 2) and codes.shape == pages.shape
    np.testing.assert_allclose(np.asarray(scales), [[4 / 127, 1 / 127]], rtol=1e-6)
    assert codes[0, 0, 0].tolist() == [32, -64, 16, 8]  # x * 31.75, rounded half to even (15.875 -> 16, 7.9375 -> 8)
    np.testing.assert_allclose(np.asarray(dequantize_kv_pages(codes, scales)), np.asarray(pages), atol=2 / 127)


@pytest.mark.parametrize("dtype,kv_heads,words,stride", [
    # bf16, 8 KV heads: 16 K/V rows in 8 32-bit words per token. At a stride of 8 the words of 8 tokens fall in
    # banks 0, 8, 16, 24, 0, 8, 16, 24 of 32 (two tokens per bank); at 9: 0, 9, 18, 27, 4, 13, 22, 31 (distinct).
    (jnp.bfloat16, 8, 8, 9),
    (jnp.bfloat16, 4, 4, 4),  # stride 4: banks 0, 4, ..., 28, distinct already
    (jnp.bfloat16, 1, 1, 1),  # one word per token: unstrided
    (jnp.float32, 1, 2, 2),  # f32: one K/V row per word; banks 0, 2, ..., 14
    (jnp.float32, 8, 16, 17),  # stride 16: banks 0, 16, 0, ... -> 17: 0, 17, 2, 19, 4, 21, 6, 23
])
def test_kv_row_layout_by_hand(dtype, kv_heads, words, stride):
    layout = kv_row_layout(dtype, kv_heads)
    assert (layout.words, layout.stride, layout.pack) == (words, stride, 4 // jnp.dtype(dtype).itemsize)


def test_vmem_bytes_count_the_padded_kv_rows():
    # block_kv 128, 8 KV heads, bf16: KV slots 2 * 128 tokens * 9 words (8 + 1 padding) * 128 lanes * 4 B = 1179648;
    # an int8 cache keeps unpadded rows: 2 * (128 * 16 rows) * 128 * 1 B = 524288, plus its scale slots
    # 2 * [16, 128] f32 = 16384. Everything else is the same: 1179648 - 524288 - 16384 = 638976.
    blocks = Blocks(block_q=16, block_kv=128)
    kw = dict(q_heads_per_kv_head=2, head_dim=128, q_dtype=jnp.bfloat16, kv_heads=8)
    assert blocks.vmem_bytes(**kw, kv_dtype=jnp.bfloat16) - blocks.vmem_bytes(**kw, kv_dtype=jnp.int8) == 638976


def test_vmem_bytes_of_a_quantized_cache_by_hand():
    # block_kv 128, 2 KV heads, head_dim 128: int8 KV slots 2 * (128 tokens * 4 rows) * 128 * 1 B = 131072 instead
    # of bf16's 262144, plus two slots of scales [4, 128] f32 = 2 * 4 * 128 * 4 = 4096: 126976 fewer bytes.
    blocks = Blocks(block_q=16, block_kv=128)
    kw = dict(q_heads_per_kv_head=2, head_dim=128, q_dtype=jnp.bfloat16, kv_heads=2)
    assert blocks.vmem_bytes(**kw, kv_dtype=jnp.bfloat16) - blocks.vmem_bytes(**kw, kv_dtype=jnp.int8) == 126976


def _int8_good() -> tuple[Batch, jax.Array]:
    batch = make_batch(5, [2, 1], [20, 9], q_heads=4, kv_heads=2, page_size=16, dtype=jnp.bfloat16)
    codes, scales = quantize_kv_pages(batch.kv_pages)
    return dataclasses.replace(batch, kv_pages=codes), scales


@pytest.mark.parametrize("make,match", [
    (lambda b, s: (b, None, "tpu-v5e"), r"kv_scales: int8 kv_pages need float32 scales, \[6, 16, 4\] \(per token\) "
                                        r"or \[6, 4\] \(per page\); quantize with .*quantize_kv_pages"),
    (lambda b, s: (b, s[:, :, :2], "tpu-v5e"), r"kv_scales: float32\[6, 16, 2\] must be float32 \[6, 16, 4\]"),
    (lambda b, s: (b, s.astype(jnp.bfloat16), "tpu-v5e"), r"kv_scales: bfloat16\[6, 16, 4\] must be float32"),
    (lambda b, s: (dataclasses.replace(b, kv_pages=b.kv_pages.astype(jnp.bfloat16)), s, "tpu-v5e"),
     "kv_scales: bfloat16 kv_pages take no scales; drop kv_scales"),
    (lambda b, s: (dataclasses.replace(b, kv_pages=b.kv_pages.astype(jnp.float8_e4m3fn)), s, "tpu-v5e"),
     "kv_pages: dtype float8_e4m3fn needs fp8 support, which tpu-v5e lacks"),
    (lambda b, s: (dataclasses.replace(b, kv_pages=b.kv_pages.astype(jnp.float8_e4m3fn)), s, "tpu-v4"),
     "kv_pages: dtype float8_e4m3fn needs fp8 support, which tpu-v4 lacks"),
    (lambda b, s: (dataclasses.replace(b, q=b.q.astype(jnp.float16)), s, "tpu-v5e"),
     r"q: dtype float16 cannot read int8 kv_pages; use one of \('bfloat16', 'float32'\)"),
    (lambda b, s: (dataclasses.replace(b, kv_pages=jnp.zeros((6, 16, 6, 128), jnp.int8), q=jnp.zeros((3, 3, 128))),
                   jnp.ones((6, 16, 6), jnp.float32), "tpu-v5e"),
     r"kv_pages: int8 pages need kv_heads 1 or even .* got kv_heads=3; pad the KV heads to 4"),
])
def test_bad_quantized_inputs_raise(make, match):
    batch, scales, chip = make(*_int8_good())
    with pytest.raises(ValueError, match=match):
        ragged_paged_attention(*batch.args(), kv_scales=scales, block_sizes=Blocks(block_q=16, block_kv=128), chip=chip,
                               interpret=True)


@pytest.mark.parametrize("kwargs,match", [
    (dict(layout="per-tensor"), r"layout='per-tensor' must be one of \('per-token', 'per-page'\)"),
    (dict(dtype=jnp.int4), "dtype=int4 must be int8 or float8_e4m3fn"),
])
def test_quantize_kv_pages_rejects_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        quantize_kv_pages(jnp.ones((1, 16, 2, 128), jnp.bfloat16), **kwargs)


def test_quantized_kv_bytes_equal_the_interpreters_copies():
    # The decode tokens of "mixed" (kv 17, 100 and 33 tokens) and two chunks, int8 per-token scales, q blocks of 16,
    # KV blocks of 128 tokens: the op model's kernel-side KV bytes (pages + one scale block per KV block fetched)
    # equal what the kernel's DMAs moved in interpret mode.
    from perfmodel.model.paged_attention import ragged_paged_attention as ragged_model
    from tests.schedule.recorder import record_traffic

    q_lens, kv_lens = [1, 37, 1, 5, 1], [17, 60, 100, 5, 33]
    batch = make_batch(8, q_lens, kv_lens, q_heads=4, kv_heads=2, page_size=16, dtype=jnp.bfloat16, spare_seqs=0)
    quant, scales, _ = quantized(batch, jnp.int8, "per-token")
    blocks = Blocks(block_q=16, block_kv=128)
    rec = record_traffic(lambda *a: ragged_paged_attention(*a[:6], kv_scales=a[6], block_sizes=blocks, chip="tpu-v5e"),
                         *quant.args(), scales)
    cost = ragged_model(query_lens=q_lens, context_lens=kv_lens, q_heads=4, kv_heads=2, head_dim=HEAD_DIM,
                        page_size=16, kv_dtype="int8", kv_scale="per-token", block_q=16, block_kv=128,
                        pages_per_seq=batch.page_table.shape[1])
    kv_bytes = cost.metrics["prefill_kv_bytes"] + cost.metrics["decode_kv_bytes"]
    scale_bytes = cost.metrics["prefill_kv_scale_bytes"] + cost.metrics["decode_kv_scale_bytes"]
    # A page: 16 tokens x 4 rows (K, V of 2 heads) x 128 x 1 B = 8192 B; a KV block's scales 4 x 128 x 4 B = 2048 B.
    assert rec.manual_hbm_bytes == kv_bytes
    assert scale_bytes % 2048 == 0 and (kv_bytes - scale_bytes) % 8192 == 0


@pytest.mark.parametrize("layout,gather_read", [("per-token", 4864), ("per-page", 304)])
def test_op_model_quantized_bytes_by_hand(layout, gather_read):
    # One decode token over 300 tokens of 16-token pages, 2 KV heads of 128, int8, KV blocks of 128 tokens (8 pages):
    # 19 pages, 3 KV blocks. Pages 19 x 16 x 4 rows x 128 x 1 B = 155648 B; the kernel's scale blocks 3 x 4 rows x
    # 128 x 4 B = 6144 B. The gather reads the table's 19 pages of scales (per token 19 x 16 x 4 x 4 B = 4864 B, per
    # page 19 x 4 x 4 B = 304 B) and writes cdiv(19, 8) = 3 blocks of 2048 B.
    from perfmodel.model.paged_attention import ragged_paged_attention as ragged_model

    cost = ragged_model(query_lens=[1], context_lens=[300], q_heads=4, kv_heads=2, head_dim=128, page_size=16,
                        kv_dtype="int8", kv_scale=layout, block_q=16, block_kv=128)
    assert cost.metrics["decode_kv_bytes"] == 155648 + 6144
    assert cost.metrics["decode_kv_scale_bytes"] == 6144
    assert cost.metrics["decode_scale_gather_bytes"] == gather_read + 3 * 2048
    bf16 = ragged_model(query_lens=[1], context_lens=[300], q_heads=4, kv_heads=2, head_dim=128, page_size=16,
                        block_q=16, block_kv=128)
    # Everything else (q, out, page table) is the same: the difference is the KV bytes and the gather.
    assert (bf16.hbm_read_bytes + bf16.hbm_write_bytes) - (cost.hbm_read_bytes + cost.hbm_write_bytes) == (
        2 * 155648 - (155648 + 6144 + gather_read + 3 * 2048))


def test_token_order_of_one_kv_head():
    # 8 tokens, one KV head: words hold tokens (0, 1), (2, 3), ...; K comes out as tokens 0, 2, 4, 6, 1, 3, 5, 7.
    from kernels.ragged_paged_attention.body import token_order

    assert token_order(8, 1).tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
    assert token_order(8, 2).tolist() == list(range(8))


@pytest.mark.parametrize("q_dtype,kv_dtype,chip,native", [
    (jnp.bfloat16, jnp.float8_e4m3fn, "tpu-v6e", True),  # the spec lists 'bf16 x fp8': codes go to the MXU as they are
    (jnp.bfloat16, jnp.float8_e4m3fn, "tpu-7x", True),
    (jnp.float32, jnp.float8_e4m3fn, "tpu-v6e", False),  # f32 queries: codes widened to f32
    (jnp.bfloat16, jnp.int8, "tpu-v6e", False),  # no 'bf16 x int8' pair: widened to bf16 on the VPU
])
def test_which_codes_feed_the_mxu_as_they_are(q_dtype, kv_dtype, chip, native):
    from kernels.ragged_paged_attention.plan import native_kv_operand

    assert native_kv_operand(q_dtype, kv_dtype, chip) is native
