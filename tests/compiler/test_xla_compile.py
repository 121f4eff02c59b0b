"""Whole programs through the TPU compiler (slow: each compiles in a child process; cached afterwards)."""

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.hw.registry import get_chip

pytestmark = [pytest.mark.needs_libtpu, pytest.mark.slow]
TINY = "tests/xla/data/tiny-llama.json"
TINY_MOE = "tests/xla/data/tiny-moe.json"
TINY_128 = "tests/xla/data/tiny-8b-attention.json"


def test_tiny_llama_tp4_maps_ops_and_totals():
    from perfmodel.xla.compare import compare_step

    c = compare_step(TINY, chip=get_chip("v5e"), topology="v5e:2x2", phase="decode", batch=8, context=256, tp=4)
    rows = {r.name: r for r in c.rows}
    assert c.program.chips == 4
    for name in ("qkv_proj", "attention", "o_proj", "gate_up", "down", "lm_head", "all_reduce(mlp)"):
        assert rows[name].hlo_ops, name  # every one has compiled ops carrying its name stack
    # two all-reduces per layer (after o_proj and down) over the 4 chips, 2 layers
    ar = [o for o in c.program.ops if o.kind == "collective" and o.opcode.startswith("all-reduce")]
    assert sum(o.count for o in ar if o.group_chips == 4) >= 4
    # Tiny model: the compiler keeps every weight in VMEM and fuses norms into matmuls, so its step is faster
    # than the analytic sum of per-op HBM round trips, but within a factor of 4 of it.
    assert 0.25 < c.compiled_s / c.analytic_s < 4
    assert c.program.hbm_footprint_bytes > c.analytic_hbm_need_bytes * 0.5


def test_tiny_moe_prefill_single_chip():
    from perfmodel.xla.compare import compare_step

    c = compare_step(TINY_MOE, chip=get_chip("v5e"), phase="prefill", batch=2, prefill_len=64, tp=1,
                     kv_layout="contiguous")
    rows = {r.name: r for r in c.rows}
    assert rows["experts_gate_up"].hlo_ops and rows["experts_down"].hlo_ops and rows["attention"].hlo_ops
    assert 0.1 < c.compiled_s / c.analytic_s < 10


@pytest.mark.parametrize("config", [TINY_128, TINY], ids=["head_dim_128", "head_dim_64"])
def test_tiny_llama_bundled_paged_attention(config):
    from perfmodel.xla.compare import compare_step

    # TINY_128: the 8B attention shape with 2 small layers; TINY: head_dim 64 (two heads per 128-lane window)
    c = compare_step(config, chip=get_chip("v5e"), phase="decode", batch=8, context=256, tp=1, kernels="bundled")
    rows = {r.name: r for r in c.rows}
    # attention is the bundled ragged_paged_attention kernel and the cache write kv_cache_update's combined
    # layout: one Mosaic custom call of each per layer (2 layers)
    pallas = [o for o in c.program.ops if o.kind == "pallas"]
    assert sum(o.count for o in pallas if o.hlo_name in rows["attention"].hlo_ops) == 2
    assert sum(o.count for o in pallas if o.hlo_name in rows["kv_write"].hlo_ops) == 2
    assert sum(o.count for o in pallas) == 4
    assert 0.25 < c.compiled_s / c.analytic_s < 4


def test_xla_cli_pallas_matmul():
    r = CliRunner().invoke(main, ["xla", "kernels.matmul.kernel:matmul", "--shape", "x=512x1024",
                                  "--shape", "w=1024x1024", "--hw", "v5e", "--json"])
    assert r.exit_code == 0, r.output
    import json

    rec = json.loads(r.output[r.output.index("{"):])
    pallas = [o for o in rec["ops"] if o["kind"] == "pallas"]
    assert len(pallas) == 1
    # the kernel's own CostEstimate, read from the custom call: 2 M N K of the product plus M N for the f32
    # accumulator's conversion to the bf16 output = 2*512*1024*1024 + 512*1024 = 1,074,266,112
    assert pallas[0]["flops"] == 2 * 512 * 1024 * 1024 + 512 * 1024
    assert rec["step_s"] > 0 and rec["hbm_footprint_bytes"] > 512 * 1024 * 2


def test_predict_model_compile_cli():
    r = CliRunner().invoke(main, ["predict", "model", "--config", TINY, "--hw", "v5e", "--tp", "4", "--batch", "8",
                                  "--context", "256", "--compile"])
    assert r.exit_code == 0, r.output
    assert "compiled" in r.output and "qkv_proj" in r.output and "HBM per chip: compiler footprint" in r.output
