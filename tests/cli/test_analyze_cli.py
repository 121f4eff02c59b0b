"""`perfmodel analyze`, `perfmodel tune` and `perfmodel inspect` through click's CliRunner."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main

JAX_MM = "jax.experimental.pallas.ops.tpu.matmul:matmul"


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def _one_line_error(res, *needles):
    assert res.exit_code != 0
    err = res.output.strip()
    assert err.startswith("Error:") and "\n" not in err, err
    for n in needles:
        assert n in err, err


def test_analyze_jax_matmul_text_report():
    # 1024^3 bf16 with 512x1024 blocks, block_k 512: grid (2, 1, 2) = 4 steps; x and y change every
    # step (k alternates) -> 4 fetches each; 2 output blocks written once each.
    res = run("analyze", JAX_MM, "--hw", "v5e", "--shape", "x=1024x1024:bf16", "--shape", "y=1024x1024:bf16",
              "--arg", "block_shape=512,1024", "--arg", "block_k=512")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "grid (2, 1, 2) = 4 steps [parallel, parallel, arbitrary]" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.strip().startswith(("x_tile", "y_tile", "o_tile"))}
    assert rows["x_tile_ref"][5] == "4" and rows["y_tile_ref"][5] == "4" and rows["o_tile_ref"][5] == "2"
    assert "fits" in out and "expected" in out and "op floor" in out
    # Per-step work: one (512 x 512) @ (512 x 1024) block product, 2*512*512*1024 = 537 MFLOP, every step.
    assert "per step (mean of 4): MXU 537 MFLOP issued" in out
    assert "dispatch-dominated" in out


def test_analyze_json_has_traffic_vmem_and_time():
    res = run("analyze", JAX_MM, "--shape", "x=512x512:f32", "--shape", "y=512x512:f32",
              "--arg", "block_shape=(128, 128)", "--arg", "block_k=128", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    k = data["kernels"][0]
    assert k["grid"] == [4, 4, 4]
    x = k["operands"][0]
    # Every step changes k: 64 fetches of a 128x128 f32 block (64 KiB).
    assert x["transfers"] == 64 and x["hbm_bytes"] == 64 * 128 * 128 * 4
    assert x["reread_factor"] == pytest.approx(4.0)
    assert k["vmem"]["status"] == "fits"
    assert k["time"]["expected_s"] > 0 and "expected_wall_s" in k["time"]


def test_analyze_passes_hw_to_a_chip_parameter():
    # The bundled matmul takes chip=; --hw fills it, so its v6e defaults and 256-wide MXU apply.
    res = run("analyze", "kernels.matmul:matmul", "--hw", "v6e", "--shape", "x=512x512:bf16",
              "--shape", "w=512x512:bf16", "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert data["chip"] == "tpu-v6e"
    # The kernel's refs carry their names (kernels.common.with_ref_names), not "refs[0]".
    kern = data["kernels"][0]
    assert [(o["name"], o["role"]) for o in kern["operands"]] == [("x_ref", "input"), ("w_ref", "input"),
                                                                 ("o_ref", "output")]
    assert [s["name"] for s in kern["scratch"]] == ["acc_ref"]


def test_analyze_builds_block_sizes_from_a_dict_literal():
    # 1024^3 with bm=256, bk=512, bn=256: grid (1024/256, 1024/256, 1024/512) = (4, 4, 2).
    res = run("analyze", "kernels.matmul:matmul", "--shape", "x=1024x1024:bf16", "--shape", "w=1024x1024:bf16",
              "--arg", 'block_sizes={"bm": 256, "bk": 512, "bn": 256}', "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["kernels"][0]["grid"] == [4, 4, 2]


def test_analyze_names_the_operands_of_optional_inputs():
    # int8 weights with scales and a bias: the optional operands are named too, in call order.
    res = run("analyze", "kernels.matmul:matmul", "--shape", "x=256x256:bf16", "--shape", "w=256x256:int8",
              "--shape", "w_scale=256:f32", "--shape", "bias=256:f32", "--json")
    assert res.exit_code == 0, res.output
    names = [o["name"] for o in json.loads(res.output)["kernels"][0]["operands"]]
    assert names == ["x_ref", "w_ref", "w_scale_ref", "bias_ref", "o_ref"]


def test_analyze_a_grid_with_no_steps_is_a_user_error():
    # JAX's matmul grid is (1000 // 512, 1000 // 1024, ...) = (1, 0, ...): no step runs.
    res = run("analyze", JAX_MM, "--shape", "x=1000x1000:bf16", "--shape", "y=1000x1000:bf16",
              "--arg", "block_shape=512,1024", "--arg", "block_k=1024")
    _one_line_error(res, "has an empty dimension", "runs no step")


def test_tune_says_when_the_reference_blocks_do_not_apply():
    # 1000 is no multiple of the guide's 512 / 1024 blocks, so there is no reference to compare with;
    # whole-dimension blocks (1000) are still legal.
    res = run("tune", "jax-matmul", "--shape", "x=1000x1000:bf16", "--shape", "y=1000x1000:bf16")
    assert res.exit_code == 0, res.output
    assert "reference blocks: not applicable to these shapes" in res.output
    assert "bm=1000,bk=1000,bn=1000" in res.output


@pytest.mark.parametrize(
    "args,needles",
    [
        (["analyze", "nomodule_xyz:f", "--shape", "x=4:bf16"], ["MODULE:FUNCTION", "cannot import module 'nomodule_xyz'"]),
        (["analyze", "perfmodel", "--shape", "x=4:bf16"], ["MODULE:FUNCTION", "expected MODULE:FUNCTION"]),
        (["analyze", JAX_MM, "--shape", "q=4:bf16"], ["--shape", "'q' is not a parameter"]),
        (["analyze", JAX_MM, "--shape", "x=4x:bf16"], ["--shape 'x=4x:bf16'", "dimensions"]),
        (["analyze", JAX_MM, "--shape", "x=8x8:bf16", "--arg", "block_k"], ["--arg 'block_k'", "NAME=VALUE"]),
        (["analyze", JAX_MM], ["--shape", "at least one"]),
        (["analyze", JAX_MM, "--hw", "h100-sxm", "--shape", "x=8x8:bf16"], ["--hw", "not a TPU"]),
        (["analyze", JAX_MM, "--hw", "v99", "--shape", "x=8x8:bf16"], ["unknown chip 'v99'"]),
        (["analyze", "kernels.matmul:matmul", "--hw", "v5e", "--shape", "x=8x128:bf16", "--arg", "chip=tpu-v4"],
         ["--arg chip=tpu-v4 differs from --hw tpu-v5e"]),
        (["analyze", "kernels.matmul:matmul", "--shape", "x=256x256:bf16", "--shape", "w=256x256:bf16",
          "--arg", 'block_sizes={"bm": 100, "bk": 128, "bn": 128}'],
         ["--arg block_sizes: block_sizes.bm=100 must be a multiple of 8", "fields: bm, bk, bn"]),
        (["analyze", "kernels.matmul:matmul", "--shape", "x=256x256:bf16", "--shape", "w=256x256:bf16",
          "--arg", 'block_sizes={"bq": 128}'], ["--arg block_sizes:", "unexpected keyword argument 'bq'"]),
        (["tune", "nope"], ["KERNEL 'nope' is not known"]),
        (["tune"], ["KERNEL: missing"]),
        (["tune", "kv_cache_update"], ["no block sizes the advisor enumerates"]),
        (["tune", "matmul", "--shape", "x=256x256:bf16", "--shape", "w=256x256:f16"],
         ["tune matmul: w: dtype float16 must match x (bfloat16)"]),
        (["tune", "matmul", "--hw", "v99"], ["unknown chip 'v99'"]),
        (["tune", "matmul", "--shape", "x=256x:bf16"], ["--shape 'x=256x:bf16'", "dimensions"]),
        (["inspect", "nope"], ["KERNEL 'nope' is not known"]),
        (["inspect", "matmul", "--hw", "h100-sxm"], ["--hw", "not a TPU"]),
        (["inspect", "matmul", "--shape", "q=256x256:bf16"], ["--shape", "'q' is not an array argument"]),
        (["inspect", "matmul", "--block", "bq=3"], ["--block", "not a block field"]),
        (["inspect", "matmul", "--block", "bm=x"], ["--block 'bm=x'", "POSITIVE_INT"]),
        (["inspect", "matmul", "--block", "bm=128"], ["--block", "missing bk, bn"]),
        (["inspect", "matmul", "--block", "bm=100", "--block", "bk=128", "--block", "bn=128"], ["--block", "rejected"]),
    ],
)
def test_user_errors_are_one_line_naming_the_flag(args, needles):
    _one_line_error(run(*args), *needles)


def test_tune_prints_ranked_candidates_with_reasons():
    res = run("tune", "jax-matmul", "--hw", "v5e", "--shape", "x=2048x2048:bf16", "--shape", "y=2048x2048:bf16",
              "--top", "3", "--wide")  # one line per candidate
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    ranked = [line for line in lines if line[:2] in ("1 ", "2 ", "3 ")]
    assert len(ranked) == 3
    assert all("VMEM" in line and "limited" in line for line in ranked)
    assert "reference blocks (bm=512,bk=1024,bn=1024)" in res.output
    assert "rejected" in res.output


def test_tune_json_and_list():
    res = run("tune", "jax-matmul", "--shape", "x=1024x1024:bf16", "--shape", "y=1024x1024:bf16", "--json", "--top", "2")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    assert len(data["ranked"]) == 2 and data["ranked"][0]["expected_s"] <= data["ranked"][1]["expected_s"]
    listing = run("tune", "--list")
    assert listing.exit_code == 0 and "jax-matmul" in listing.output and "--shape x=" in listing.output


def test_inspect_prints_mosaic_and_costs():
    res = run("inspect", "jax-matmul", "--shape", "x=256x256:bf16", "--shape", "y=256x256:bf16",
              "--block", "bm=128", "--block", "bk=128", "--block", "bn=128")
    assert res.exit_code == 0, res.output
    out = res.output
    assert "== StableHLO" in out and "tpu_custom_call" in out
    assert "== Mosaic MLIR #0: matmul_kernel" in out and "tpu.matmul" in out
    assert "XLA cost analysis" in out and "perfmodel op model" in out and "schedule model" in out
    # FLOPs agree (2*256^3 = 33.6 MFLOP everywhere); bytes differ (XLA:CPU upcasts bf16) and are flagged.
    assert "33.6 MFLOP" in out
    assert "vs XLA!" in out


def test_inspect_out_dir_writes_files(tmp_path):
    res = run("inspect", "matmul", "--shape", "x=256x512:bf16", "--shape", "w=512x256:bf16", "--out", str(tmp_path),
              "--json")
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["costs.json", "mosaic_0_matmul.mlir", "stablehlo.mlir"]
    assert "tpu.matmul" in (tmp_path / "mosaic_0_matmul.mlir").read_text()
    assert data["mosaic_kernels"][0]["name"] == "matmul"
    assert all(set(d) == {"source", "field", "relative_difference"} for d in data["disagreements"])


def test_perfmodel_import_does_not_import_jax_for_these_commands():
    # The CLI resolves analyze/tune/inspect lazily; importing the command modules alone must not import jax.
    code = ("import sys, perfmodel.cli.analyze, perfmodel.cli.inspect, perfmodel.schedule, "
            "perfmodel.schedule.analyze, perfmodel.schedule.tune; print('jax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# ----------------------------------------------------------------------------- a spec file as --hw


def _spec_copy(tmp_path, name):
    """tpu-v5e's spec saved under tmp_path with its name changed (aliases dropped so they cannot collide)."""
    text = (Path(__file__).resolve().parents[2] / "hwspecs" / "tpu-v5e.yaml").read_text()
    text = re.sub(r"(?m)^name: tpu-v5e$", f"name: {name}", text)
    text = re.sub(r"(?m)^aliases: .*$", "aliases: []", text)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", ["my-tpu", "tpu-v5e"])
def test_chip_argument_resolves_back_to_a_spec_file(tmp_path, name):
    from perfmodel.hw.registry import chip_argument, get_chip

    builtin = get_chip("tpu-v5e")
    assert chip_argument(builtin) == "tpu-v5e"
    spec = get_chip(str(_spec_copy(tmp_path, name)))
    arg = chip_argument(spec)
    # the file's own spec comes back, not the built-in one of the same name
    assert get_chip(arg) is spec and arg.endswith(f"{name}.yaml")


def test_analyze_bundled_kernel_on_a_spec_file(tmp_path):
    path = _spec_copy(tmp_path, "my-tpu")
    result = run("analyze", "kernels.matmul:matmul", "--hw", str(path),
                 "--shape", "x=256x256:bf16", "--shape", "w=256x256:bf16")
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "pallas_call matmul on my-tpu"


LOOP = "tests.schedule.dynamic_kernels:smem_loop_copy"


def test_analyze_loop_trips_sets_the_trip_count_of_a_loop_read_from_data_given_as_a_shape():
    # n (an SMEM input) given only as a shape: the loop of 8-row f32 copies (8 x 128 x 4 = 4,096 B each) runs
    # once by default, with a note naming --loop-trips; --loop-trips 4 makes it 4 x 4,096 = 16,384 B.
    shapes = ["--shape", "n=1:int32", "--shape", "x=64x128:f32", "--json"]
    once = json.loads(run("analyze", LOOP, *shapes).output)["kernels"][0]
    four = json.loads(run("analyze", LOOP, *shapes, "--loop-trips", "4").output)["kernels"][0]
    assert once["work"]["manual_dma_bytes"] == 4096 and four["work"]["manual_dma_bytes"] == 16384
    assert any("--loop-trips" in n for n in once["notes"])
    # With the value given as a fill (n = 3) the loop is evaluated, and no trip count is assumed.
    three = json.loads(run("analyze", LOOP, "--shape", "n=1:int32=3", "--shape", "x=64x128:f32", "--json").output)
    assert three["kernels"][0]["work"]["manual_dma_bytes"] == 3 * 4096


def test_analyze_loop_trips_must_be_positive():
    res = run("analyze", LOOP, "--shape", "n=1:int32", "--shape", "x=64x128:f32", "--loop-trips", "0")
    assert res.exit_code == 2 and "--loop-trips" in res.output
