"""The block-size advisor: candidate enumeration, legality, ranking, and the tuned-defaults data."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas.ops.tpu import matmul as jmm

from perfmodel.errors import InputError
from perfmodel.schedule.analyze import analyze
from perfmodel.schedule.catalog import BlockAxis, get_entry
from perfmodel.schedule.tune import (
    candidate_values,
    enumerate_candidates,
    load_tuned_defaults,
    steps_lower_bound,
    tune,
    write_tuned_defaults,
)


def test_candidate_values_double_from_the_minimum_up_to_the_dimension():
    # 1000 rows, multiples of 16 from 128: 128, 256, 512, and the dimension rounded up to 16 (1008).
    assert candidate_values(BlockAxis(field="bm", array="x", dim=0, align=16), 1000) == [128, 256, 512, 1008]
    # Divisors only: of 768, the doubling sequence keeps 128 and 256, plus 768 itself.
    assert candidate_values(BlockAxis(field="bk", array="x", dim=1, align=128, divides=True), 768) == [128, 256, 768]
    # A dimension below the minimum gets its aligned size.
    assert candidate_values(BlockAxis(field="bm", array="x", dim=0, align=8), 40) == [8, 16, 32, 40]


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
    assert result.ranked == tuple(sorted(result.ranked, key=lambda c: (c.expected_s, c.vmem_bytes)))


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


def test_write_tuned_defaults_round_trips(tmp_path, monkeypatch):
    import perfmodel.schedule.tune as tune_mod

    # One chip and one pair keep this quick; the structure is what the bundled matmul reads.
    monkeypatch.setattr(tune_mod, "MATMUL_PAIRS", (("bf16", "bf16", "bf16", "bf16"),))
    monkeypatch.setattr(tune_mod, "TUNED_SHAPE_MNK", (1024, 1024, 1024))
    path = write_tuned_defaults(tmp_path / "matmul.json", chips=["tpu-v5e"])
    data = json.loads(path.read_text())
    entry = data["defaults"]["tpu-v5e"]["bf16 x bf16"]
    from kernels.matmul import MatmulBlockSizes

    MatmulBlockSizes(bm=entry["bm"], bk=entry["bk"], bn=entry["bn"])  # validates tiling
    assert entry["expected_s"] > 0


def test_stored_tuned_defaults_are_legal_blocks_for_every_listed_chip():
    from kernels.matmul import MatmulBlockSizes

    defaults = load_tuned_defaults("matmul")
    assert "tpu-v5e" in defaults and "bf16 x bf16" in defaults["tpu-v5e"]
    for chip, pairs in defaults.items():
        for pair, b in pairs.items():
            MatmulBlockSizes(bm=b["bm"], bk=b["bk"], bn=b["bn"])
            assert 8192 % b["bm"] == 0 and 8192 % b["bk"] == 0 and 8192 % b["bn"] == 0, (chip, pair)
