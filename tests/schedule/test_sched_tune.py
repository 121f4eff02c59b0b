"""The block-size advisor: candidate enumeration, legality, ranking, and the tuned-defaults data."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.tpu import matmul as jmm

from perfmodel.errors import InputError
from perfmodel.hw.registry import get_chip
from perfmodel.schedule.analyze import analyze
from kernels.spec import BlockAxis, TunedConfig
from kernels.tuned import load_tuned_defaults, load_tuned_file
from perfmodel.schedule.catalog import (
    get_entry,
    get_tuned_kernel,
    pallas_chips,
    tuned_kernels,
)
from perfmodel.schedule.tune import (
    TIE_RTOL,
    Candidate,
    TuneResult,
    candidate_values,
    enumerate_candidates,
    rank,
    steps_lower_bound,
    tune,
)
from perfmodel.schedule.tuned import (
    DEFAULT_TIE_BAND,
    MAX_RAISED_VMEM_FRACTION,
    SCOPED_VMEM_BAND,
    compiled_choice_with_raised,
    incumbent_candidate,
    preference_order,
    raised_candidates,
    robust_choice,
    write_tuned_defaults,
)


def test_candidate_values_double_from_the_minimum_up_to_the_dimension():
    # 1000 rows, multiples of 16 from 128: 128, 256, 512, and the dimension rounded up to 16 (1008).
    assert candidate_values(BlockAxis(field="bm", array="x", dim=0, align=16), 1000) == [128, 256, 512, 1008]
    # Divisors only: of 768, the doubling sequence keeps 128 and 256, plus 768 itself.
    assert candidate_values(BlockAxis(field="bk", array="x", dim=1, align=128, divides=True), 768) == [128, 256, 768]
    # A dimension below the minimum gets its aligned size.
    assert candidate_values(BlockAxis(field="bm", array="x", dim=0, align=8), 40) == [8, 16, 32, 40]
    # A maximum caps the doubling and drops the whole dimension: 256, 512, 1024 of 8192.
    capped = BlockAxis(field="block_kv_compute", array="k", dim=2, align=128, minimum=256, maximum=1024)
    assert candidate_values(capped, 8192) == [256, 512, 1024]


def test_ragged_block_kv_tiles_pages_per_sequence_times_the_page_size():
    entry = get_entry("ragged_paged_attention")
    specs = entry.specs(["q=48x8x128:bf16", "kv_pages=40x16x4x128:bf16",
                         "kv_lens=4:int32=100", "page_table=4x10:int32=arange", "cu_q_lens=5:int32=arange*12",
                         "num_seqs=1:int32=4"])
    # block_q tiles the 48 flat tokens; block_kv the 10 pages x 16 tokens = 160 KV tokens of a sequence.
    assert entry.dims(specs) == {"block_q": 48, "block_kv": 160}


def test_steps_lower_bound_is_the_product_of_block_counts():
    entry = get_entry("jax-matmul")
    dims = {"bm": 1024, "bk": 2048, "bn": 512}
    assert steps_lower_bound(entry, dims, {"bm": 256, "bk": 1024, "bn": 512}) == 4 * 2 * 1
    assert len(enumerate_candidates(entry, dims)) == 4 * 5 * 3  # 128..1024, 128..2048, 128..512


@pytest.mark.parametrize("n", [1024, 4096, 8192])
def test_advisor_choice_at_least_as_fast_as_the_guides_blocks_on_its_shapes(n):
    """Issue requirement: on the v5e tutorial shapes the advisor's choice is predicted at least as fast
    as 512x1024x1024 (bm x bk x bn), evaluated independently with analyze()."""
    shapes = [f"x={n}x{n}:bf16", f"y={n}x{n}:bf16"]
    result = tune("jax-matmul", shapes, "tpu-v5e")
    x = jax.ShapeDtypeStruct((n, n), jnp.bfloat16)
    guide = analyze(jmm.matmul, x, x, chip="tpu-v5e", block_shape=(512, 1024), block_k=1024).kernels[0]
    assert result.best.expected_s <= guide.time.expected_s
    for c in result.ranked:
        assert c.vmem_status == "fits"
        assert all(n % v == 0 for v in c.blocks.values())  # JAX's kernel needs divisible blocks
    _assert_ranked(result.ranked)


def _assert_ranked(ranked):
    """Fastest first up to float rounding (TIE_RTOL); ties by less VMEM."""
    for a, b in zip(ranked, ranked[1:]):
        assert a.expected_s <= b.expected_s * (1 + TIE_RTOL)
        if b.expected_s <= a.expected_s * (1 + TIE_RTOL):
            assert a.vmem_bytes <= b.vmem_bytes or a.expected_s < b.expected_s


def test_rank_breaks_ties_within_float_rounding_by_vmem_then_given_order():
    fast = _cand("fast", 1.0, vmem_mib=8)
    tie_more_vmem = _cand("tie-more", 1.0 + 1e-13, vmem_mib=12)
    tie_less_vmem = _cand("tie-less", 1.0 + 2e-13, vmem_mib=4)
    exact_a, exact_b = _cand("exact-a", 2.0, vmem_mib=4), _cand("exact-b", 2.0, vmem_mib=4)
    slower = _cand("slower", 1.0 + 1e-6, vmem_mib=1)
    order = [c.blocks["b"] for c in rank([exact_b, slower, tie_more_vmem, fast, exact_a, tie_less_vmem])]
    assert order == ["tie-less", "fast", "tie-more", "slower", "exact-b", "exact-a"]


def test_advisor_rejects_blocks_over_the_scoped_vmem_limit():
    # JAX's kernel sets no vmem_limit_bytes, so anything over v5e's 16 MiB default scoped VMEM is illegal.
    result = tune("jax-matmul", ["x=4096x4096:bf16", "y=4096x4096:bf16"], "tpu-v5e")
    assert any("needs vmem_limit_bytes" in r for r in result.rejected)
    assert max(c.vmem_bytes for c in result.ranked) <= 16 << 20


def test_reasons_say_what_limits_and_how_often_inputs_are_read():
    result = tune("jax-matmul", ["x=2048x2048:bf16", "y=2048x2048:bf16"], "tpu-v5e")
    best = result.best
    assert "limited" in best.reason and "VMEM" in best.reason
    assert "x_tile_ref read" in best.reason


def test_bundled_matmul_tunes_against_its_own_default(v5e):
    result = tune("matmul", ["x=2048x1024:bf16", "w=1024x3072:bf16"], v5e)
    assert result.baseline is not None and result.baseline_label == "kernel default"
    assert result.best.expected_s <= result.baseline.expected_s


@pytest.mark.parametrize(
    "kernel,shapes,match",
    [
        ("nope", [], "KERNEL 'nope' is not known"),
        ("kv_cache_update", [], "has no block sizes the advisor enumerates"),
        ("jax-matmul", ["x=256x256:bf16"], "needs y"),
        ("jax-matmul", ["x=256x256:bf16", "y=256x256:bf16", "z=4:bf16"], "'z' is not an array argument"),
    ],
)
def test_tune_errors_name_the_problem(kernel, shapes, match):
    with pytest.raises(InputError, match=match):
        tune(kernel, shapes, "tpu-v5e")


def test_write_tuned_defaults_round_trips(tmp_path):
    # One chip and one pair at 1024^3 keep this quick; the structure is what the bundled matmul reads.
    small = TunedConfig(key="bf16 x bf16", shapes=("x=1024x1024:bf16", "w=1024x1024:bf16", "bias=1024:f32"))
    spec = dataclasses.replace(get_tuned_kernel("matmul"), configs=(small,))
    path = write_tuned_defaults(spec, tmp_path / "matmul.json", chips=["tpu-v5e"])
    data = json.loads(path.read_text())
    assert data["shapes"] == {"bf16 x bf16": ["x=1024x1024:bf16", "w=1024x1024:bf16", "bias=1024:f32"]}
    entry = data["defaults"]["tpu-v5e"]["bf16 x bf16"]
    from kernels.matmul import MatmulBlockSizes

    MatmulBlockSizes(bm=entry["bm"], bk=entry["bk"], bn=entry["bn"])  # validates tiling
    assert 0 < entry["fastest_s"] <= entry["expected_s"] <= entry["fastest_s"] * (1 + SCOPED_VMEM_BAND)
    assert entry["vmem_limit_bytes"] is None  # 1024^3 has candidates well within v5e's 16 MiB


def test_write_rejects_a_kernel_without_block_sizes(tmp_path):
    with pytest.raises(InputError, match="--write: 'kv_cache_updat' has no tuned defaults; kernels with block"):
        write_tuned_defaults("kv_cache_updat", tmp_path / "x.json")


def test_stored_tuned_defaults_are_legal_blocks_for_every_listed_chip():
    from kernels.matmul import MatmulBlockSizes

    defaults = load_tuned_defaults("matmul")
    assert "tpu-v5e" in defaults and "bf16 x bf16" in defaults["tpu-v5e"]
    for chip, pairs in defaults.items():
        for pair, b in pairs.items():
            MatmulBlockSizes(bm=b["bm"], bk=b["bk"], bn=b["bn"])
            assert 8192 % b["bm"] == 0 and 8192 % b["bk"] == 0 and 8192 % b["bn"] == 0, (chip, pair)


@pytest.mark.parametrize("spec", tuned_kernels(), ids=lambda t: t.kernel)
def test_every_kernel_with_block_sizes_has_tuned_defaults_that_follow_the_rule(spec):
    data = load_tuned_file(spec.kernel)
    assert data["kernel"] == spec.kernel and data["entry"] == spec.entry
    assert "perfmodel tune --write" in data["about"]
    assert data["shapes"] == {c.key: list(c.shapes) for c in spec.configs}
    entry = get_entry(spec.entry)
    fields = {ax.field for ax in entry.block_axes}
    assert set(pallas_chips()) <= set(data["defaults"]), "every current TPU has defaults"
    production = spec.configs[0].key
    for chip_name, configs in data["defaults"].items():
        chip = get_chip(chip_name)
        assert next(iter(configs)) == production or production not in configs  # production config first
        for key, stored in configs.items():
            assert fields <= set(stored), (chip_name, key)
            if stored.get("compiled_s") is not None:  # stored by tune --write --compile: the compiler's figures
                # the pool, the raised-limit candidates and the blocks stored before the run
                most = data["compiler"]["compile_top"] + data["compiler"].get("compile_raised", 0) + 1
                assert most >= stored["candidates_compiled"] >= 1
                limit = stored["vmem_limit_bytes"] or chip.memory.vmem_default_scoped_limit_bytes_per_core
                assert stored["compiled_s"] > 0 and 0 < stored["vmem_allocated_bytes"] <= limit, (chip_name, key)
            # Within the default scoped limit (physical VMEM where the spec has none), or marked with a
            # raised limit of at most 3/4 of the physical VMEM.
            scoped = chip.memory.vmem_default_scoped_limit_bytes_per_core or chip.memory.vmem_bytes_per_core
            if stored["vmem_limit_bytes"] is None:
                assert stored["vmem_bytes"] <= scoped, (chip_name, key)
            else:
                assert stored["vmem_limit_bytes"] <= MAX_RAISED_VMEM_FRACTION * chip.memory.vmem_bytes_per_core
            assert stored["fastest_s"] <= stored["expected_s"] * (1 + 1e-12)  # float rounding of equal times
            assert 1 <= stored["within_tie_band"] <= stored["legal_candidates"]


def test_stored_matmul_defaults_raise_v6e_vmem_only_where_the_compiler_says_it_pays():
    # Was 4096x1024x2048 (kernel need 120 MiB of 128), then 1024x1024x2048 within the 32 MiB default (the model's
    # 10% band; 1.39 ms compiled). matmul's compile_raised = 1 also compiles the model's fastest raised candidate,
    # stored only when it compiles more than 1% faster than the scoped pick: then its limit stays within 3/4 of
    # the 128 MiB and Mosaic's allocation within the limit.
    data = load_tuned_file("matmul")
    assert data["compiler"]["compile_raised"] == get_tuned_kernel("matmul").compile_raised == 1
    b = data["defaults"]["tpu-v6e"]["bf16 x bf16"]
    if b["vmem_limit_bytes"] is None:
        assert b["vmem_bytes"] <= 32 << 20
    else:
        assert b["candidates_compiled"] == data["compiler"]["compile_top"] + 1
        assert b["vmem_allocated_bytes"] <= b["vmem_limit_bytes"] <= MAX_RAISED_VMEM_FRACTION * (128 << 20)


# ----------------------------------------------------------------------------- the stored-default rule

def _cand(name: str, expected_s: float, *, vmem_mib: float, limit_mib: float | None = None, hbm: int = 100,
          steps: int = 10, vpu_ops: float = 0.0) -> Candidate:
    return Candidate(blocks={"b": name}, expected_s=expected_s, hbm_bytes=hbm, ideal_hbm_bytes=100,
                     vmem_bytes=int(vmem_mib * 2**20), vmem_status="fits",
                     vmem_limit_bytes=None if limit_mib is None else int(limit_mib * 2**20), steps=steps,
                     limiter="compute", reason="", vpu_ops=vpu_ops)


def _result(*cands: Candidate, chip: str = "tpu-v6e") -> TuneResult:
    ranked = tuple(sorted(cands, key=lambda c: c.expected_s))
    return TuneResult(kernel="k", chip=chip, shapes=(), ranked=ranked, evaluated=len(ranked), rejected={}, pruned=0,
                      baseline=None, baseline_label="kernel default")


def test_robust_choice_keeps_the_default_scoped_limit_within_ten_percent():
    # v6e: 32 MiB default scoped, 128 MiB physical. The fastest needs a raised limit; one within the scoped
    # limit is 5% slower (inside the 10% band), so the pool is the scoped ones and the raised one is out.
    fast = _cand("raised", 1.00, vmem_mib=90, limit_mib=112)
    ok = _cand("scoped", 1.05, vmem_mib=20)
    slower = _cand("scoped-slow", 1.20, vmem_mib=10)
    assert robust_choice(_result(fast, ok, slower)).blocks == {"b": "scoped"}


def test_robust_choice_allows_a_raised_limit_only_up_to_three_quarters_of_physical_vmem():
    # No scoped candidate within 10% (1.15 > 1.10): raised limits are allowed, but 112 MiB > 96 MiB (3/4 of
    # 128 MiB) is not; 80 MiB is.
    too_big = _cand("112MiB", 1.00, vmem_mib=90, limit_mib=112)
    raised = _cand("80MiB", 1.02, vmem_mib=64, limit_mib=80)
    scoped = _cand("scoped", 1.15, vmem_mib=20)
    assert robust_choice(_result(too_big, raised, scoped)).blocks == {"b": "80MiB"}
    # A scoped candidate far behind stays eligible (it is the fastest left once 112 MiB is out) ...
    assert robust_choice(_result(too_big, _cand("scoped", 1.5, vmem_mib=20))).blocks == {"b": "scoped"}
    # ... and with nothing within the scoped limit or 3/4 of the physical VMEM there is no default.
    with pytest.raises(InputError, match="no candidate fits the default scoped VMEM or 75% of the physical VMEM"):
        robust_choice(_result(too_big, _cand("120MiB", 1.01, vmem_mib=100, limit_mib=120)))


def test_compile_raised_adds_the_fastest_raised_limits_the_scoped_pool_left_out():
    # v6e (96 MiB cap): the pool is the scoped ones (5% behind, inside the 10% band); the raised ones within the
    # cap, fastest first, are what compile_raised adds to the --compile order; 112 MiB is past the cap.
    fast = _cand("raised-80", 1.00, vmem_mib=64, limit_mib=80)
    too_big = _cand("raised-112", 0.99, vmem_mib=90, limit_mib=112)
    second = _cand("raised-90", 1.01, vmem_mib=70, limit_mib=90)
    ok = _cand("scoped", 1.05, vmem_mib=20)
    result = _result(too_big, fast, second, ok)
    assert [c.blocks["b"] for c in preference_order(result)] == ["scoped"]
    assert [c.blocks["b"] for c in raised_candidates(result, 1)] == ["raised-80"]
    assert [c.blocks["b"] for c in raised_candidates(result, 5)] == ["raised-80", "raised-90"]
    assert raised_candidates(result, 0) == []
    # a pool that already admits raised limits (no scoped candidate within 10%) adds nothing
    assert raised_candidates(_result(fast, _cand("scoped-slow", 1.2, vmem_mib=20)), 2) == []


def test_compile_raised_orders_the_model_ties_by_the_least_vpu_work():
    # Raised candidates within 1% of the fastest raised one (1.000, 1.004, 1.008) go least VPU work first (the
    # compiler hides VPU work under the MXU only partly), equal VPU work fastest first; 1.02 is outside the
    # band, so its small VPU count does not lift it ahead of the ties.
    fast = _cand("fast-much-vpu", 1.000, vmem_mib=40, limit_mib=50, vpu_ops=4e9)
    lean = _cand("lean-a", 1.008, vmem_mib=60, limit_mib=70, vpu_ops=1e9)
    lean_faster = _cand("lean-b", 1.004, vmem_mib=70, limit_mib=80, vpu_ops=1e9)
    outside = _cand("outside-band", 1.020, vmem_mib=40, limit_mib=50, vpu_ops=0.5e9)
    result = _result(fast, lean, lean_faster, outside, _cand("scoped", 1.05, vmem_mib=20))
    assert [c.blocks["b"] for c in raised_candidates(result, 4)] == ["lean-b", "lean-a", "fast-much-vpu",
                                                                    "outside-band"]
    assert [c.blocks["b"] for c in raised_candidates(result, 1)] == ["lean-b"]


def test_a_retune_compiles_the_stored_blocks_next_to_the_pool():
    # The stored entry's blocks are compiled too when the model no longer puts them in the pool, and only when
    # they are a legal candidate of this problem and not compiled anyway.
    pool = _cand("new", 1.00, vmem_mib=10)
    old = _cand("old", 1.05, vmem_mib=12)
    result = _result(pool, old, _cand("other", 1.10, vmem_mib=8))
    assert incumbent_candidate(result, {"b": "old", "expected_s": 0.9}, ["b"]) == [old]
    assert incumbent_candidate(result, {"b": "old"}, ["b"], exclude=[old]) == []  # in the order already
    assert incumbent_candidate(result, {"b": "gone"}, ["b"]) == []  # no longer legal
    assert incumbent_candidate(result, None, ["b"]) == []  # nothing stored for this chip / configuration
    # v6e: 128 MiB of VMEM, a raised limit at most 96 MiB; an incumbent over it is not compiled (100 MiB limit).
    big = _cand("big", 1.02, vmem_mib=80, limit_mib=100)
    fits = _cand("fits", 1.03, vmem_mib=70, limit_mib=90)
    result = _result(pool, big, fits)
    assert incumbent_candidate(result, {"b": "big"}, ["b"]) == []
    assert incumbent_candidate(result, {"b": "fits"}, ["b"]) == [fits]


def test_a_raised_limit_is_stored_only_when_it_compiles_faster_than_the_tie_band():
    from perfmodel.schedule.compiled import CompiledCandidate

    def comp(name, s, limit=None):
        return CompiledCandidate(candidate=_cand(name, 1.0, vmem_mib=8, limit_mib=limit), compiled_s=s,
                                 vmem_allocated_bytes=1, error=None)

    pool = [comp("scoped", 1.00), comp("scoped-2", 1.05)]
    # 0.5% faster: inside the 1% tie band, the default scoped limit stays; 5% faster: the raised one is stored
    assert compiled_choice_with_raised(pool, [comp("raised", 0.995, 80)]).candidate.blocks == {"b": "scoped"}
    assert compiled_choice_with_raised(pool, [comp("raised", 0.95, 80)]).candidate.blocks == {"b": "raised"}
    # the compiler rejected the pool: a raised one that compiled is stored; none at all is an error
    rejected = [CompiledCandidate(candidate=_cand("bad", 1.0, vmem_mib=8), compiled_s=None,
                                  vmem_allocated_bytes=None, error="VMEM")]
    assert compiled_choice_with_raised(rejected, [comp("raised", 1.2, 80)]).candidate.blocks == {"b": "raised"}
    with pytest.raises(InputError, match="the compiler rejected all 1 candidates"):
        compiled_choice_with_raised(rejected, [])


def test_robust_choice_breaks_ties_by_bytes_then_steps_then_vmem():
    band = 1 + DEFAULT_TIE_BAND / 2  # inside the tie band
    best = _cand("fastest", 1.0, vmem_mib=8, hbm=300)
    fewer_bytes = _cand("fewer-bytes", band, vmem_mib=8, hbm=200, steps=40)
    same_bytes_fewer_steps = _cand("fewer-steps", band, vmem_mib=12, hbm=200, steps=20)
    same_steps_less_vmem = _cand("less-vmem", band, vmem_mib=4, hbm=200, steps=20)
    outside = _cand("outside", 1 + 2 * DEFAULT_TIE_BAND, vmem_mib=1, hbm=1, steps=1)
    result = _result(best, fewer_bytes, same_bytes_fewer_steps, same_steps_less_vmem, outside)
    assert robust_choice(result).blocks == {"b": "less-vmem"}


def test_token_major_kv_cache_update_and_ragged_attention_are_tunable(v5e):
    kv = tune("kv_cache_update_token_major", [], v5e)
    assert all(c.blocks["tokens_per_block"] >= 8 for c in kv.ranked)
    ragged = tune("ragged_paged_attention", [
        "q=32x8x128:bf16", "kv_pages=16x16x4x128:bf16", "kv_lens=2:int32=128",
        "page_table=2x8:int32=arange", "cu_q_lens=3:int32=arange*16", "num_seqs=1:int32=2"], v5e)
    # block_q 16 or 32 of the 32 tokens; block_kv 128 of the 8 x 16 = 128 KV tokens: two legal candidates. One
    # 32-token step does the work of two 16-token steps (every head in a step), so the step bound may prune 16.
    pairs = [(c.blocks["block_q"], c.blocks["block_kv"]) for c in ragged.ranked]
    assert pairs[0] == (32, 128) and set(pairs) <= {(16, 128), (32, 128)}


def test_ragged_decode_with_fewer_query_tokens_than_a_bf16_tile_still_has_legal_blocks():
    # 8 decode tokens: block_q candidates start at the bf16 sublane tile (16 rows), which the kernel accepts.
    shapes = ["q=8x32x128:bf16", "kv_pages=256x16x16x128:bf16", "kv_lens=8:int32=512",
              "page_table=8x32:int32=arange", "cu_q_lens=9:int32=arange", "num_seqs=1:int32=8"]
    result = tune("ragged_paged_attention", shapes, "tpu-v5e")
    assert result.ranked and {c.blocks["block_q"] for c in result.ranked} == {16}
    # nothing rejected for its tiling; the largest KV blocks may need a raised VMEM limit (the padded K/V rows)
    assert not [reason for reason in result.rejected if "VMEM" not in reason]


def _ranked(label: int, expected_s: float, hbm: int, steps: int = 4) -> Candidate:
    return Candidate(blocks={"b": label}, expected_s=expected_s, hbm_bytes=hbm, ideal_hbm_bytes=hbm, vmem_bytes=1 << 20,
                     vmem_status="fits", steps=steps, limiter="hbm", reason="")


def test_compiled_choice_is_the_compiler_backed_fastest_with_the_same_tie_break():
    from perfmodel.schedule.compiled import CompiledCandidate
    from perfmodel.schedule.tuned import compiled_choice

    a, b, c = _ranked(1, 1.0e-3, 100), _ranked(2, 1.1e-3, 50), _ranked(3, 0.9e-3, 10)
    compiled = [CompiledCandidate(candidate=a, compiled_s=2.00e-3, vmem_allocated_bytes=1, error=None),
                # 2.01 ms is within 1% of 2.00 ms and moves fewer bytes (50 < 100): the tie-break picks it
                CompiledCandidate(candidate=b, compiled_s=2.01e-3, vmem_allocated_bytes=1, error=None),
                # fastest by the schedule model, but Mosaic rejected it
                CompiledCandidate(candidate=c, compiled_s=None, vmem_allocated_bytes=None, error="RESOURCE_EXHAUSTED")]
    assert compiled_choice(compiled).candidate is b
    # 2.03 ms is 1.5% slower: out of the tie band, so the fastest wins
    compiled[1] = CompiledCandidate(candidate=b, compiled_s=2.03e-3, vmem_allocated_bytes=1, error=None)
    assert compiled_choice(compiled).candidate is a
    with pytest.raises(InputError, match="the compiler rejected all 1 candidates compiled: RESOURCE_EXHAUSTED"):
        compiled_choice(compiled[2:])


def test_the_preferred_order_starts_with_the_robust_choice():
    from perfmodel.schedule.tuned import preference_order

    # fastest 1.000 ms; 1.005 ms is within the 1% tie band and moves fewer bytes, so it is the robust choice
    a, b, c = _ranked(1, 1.000e-3, 100), _ranked(2, 1.005e-3, 50), _ranked(3, 1.050e-3, 10)
    result = TuneResult(kernel="matmul", chip="tpu-v5e", shapes=(), ranked=(a, b, c), evaluated=3, rejected={},
                        pruned=0, baseline=None, baseline_label="")
    assert robust_choice(result) is b
    assert preference_order(result) == [b, a, c]
