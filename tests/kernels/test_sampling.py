"""sampling beyond the shared contract (tests/kernels/test_contract.py: lowering of every mode and filter set, cost
estimate, tuned defaults, a small keyed draw vs the reference): interpret mode vs the sort-based jnp reference (greedy
ids, kept sets, draws), the noise hash, block sizes and input errors."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from kernels.sampling import SamplingBlockSizes as Blocks
from kernels.sampling import (
    DEFAULT_BLOCK_SIZES,
    default_block_sizes,
    kept_mask_reference,
    logprobs_reference,
    sampling,
    sampling_reference,
)
from kernels.sampling import rng as noise_rng

#: Block sizes for the small cases: 10 rows -> 2 row blocks (the second mostly padding);
#: 1000 entries -> 4 vocab blocks, the last one partial (232 of 256).
SMALL = {jnp.dtype(jnp.float32): Blocks(block_b=8, block_v=256),
         jnp.dtype(jnp.bfloat16): Blocks(block_b=16, block_v=256)}
BATCH, VOCAB = 10, 1000
#: Relative margin kept between a chosen top_p / min_p and the nearest cumulative mass / probability
#: ratio, so f32 summation order (kernel: blocked; reference: sorted cumsum) cannot flip a token.
#: The kernel and the reference must otherwise agree exactly: same noise, same f32 formulas.
MIN_MARGIN = {jnp.dtype(jnp.float32): 1e-3, jnp.dtype(jnp.bfloat16): 1e-3}
SLOW = pytest.mark.slow


def distinct_logits(seed: int, batch: int, vocab: int, dtype) -> jax.Array:
    """Rows of pairwise-distinct values in [-8, 8], exactly representable in dtype."""
    rng = np.random.default_rng(seed)
    if jnp.dtype(dtype) == jnp.bfloat16:
        # All bf16 values with 1/8 <= |x| < 8: 6 octaves x 128 mantissas x 2 signs = 1536 values.
        lo, hi = (np.array([0.125, 8.0], np.float32).view(np.uint32) >> 16).astype(np.int64)
        magnitudes = (np.arange(lo, hi, dtype=np.uint32) << 16).view(np.float32)
        pool = np.concatenate([magnitudes, -magnitudes])
    else:
        pool = (np.arange(2 * vocab) - vocab) * np.float32(8.0 / vocab)
    assert pool.size >= vocab
    rows = [rng.choice(pool, size=vocab, replace=False) for _ in range(batch)]
    return jnp.asarray(np.stack(rows), dtype)


def scaled(logits, temperature) -> np.ndarray:
    """z exactly as both implementations compute it: f32(x) * f32(1 / T) (1 for greedy rows)."""
    t = np.asarray(temperature, np.float32)
    inv = np.where(t > 0, np.float32(1) / np.where(t > 0, t, 1), 1).astype(np.float32)
    return np.asarray(logits, np.float32) * inv[:, None]


def safe_top_p(z: np.ndarray, top_k: int, keep: int, dtype) -> float:
    """A top_p that keeps exactly `keep` tokens of the top-k set, halfway between two cumulative masses."""
    s = np.sort(z.astype(np.float64))[::-1][:top_k]
    probs = np.exp(s - s[0]) / np.exp(s - s[0]).sum()
    cum = np.cumsum(probs)
    p = (cum[keep - 2] + cum[keep - 1]) / 2  # keep j iff mass before j < p: j = 0 .. keep - 1
    assert min(p - cum[keep - 2], cum[keep - 1] - p) > MIN_MARGIN[jnp.dtype(dtype)] * p
    return float(p)


def safe_min_p(z: np.ndarray, keep: int) -> float:
    """A min_p that keeps exactly `keep` tokens: geometric mean of two consecutive probability ratios."""
    s = np.sort(z.astype(np.float64))[::-1]
    ratios = np.exp(s - s[0])
    return float(np.sqrt(ratios[keep - 1] * ratios[keep]))


def row_options(logits, dtype):
    """Per-row options covering each filter alone, combined, a greedy row and an unfiltered row."""
    temperature = np.array([0.7, 1.0, 1.3, 0.9, 0.5, 1.1, 1.0, 0.8, 0.0, 1.2], np.float32)
    z = scaled(logits, temperature)
    top_k = np.full(BATCH, VOCAB, np.int32)
    top_p = np.ones(BATCH, np.float32)
    min_p = np.zeros(BATCH, np.float32)
    top_k[0], top_k[1], top_k[2] = 1, 5, VOCAB - 1  # top-k alone
    top_p[3] = safe_top_p(z[3], VOCAB, 3, dtype)  # top-p alone
    top_p[4] = safe_top_p(z[4], VOCAB, 40, dtype)
    min_p[5] = safe_min_p(z[5], 12)  # min-p alone
    top_k[6], top_p[6] = 50, safe_top_p(z[6], 50, 17, dtype)  # top-p on the renormalised top-50
    top_k[7], top_p[7], min_p[7] = 20, safe_top_p(z[7], 20, 9, dtype), safe_min_p(z[7], 6)  # all three
    top_k[8], top_p[8] = 3, 0.5  # greedy row: filters ignored
    return dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p)


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_kept_sets_and_key_draws_match_the_sort_based_reference(dtype):
    logits = distinct_logits(1, BATCH, VOCAB, dtype)
    opts = row_options(logits, dtype)
    key = jax.random.key(7)
    ids, threshold = sampling(logits, **opts, key=key, return_threshold=True, block_sizes=SMALL[jnp.dtype(dtype)],
                              interpret=True)
    kept = scaled(logits, opts["temperature"]) >= np.asarray(threshold)[:, None]
    expected = np.asarray(kept_mask_reference(logits, **opts))
    sampled_rows = opts["temperature"] > 0
    np.testing.assert_array_equal(kept[sampled_rows], expected[sampled_rows])
    # The sizes the options were built for (hand-chosen above), so the check is not vacuous.
    assert kept.sum(axis=1)[:8].tolist() == [1, 5, VOCAB - 1, 3, 40, 12, 17, 6]
    assert kept[9].all()
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(sampling_reference(logits, **opts, key=key)))
    assert kept[np.arange(BATCH), np.asarray(ids)].all()
    assert int(ids[8]) == int(np.argmax(np.asarray(logits, np.float32)[8]))


def test_draws_with_pre_drawn_noise_match_the_reference():
    logits = distinct_logits(2, BATCH, VOCAB, jnp.float32)
    opts = row_options(logits, jnp.float32)
    noise = jax.random.uniform(jax.random.key(3), (BATCH, VOCAB), jnp.float32, minval=1e-7, maxval=1.0)
    ids = sampling(logits, **opts, noise=noise, block_sizes=SMALL[jnp.dtype(jnp.float32)], interpret=True)
    ref = sampling_reference(logits, **opts, noise=noise)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref))
    # Gumbel-max by hand for the unfiltered row 9: argmax of z - log(-log(u)).
    z9 = scaled(logits, opts["temperature"])[9]
    assert int(ids[9]) == int(np.argmax(z9 - np.log(-np.log(np.asarray(noise[9])))))


# bf16 (ties are likelier); f32: -m slow.
@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, marks=SLOW), jnp.bfloat16], ids=["f32", "bf16"])
def test_greedy_is_the_first_argmax(dtype):
    rng = np.random.default_rng(4)
    logits = np.array(jnp.asarray(rng.standard_normal((BATCH, VOCAB)) * 4, dtype), np.float32)  # a copy
    # Ties: row 0's max appears in vocab blocks 0 and 3, row 1's twice in block 1; the first index wins.
    logits[0, [3, 900]] = 20.0
    logits[1, [300, 301]] = 20.0
    logits = jnp.asarray(logits, dtype)
    ids = sampling(logits, temperature=0.7, top_k=5, block_sizes=SMALL[jnp.dtype(dtype)], interpret=True)
    expected = np.argmax(np.asarray(logits, np.float32), axis=1)
    np.testing.assert_array_equal(np.asarray(ids), expected)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(sampling_reference(logits, temperature=0.7)))
    assert ids[0] == 3 and ids[1] == 300


def test_ties_at_the_top_k_threshold_are_all_kept():
    logits = distinct_logits(5, 8, 256, jnp.float32)
    logits = logits.at[0, jnp.array([10, 100, 200])].set(9.0)  # three-way tie above every other value
    ids, threshold = sampling(logits, top_k=2, key=jax.random.key(0), return_threshold=True,
                              block_sizes=Blocks(block_b=8, block_v=128), interpret=True)
    assert float(threshold[0]) == 9.0  # all three tied tokens kept (the reference keeps the first two)
    assert int(ids[0]) in (10, 100, 200)
    kept = np.asarray(logits) >= np.asarray(threshold)[:, None]
    assert kept.sum(axis=1).tolist() == [3] + [2] * 7


def test_under_an_outer_jit_with_traced_options():
    logits = distinct_logits(6, BATCH, VOCAB, jnp.float32)
    opts = row_options(logits, jnp.float32)
    key = jax.random.key(11)
    fn = jax.jit(lambda x, t, k, p, m, key: sampling(x, temperature=t, top_k=k, top_p=p, min_p=m, key=key,
                                                      block_sizes=SMALL[jnp.dtype(jnp.float32)], interpret=True))
    ids = fn(logits, opts["temperature"], opts["top_k"], opts["top_p"], opts["min_p"], key)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(sampling_reference(logits, **opts, key=key)))


@pytest.mark.slow
@pytest.mark.parametrize("dtype,vocab", [(jnp.float32, 5000), (jnp.bfloat16, 1536)], ids=["f32", "bf16"])
def test_larger_batch_with_default_blocks(dtype, vocab):
    batch = 40  # bf16: every distinct value in 1/8 <= |x| < 8, so no ties at a top-k threshold
    logits = distinct_logits(8, batch, vocab, dtype)
    rng = np.random.default_rng(9)
    opts = dict(temperature=rng.uniform(0.5, 1.5, batch).astype(np.float32),
                top_k=rng.integers(1, vocab + 1, batch).astype(np.int32),
                min_p=np.where(rng.uniform(size=batch) < 0.3, 0.0, 1e-3).astype(np.float32))
    key = jax.random.key(12)
    ids, threshold = sampling(logits, **opts, key=key, return_threshold=True, interpret=True)
    kept = scaled(logits, opts["temperature"]) >= np.asarray(threshold)[:, None]
    np.testing.assert_array_equal(kept, np.asarray(kept_mask_reference(logits, **opts)))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(sampling_reference(logits, **opts, key=key)))


# ----- the noise hash and the draw's distribution (reference only: the kernel matches it bit for bit) -----


def test_hash_uniform_is_uniform_and_seed_dependent():
    seeds = noise_rng.row_seeds(jax.random.key(0), 4)
    u = np.asarray(noise_rng.hash_uniform(seeds[:, None], jnp.arange(1 << 14, dtype=jnp.int32)[None, :]))
    assert ((u > 0) & (u < 1)).all()
    # 16 bins of 16384 draws per row: expected 1024 each; chi-square with 15 dof stays below 37.7
    # (p = 0.001) for a uniform source.
    for row in u:
        counts = np.histogram(row, bins=16, range=(0, 1))[0]
        assert ((counts - 1024.0) ** 2 / 1024.0).sum() < 37.7
    assert abs(np.corrcoef(u[0], u[1])[0, 1]) < 0.05  # different seeds: unrelated streams


def test_reference_draw_frequencies_follow_the_renormalised_kept_distribution():
    # 8 tokens, top_k = 4: the draw must follow softmax over the four largest logits.
    batch = 20000
    row = jnp.array([2.0, 1.0, 0.5, 0.0, -1.0, 3.0, -2.0, 1.5])
    ids = sampling_reference(jnp.tile(row, (batch, 1)), top_k=4, key=jax.random.key(1))
    counts = np.bincount(np.asarray(ids), minlength=8)
    top4 = [5, 0, 7, 1]  # logits 3.0, 2.0, 1.5, 1.0
    assert counts[[2, 3, 4, 6]].sum() == 0
    probs = np.exp(np.asarray(row)[top4]) / np.exp(np.asarray(row)[top4]).sum()
    chi2 = (((counts[top4] - batch * probs) ** 2) / (batch * probs)).sum()
    assert chi2 < 16.3  # chi-square, 3 dof, p = 0.001


#: A Llama-3 vocabulary, 64 sequences: the shape the defaults are tuned on.
PRODUCTION = (64, 128256)


# ----- block sizes -----


@pytest.mark.parametrize("chip", sorted(DEFAULT_BLOCK_SIZES))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_defaults_fit_every_chip_at_a_llama3_vocabulary(chip, dtype):
    blocks = default_block_sizes(chip, logits_dtype=dtype, vocab=PRODUCTION[1])
    blocks.validate(vocab=PRODUCTION[1], logits_dtype=dtype, with_noise=True, chip=chip)
    # The stored f32 rows, rounded up to the bf16 sublane tile (16) for bf16 logits.
    stored = DEFAULT_BLOCK_SIZES[chip]
    assert blocks == Blocks(block_b=-(-stored.block_b // 16) * 16 if dtype == jnp.bfloat16 else stored.block_b,
                            block_v=stored.block_v)


def test_tuned_on_this_files_production_shape_and_untuned_chips_take_the_v5e_defaults():
    # The stored defaults themselves: tests/kernels/test_contract.py.
    from kernels.tuned import load_tuned_file

    (shape,) = load_tuned_file("sampling")["shapes"]["fp32"]
    assert shape == f"logits={PRODUCTION[0]}x{PRODUCTION[1]}:f32"
    # Chips before tpu-v4 are not tuned: they take tpu-v5e's defaults.
    assert default_block_sizes("tpu-v3", logits_dtype=jnp.float32, vocab=PRODUCTION[1]) == DEFAULT_BLOCK_SIZES[
        "tpu-v5e"]


def test_default_block_v_shrinks_to_a_small_vocabulary(monkeypatch):
    import kernels.sampling.blocks as sb

    # On a hand-picked table: 1000 entries round up to 1024 lanes, below the 2048 default.
    monkeypatch.setattr(sb, "default_block_table", lambda: {"tpu-v5e": {"fp32": Blocks(block_b=8, block_v=2048)}})
    assert default_block_sizes("tpu-v5e", logits_dtype=jnp.float32, vocab=1000) == Blocks(block_b=8, block_v=1024)


def test_default_block_b_halves_for_a_huge_vocabulary(monkeypatch):
    import kernels.sampling.blocks as sb

    # f32, vocab 262144, block_v 8192, with noise: per row of block_b, resident 262144*4 = 1048576, logits
    # blocks 2*8192*4 = 65536, noise blocks 65536, chunk temporaries 2*8192*4 = 65536: 1245184 B per row.
    # tpu-v5e's 16 MiB (16777216 B) holds 13.4 rows: 64 -> 32 -> 16 -> 8 rows (about 10 MB).
    monkeypatch.setattr(sb, "default_block_table", lambda: {"tpu-v5e": {"fp32": Blocks(block_b=64, block_v=8192)}})
    assert default_block_sizes("tpu-v5e", logits_dtype=jnp.float32, vocab=262144) == Blocks(block_b=8, block_v=8192)


def test_vmem_bytes_by_hand():
    # block (8, 256), vocab 1000 f32 with noise, as Mosaic allocates it: resident rows 4 blocks * 8 * 256 * 4 =
    # 32768; logits blocks 2 * 8192 = 16384; noise blocks 16384; the [8, 7] / [8, 2] option columns (2 buffers
    # each) and the two [8, 1] outputs (2 buffers each) pad to 128 lanes, 8 * 128 * 4 = 4096 B: 8 * 4096 = 32768;
    # state: 6 lane-wide [8, 256] f32 (8192 B) and 4 [8, 1] columns (4096 B) = 65536; f32 chunk temporaries,
    # 2 chunks, 16384. Sum 180224.
    blocks = Blocks(block_b=8, block_v=256)
    assert blocks.vmem_bytes(vocab=1000, logits_dtype=jnp.float32, with_noise=True) == 180224
    # Greedy, no noise: one resident block 8192, logits 16384, columns 32768, state 3 * 8192 + 4 * 4096 = 40960,
    # 1.25 chunks of temporaries 10240: 108544.
    assert blocks.vmem_bytes(vocab=1000, logits_dtype=jnp.float32, with_noise=False, greedy=True) == 108544
    # bf16 logits (block_b 16) with penalties and a bias: the resident rows are f32, and the int32 counts and
    # f32 bias stream beside the logits: resident 4 * 16 * 256 * 4 = 65536 vs 32768 for bf16 alone, plus
    # 2 * 2 * 16384 of count and bias blocks.
    b16 = Blocks(block_b=16, block_v=256)
    plain = b16.vmem_bytes(vocab=1000, logits_dtype=jnp.bfloat16, with_noise=False)
    adjusted = b16.vmem_bytes(vocab=1000, logits_dtype=jnp.bfloat16, with_noise=False, penalties=True, bias=True)
    assert adjusted - plain == (65536 - 32768) + 4 * 16384


@pytest.mark.parametrize("kwargs,match", [
    (dict(block_b=0, block_v=128), "block_b must be a positive int"),
    (dict(block_b=8, block_v=100), r"block_v=100 must be a multiple of 128.*try 128"),
])
def test_block_sizes_reject_bad_values(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Blocks(**kwargs)


@pytest.mark.parametrize("blocks,dtype,chip,match", [
    (Blocks(block_b=4, block_v=128), jnp.float32, "tpu-v5e", "block_b=4 must be a multiple of 8 for float32"),
    (Blocks(block_b=8, block_v=128), jnp.bfloat16, "tpu-v5e", "block_b=8 must be a multiple of 16 for bfloat16"),
    (Blocks(block_b=512, block_v=2048), jnp.float32, "tpu-v5e", r"block_sizes \(block_b=512, block_v=2048\) for a vocabulary of 128256 need .* of VMEM, over the 16(\.0)? MiB"),
    (Blocks(block_b=8, block_v=128), jnp.float32, "h100-sxm", "chip: 'h100-sxm'"),
])
def test_block_sizes_validate_against_the_call(blocks, dtype, chip, match):
    with pytest.raises(ValueError, match=match):
        blocks.validate(vocab=PRODUCTION[1], logits_dtype=dtype, with_noise=False, chip=chip)


# ----- input errors -----

LOGITS = jnp.asarray(np.random.default_rng(0).standard_normal((4, 256)), jnp.float32)


@pytest.mark.parametrize("kwargs,match", [
    (dict(top_p=0.0), r"top_p=0.0 is out of range: must be in \(0, 1\]"),
    (dict(top_p=jnp.array([0.5, 1.5, 1.0, 1.0])), r"top_p=1.5 is out of range"),
    (dict(top_k=0), r"top_k=0 is out of range: must be >= 1"),
    (dict(top_k=2.5), "top_k must be an integer"),
    (dict(temperature=-1.0), r"temperature=-1.0 is out of range: must be >= 0"),
    (dict(min_p=1.5), r"min_p=1.5 is out of range"),
    (dict(temperature=jnp.ones(3)), r"temperature must be a scalar or a \[4\] array"),
    (dict(noise=jnp.ones((4, 255))), "noise must be float32 uniforms shaped like logits"),
    (dict(noise=jnp.ones((4, 256)), key=jax.random.key(0)), "key and noise are alternatives"),
    (dict(seeds=jnp.arange(4)), "key and seeds are alternatives"),
    (dict(key=None, seeds=jnp.arange(3)), r"seeds must be a \[4\] integer array"),
    (dict(key=None, seeds=jnp.ones(4)), r"seeds must be a \[4\] integer array"),
    (dict(presence_penalty=0.5), "presence_penalty needs token_counts"),
    (dict(token_counts=jnp.zeros((4, 255), jnp.int32)), r"token_counts must be shaped like logits \[4, 256\]"),
    (dict(token_counts=jnp.zeros((4, 256))), "token_counts must be an integer array"),
    (dict(token_counts=jnp.zeros((4, 256), jnp.int32), repetition_penalty=0.0),
     r"repetition_penalty=0.0 is out of range: must be > 0"),
    (dict(token_counts=jnp.zeros((4, 256), jnp.int32), frequency_penalty=float("nan")),
     "frequency_penalty=nan is out of range: must be finite"),
    (dict(logit_bias=jnp.zeros((4, 128))), r"logit_bias must be shaped like logits \[4, 256\]"),
    (dict(logit_bias=jnp.zeros((4, 256), jnp.int32)), "logit_bias must be a float array"),
    (dict(allowed_mask=jnp.ones((4, 256))), "allowed_mask must be a bool array"),
    (dict(logprobs=-1), r"logprobs=-1 must be an int in \[0, 64\]"),
    (dict(logprobs=65), r"logprobs=65 must be an int in \[0, 64\]"),
    (dict(block_sizes=Blocks(block_b=4, block_v=128)), "block_b=4 must be a multiple of 8"),
])
def test_bad_options_raise_naming_the_argument(kwargs, match):
    kwargs = {"key": jax.random.key(0), **kwargs} if "noise" not in kwargs else kwargs
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    with pytest.raises(ValueError, match=match):
        sampling(LOGITS, interpret=True, **kwargs)


@pytest.mark.parametrize("logits,match", [
    (jnp.ones((2, 3, 4)), r"logits must be \[batch, vocab\]"),
    (jnp.ones((2, 256), jnp.int32), "logits must be float32 or bfloat16"),
])
def test_bad_logits_raise(logits, match):
    with pytest.raises(ValueError, match=match):
        sampling(logits, interpret=True)


# ----- per-request seeds, greedy rows among sampled ones, penalties / bias / masks, logprobs -----


def test_per_request_seeds_make_a_row_independent_of_its_batch():
    logits = distinct_logits(13, 8, 256, jnp.float32)
    seeds = jnp.array([5, 6, 7, 8, 9, 10, 11, 12], jnp.int32)
    blocks = Blocks(block_b=8, block_v=128)
    ids = sampling(logits, min_p=0.01, seeds=seeds, block_sizes=blocks, interpret=True)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(sampling_reference(logits, min_p=0.01, seeds=seeds)))
    # Row 3 moved to position 0 of another batch keeps its seed: the same token.
    other = jnp.concatenate([logits[3:4], logits[:3], logits[4:]])
    moved = sampling(other, min_p=0.01, seeds=seeds.at[0].set(8).at[3].set(5), block_sizes=blocks, interpret=True)
    assert int(moved[0]) == int(ids[3])


def test_greedy_rows_mixed_with_sampled_rows_are_exact_argmaxes():
    logits = distinct_logits(14, 8, 256, jnp.float32)
    temperature = jnp.array([0.0, 1.0, 0.0, 0.7, 0.0, 1.3, 0.0, 1.0])
    ids = sampling(logits, temperature=temperature, top_p=0.9, seeds=jnp.arange(8, dtype=jnp.int32),
                   block_sizes=Blocks(block_b=8, block_v=128), interpret=True)
    greedy = np.asarray(temperature) == 0
    np.testing.assert_array_equal(np.asarray(ids)[greedy], np.argmax(np.asarray(logits), axis=1)[greedy])
    ref = sampling_reference(logits, temperature=temperature, top_p=0.9, seeds=jnp.arange(8, dtype=jnp.int32))
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref))


def test_adjusted_logits_by_hand():
    from kernels.sampling.options import adjusted_logits

    x = jnp.array([[2.0, -2.0, 1.0, 0.5]])
    counts = jnp.array([[1, 2, 0, 3]])
    # repetition 2 on seen tokens: 2 -> 1, -2 -> -4, 0.5 -> 0.25 (token 2 unseen: 1);
    # then frequency 0.1 * count and presence 0.5 on seen tokens: 1 - 0.6 = 0.4, -4 - 0.7 = -4.7, 1, 0.25 - 0.8.
    out = adjusted_logits(x, bias=jnp.array([[0.0, 0.0, 0.0, 0.0]]), token_counts=counts, presence=0.5,
                          frequency=0.1, repetition=2.0)
    np.testing.assert_allclose(np.asarray(out), [[0.4, -4.7, 1.0, -0.55]], rtol=1e-6)


def adjustments(batch: int, vocab: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    counts = np.where(rng.uniform(size=(batch, vocab)) < 0.1, rng.integers(1, 4, (batch, vocab)), 0)
    bias = np.where(rng.uniform(size=(batch, vocab)) < 0.05, rng.normal(0, 3, (batch, vocab)), 0.0)
    return dict(token_counts=jnp.asarray(counts, jnp.int32), logit_bias=jnp.asarray(bias, jnp.float32),
                banned_mask=jnp.asarray(rng.uniform(size=(batch, vocab)) < 0.05),
                allowed_mask=jnp.asarray(rng.uniform(size=(batch, vocab)) < 0.8),
                presence_penalty=jnp.asarray(rng.uniform(0, 1, batch), jnp.float32),
                frequency_penalty=jnp.asarray(rng.uniform(0, 0.5, batch), jnp.float32),
                repetition_penalty=jnp.asarray(rng.uniform(1, 1.5, batch), jnp.float32))


@pytest.mark.parametrize("dtype", [pytest.param(jnp.float32, marks=SLOW), jnp.bfloat16], ids=["f32", "bf16"])
def test_penalties_bias_and_masks_match_the_reference(dtype):
    batch, vocab = 16, 1000
    logits = distinct_logits(15, batch, vocab, dtype)
    adj = adjustments(batch, vocab, 16)
    temperature = jnp.where(jnp.arange(batch) % 4 == 0, 0.0, 0.9)  # every 4th row greedy
    seeds = jnp.arange(batch, dtype=jnp.int32) * 7
    ids = sampling(logits, temperature=temperature, top_k=30, seeds=seeds, **adj,
                   block_sizes=Blocks(block_b=16, block_v=256), interpret=True)
    ref = sampling_reference(logits, temperature=temperature, top_k=30, seeds=seeds, **adj)
    np.testing.assert_array_equal(np.asarray(ids), np.asarray(ref))
    ids = np.asarray(ids)
    rows = np.arange(batch)
    allowed = np.asarray(adj["allowed_mask"]) & ~np.asarray(adj["banned_mask"])
    assert allowed[rows, ids].all()  # never a banned or not-allowed token
    # The adjustments change the answer: without them some row draws another token.
    plain = sampling_reference(logits, temperature=temperature, top_k=30, seeds=seeds)
    assert (np.asarray(plain) != ids).any()


def test_logprobs_of_the_chosen_and_top_n_tokens():
    batch, vocab = 8, 1000
    logits = distinct_logits(17, batch, vocab, jnp.float32)
    adj = adjustments(batch, vocab, 18)
    temperature = jnp.array([0.0, 1.0, 0.8, 1.2, 0.0, 0.5, 1.0, 2.0])
    out = sampling(logits, temperature=temperature, top_p=0.8, key=jax.random.key(3), logprobs=4, **adj,
                   block_sizes=Blocks(block_b=8, block_v=256), interpret=True)
    chosen, top_ids, top_lp = logprobs_reference(logits, out.ids, 4, temperature=temperature, **adj)
    np.testing.assert_array_equal(np.asarray(out.top_ids), np.asarray(top_ids))
    np.testing.assert_allclose(np.asarray(out.top_logprobs), np.asarray(top_lp), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(out.logprob), np.asarray(chosen), rtol=1e-5, atol=1e-5)
    # Greedy rows choose the most likely token: their chosen log-probability is the top-1's.
    np.testing.assert_array_equal(np.asarray(out.ids)[[0, 4]], np.asarray(out.top_ids)[[0, 4], 0])
    assert (np.diff(np.asarray(out.top_logprobs), axis=1) <= 0).all()


def test_greedy_call_with_logprobs_and_more_slots_than_finite_logits():
    logits = distinct_logits(19, 8, 128, jnp.float32)
    allowed = jnp.zeros((8, 128), bool).at[:, :3].set(True)  # three finite logits per row
    out = sampling(logits, allowed_mask=allowed, logprobs=5, block_sizes=Blocks(block_b=8, block_v=128),
                   interpret=True)
    x = np.asarray(logits)[:, :3]
    np.testing.assert_array_equal(np.asarray(out.ids), np.argmax(x, axis=1))
    assert (np.asarray(out.top_ids)[:, 3:] == -1).all() and np.isneginf(np.asarray(out.top_logprobs)[:, 3:]).all()
    # The three finite slots hold log_softmax over the allowed tokens; they sum (as probabilities) to 1.
    np.testing.assert_allclose(np.exp(np.asarray(out.top_logprobs)[:, :3]).sum(axis=1), 1.0, rtol=1e-5)


def test_kernel_draws_follow_the_adjusted_renormalised_distribution():
    # 4096 requests with the same logits and their own seeds; 8 tokens of 128 finite (the rest banned), top_k 4
    # of the adjusted logits. Chi-square, 3 dof, critical value 16.27 (p = 0.001). Power: a shift of 0.05
    # probability between two of the four tokens gives a noncentrality 4096 * sum((p1 - p0)^2 / p0) >= 4096 *
    # 0.0025 * (1/0.42 + 1/0.29) = 24 (p0 as below), so such an error is caught with probability > 0.96.
    batch, vocab = 4096, 128
    row = np.full(vocab, 0.0, np.float32)
    row[:8] = [2.0, 1.0, 0.5, 0.0, -1.0, 3.0, -2.0, 1.5]
    banned = np.arange(vocab) >= 8
    counts = np.zeros(vocab, np.int32)
    counts[5] = 2  # token 5 (logit 3.0) seen twice: repetition 1.5 -> 2.0, frequency 0.25 * 2 -> 1.5
    kwargs = dict(token_counts=jnp.asarray(np.tile(counts, (batch, 1))), repetition_penalty=1.5,
                  frequency_penalty=0.25, banned_mask=jnp.asarray(np.tile(banned, (batch, 1))))
    ids = sampling(jnp.tile(jnp.asarray(row), (batch, 1)), top_k=4, seeds=jnp.arange(batch, dtype=jnp.int32),
                   block_sizes=Blocks(block_b=512, block_v=128), interpret=True, **kwargs)
    counts_out = np.bincount(np.asarray(ids), minlength=vocab)
    adjusted = row[:8].copy()
    adjusted[5] = 3.0 / 1.5 - 0.5
    top4 = [0, 5, 7, 1]  # adjusted logits 2.0, 1.5, 1.5, 1.0: a tie at 1.5, both kept
    assert counts_out.sum() == counts_out[top4].sum()
    probs = np.exp(adjusted[top4]) / np.exp(adjusted[top4]).sum()
    chi2 = (((counts_out[top4] - batch * probs) ** 2) / (batch * probs)).sum()
    assert chi2 < 16.27


# ----- speculative decoding: the rejection sampler -----


def spec_case(batch: int, k: int, vocab: int, seed: int):
    rng = np.random.default_rng(seed)
    target = rng.dirichlet(np.full(vocab, 0.3), size=(k + 1, batch)).astype(np.float32)
    draft = rng.dirichlet(np.full(vocab, 0.3), size=(k, batch)).astype(np.float32)
    tokens = np.stack([[rng.choice(vocab, p=draft[j, b] / draft[j, b].sum()) for j in range(k)]
                       for b in range(batch)]).astype(np.int32)
    return jnp.asarray(tokens), jnp.asarray(draft), jnp.asarray(target)


def test_rejection_sampler_matches_the_reference_token_for_token():
    from kernels.sampling import rejection_sample, rejection_sample_reference

    tokens, draft, target = spec_case(16, 3, 300, 20)  # 300: three vocab blocks of 128, the last partial
    seeds = jnp.arange(16, dtype=jnp.int32) * 3 + 1
    got = rejection_sample(tokens, draft, target, seeds=seeds, block_sizes=Blocks(block_b=8, block_v=128),
                           interpret=True)
    ref = rejection_sample_reference(tokens, draft, target, seeds=seeds)
    np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(ref.tokens))
    np.testing.assert_array_equal(np.asarray(got.num_accepted), np.asarray(ref.num_accepted))
    out, num = np.asarray(got.tokens), np.asarray(got.num_accepted)
    assert 0 < num.mean() < 3  # some rows reject, some accept (the test covers both paths)
    for b in range(16):  # accepted drafts, then one drawn token, then -1
        np.testing.assert_array_equal(out[b, :num[b]], np.asarray(tokens)[b, :num[b]])
        assert 0 <= out[b, num[b]] < 300 and (out[b, num[b] + 1:] == -1).all()


@pytest.mark.slow
def test_identical_draft_and_target_accept_everything():
    from kernels.sampling import rejection_sample

    tokens, draft, target = spec_case(8, 2, 128, 21)
    target = jnp.concatenate([draft, target[2:]])  # p_k == q_k for the two draft positions
    got = rejection_sample(tokens, draft, target, key=jax.random.key(0), block_sizes=Blocks(block_b=8, block_v=128),
                           interpret=True)
    assert (np.asarray(got.num_accepted) == 2).all()
    np.testing.assert_array_equal(np.asarray(got.tokens)[:, :2], np.asarray(tokens))


def test_rejection_sampler_output_follows_the_target_distribution():
    # The first emitted token of speculative decoding is distributed as p_0 whatever the draft (Leviathan et al.
    # 2023, Theorem 1). 4096 requests, vocab 6 (+ padding to 128 lanes), each with its own seed; draft tokens
    # drawn from q_0 with numpy. Chi-square, 5 dof, critical value 20.5 (p = 0.001). Power: moving 0.05 of
    # probability between two tokens of p0 = (0.3, 0.25, 0.2, 0.1, 0.1, 0.05) gives a noncentrality >= 4096 *
    # 0.0025 * (1/0.3 + 1/0.25) = 75, caught with probability > 0.999.
    from kernels.sampling import rejection_sample

    batch, vocab = 4096, 6
    p0 = np.array([0.3, 0.25, 0.2, 0.1, 0.1, 0.05], np.float32)
    q0 = np.array([0.05, 0.1, 0.1, 0.2, 0.25, 0.3], np.float32)
    rng = np.random.default_rng(22)
    tokens = rng.choice(vocab, p=q0 / q0.sum(), size=(batch, 1)).astype(np.int32)
    target = np.broadcast_to(np.stack([p0, np.full(vocab, 1 / vocab, np.float32)])[:, None, :], (2, batch, vocab))
    draft = np.broadcast_to(q0[None, None, :], (1, batch, vocab))
    got = rejection_sample(jnp.asarray(tokens), jnp.asarray(draft), jnp.asarray(target),
                           seeds=jnp.arange(batch, dtype=jnp.int32), block_sizes=Blocks(block_b=512, block_v=128),
                           interpret=True)
    first = np.bincount(np.asarray(got.tokens)[:, 0], minlength=vocab)
    assert first.sum() == batch
    assert (((first - batch * p0) ** 2) / (batch * p0)).sum() < 20.5
    # Acceptance rate sum(min(p, q)) = 0.05 + 0.1 + 0.1 + 0.1 + 0.1 + 0.05 = 0.5; +-4 sigma of 4096 draws.
    assert abs(np.asarray(got.num_accepted).mean() - 0.5) < 4 * np.sqrt(0.25 / batch)


@pytest.mark.parametrize("kwargs,match", [
    (dict(target=jnp.zeros((3, 4, 128))), r"draft_probs must be \[K, batch, vocab\] = \[2, 4, 128\]"),
    (dict(tokens=jnp.zeros((4, 3), jnp.int32)), r"draft_token_ids must be a \[batch, K\] = \[4, 1\]"),
    (dict(target=jnp.zeros((1, 4, 128))), "target_probs must have K \\+ 1 >= 2 positions"),
    (dict(draft=jnp.zeros((1, 4, 128), jnp.bfloat16)), "draft_probs must be float32"),
    (dict(key=None), "pass exactly one of key"),
])
def test_rejection_sampler_rejects_bad_inputs(kwargs, match):
    from kernels.sampling import rejection_sample

    args = dict(tokens=jnp.zeros((4, 1), jnp.int32), draft=jnp.zeros((1, 4, 128)), target=jnp.zeros((2, 4, 128)),
                key=jax.random.key(0))
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        rejection_sample(args["tokens"], args["draft"], args["target"], key=args["key"], interpret=True)


def test_rejection_sampler_checks_its_vmem_by_hand():
    from kernels.sampling import rejection_sample
    from kernels.sampling.rejection import rejection_vmem_bytes

    # 8 x 256 blocks: the greedy sampling footprint with a second f32 stream, plus 1.5 f32 chunks of
    # 8 * 256 * 4 = 8192 B: 12288 B. A 512 x 8192 block needs far over v5e's 16 MiB scoped VMEM.
    blocks = Blocks(block_b=8, block_v=256)
    base = blocks.vmem_bytes(vocab=1000, logits_dtype=jnp.float32, with_noise=True, greedy=True)
    assert rejection_vmem_bytes(blocks, vocab=1000) == base + 12288
    with pytest.raises(ValueError, match=r"block_sizes \(block_b=512, block_v=8192\) need .* of VMEM"):
        rejection_sample(jnp.zeros((4, 1), jnp.int32), jnp.zeros((1, 4, 128)), jnp.zeros((2, 4, 128)),
                         key=jax.random.key(0), block_sizes=Blocks(block_b=512, block_v=8192), interpret=True)


# --- threshold searches: the lane-maxima brackets (kernels.sampling.search.search_passes runs the kernel's search)


def _kept(rows: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    return rows >= cuts[:, None]


@pytest.mark.parametrize("options", [dict(top_k=5), dict(top_p=0.8), dict(top_k=7, top_p=0.6)],
                         ids=["top-k", "top-p", "top-k+top-p"])
def test_brackets_change_the_passes_not_the_kept_sets(options):
    from kernels.sampling.search import search_passes

    rows = np.random.default_rng(3).normal(0, 2.5, (16, 1000)).astype(np.float32)
    with_cuts, with_passes = search_passes(rows, block_v=512, **options)
    searched_cuts, _ = search_passes(rows, block_v=512, capture=False, **options)
    bare_cuts, bare_passes = search_passes(rows, block_v=512, brackets=False, capture=False, **options)
    np.testing.assert_array_equal(_kept(rows, with_cuts), _kept(rows, bare_cuts))
    np.testing.assert_array_equal(_kept(rows, searched_cuts), _kept(rows, bare_cuts))
    # the kept sets are the reference's: top-k then top-p on the renormalised top-k distribution
    order = np.argsort(-rows, axis=1)
    k = options.get("top_k", rows.shape[1])
    for r in range(rows.shape[0]):
        top = rows[r, order[r, :k]]
        probs = np.exp(top - top[0]) / np.exp(top - top[0]).sum()
        n = int(np.searchsorted(np.cumsum(probs), options.get("top_p", 1.0) * (1 - 1e-6))) + 1
        assert _kept(rows, with_cuts)[r].sum() == min(n, k), r
    assert (with_passes > 0).any() and (bare_passes > 0).any()


def test_a_top_k_in_distinct_lanes_is_found_by_the_brackets_probe_alone():
    from kernels.sampling.search import search_passes

    # 8 rows x 2048 (block_v 512: 256-lane groups, so lane l holds columns l, l + 256, ... l + 1792). The 3 largest
    # values sit in lanes 0, 1 and 2 (columns 0, 257, 514), everything else is below them: the 3rd largest lane
    # maximum (column 514's 7.0) is the 3rd largest element, so the first pass counts exactly 3 at it and the
    # search stops after 1 pass; the bisection alone needs 7 halvings of the int32 key range here (until one lands
    # in (1.0, 7.0], between the 4th largest value and the 3rd).
    rows = np.random.default_rng(0).uniform(-1, 1, (8, 2048)).astype(np.float32)
    rows[:, [0, 257, 514]] = [9.0, 8.0, 7.0]
    cuts, passes = search_passes(rows, top_k=3, block_v=512, block_b=8, capture=False)
    np.testing.assert_array_equal(cuts, np.full(8, 7.0, np.float32))
    assert passes.tolist() == [[1, 0, 0]]
    _, bare = search_passes(rows, top_k=3, block_v=512, block_b=8, brackets=False, capture=False)
    assert bare[0, 0] > 1


@pytest.mark.parametrize("top_k, captured_only", [(3, 1), (6, 0)])
def test_the_capture_pass_holds_the_top_k_set_unless_a_lane_overflows(top_k, captured_only):
    from kernels.sampling.search import CAPTURE_SLOTS, search_passes

    # 8 rows x 2048 (256-lane groups): lane 0 holds columns 0, 256, ..., 1792; put 9, 8, 7, 6, 5, 4 in its first
    # six and everything else in [-1, 1). The capture pass keeps lane 0's 5 largest (9 to 5; the 4 is not kept).
    # top-k 3: the 3rd largest captured value is 7 > 5, lane 0's last slot, so no lane can hide an element >= 7:
    # thresholds from the captured values alone, 1 pass. top-k 6: the 6th largest captured value is below 1, and
    # lane 0's last slot (5) is above it, so lane 0 may hide more: the searches run over the rows and find 4.
    assert CAPTURE_SLOTS == 5
    rows = np.random.default_rng(1).uniform(-1, 1, (8, 2048)).astype(np.float32)
    rows[:, [0, 256, 512, 768, 1024, 1280]] = [9.0, 8.0, 7.0, 6.0, 5.0, 4.0]
    cuts, passes = search_passes(rows, top_k=top_k, block_v=512, block_b=8)
    assert _kept(rows, cuts).sum(axis=1).tolist() == [top_k] * 8
    assert passes[0, 2] == captured_only
    assert (passes[0, 0] == 1) == bool(captured_only)
    expected = 7.0 if top_k == 3 else 4.0
    assert (cuts <= expected).all() and (cuts > (-1.0 if top_k == 3 else 1.0)).all()
