"""inspect / analyze / tune --compile through click's CliRunner, compiling for real (libtpu, deviceless)."""

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main

pytestmark = pytest.mark.needs_libtpu

JAX_MM = ["--shape", "x=1024x1024:bf16", "--shape", "y=1024x1024:bf16"]


def invoke(*args):
    return CliRunner().invoke(main, list(args))


def test_inspect_compile_report_and_cache(tmp_path):
    args = ["inspect", "jax-matmul", "--compile", "--hw", "v5e", *JAX_MM, "--block", "bm=256", "--block", "bk=512",
            "--block", "bn=512", "--json", "--out", str(tmp_path)]
    r = invoke(*args)
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    k = data["compile"]["kernels"][0]
    # grid (4, 2, 2) = 16 steps; the compiler's software pipeline adds 2 iterations.
    assert k["loop"]["trip_count"] == 18
    assert k["loop"]["dma_starts"] >= 3 and k["loop"]["dma_waits"] >= 3
    assert k["scoped_vmem_bytes"] > 0 and k["mxus"] == 4
    # one step is 256x512 @ 512x512 = 134 MFLOP, at least 134e6 / (4 MXUs x 128 x 128 x 2) = 1,024 MXU cycles.
    assert k["loop"]["bundles"] >= 1024
    view = data["compiled_kernels"][0]
    assert view["time"]["expected_s"] >= view["time"]["efficiency"] * view["time"]["expected_s"] > 0
    assert (tmp_path / "compile.json").is_file() and any(p.name.endswith(".bundles.txt") for p in tmp_path.iterdir())
    again = invoke(*args)
    assert json.loads(again.output[again.output.index("{"):])["compile"]["from_cache"] is True


def test_illegal_kernel_gets_the_compilers_message_in_one_line():
    r = invoke("inspect", "tests.compiler.oversized_kernel:oversized", "--compile", "--hw", "v5e",
               "--shape", "x=8x128:f32")
    assert r.exit_code == 2
    last = r.output.strip().splitlines()[-1]
    assert last.startswith("Error: tests.compiler.oversized_kernel:oversized does not compile for tpu-v5e: ")
    assert "vmem" in last.lower()


def test_analyze_compile_shows_both_times():
    r = invoke("analyze", "jax.experimental.pallas.ops.tpu.matmul:matmul", "--hw", "v6e", *JAX_MM,
               "--arg", "block_shape=512,512", "--arg", "block_k=512", "--compile")
    assert r.exit_code == 0, r.output
    assert "compiler-backed" in r.output and "Mosaic allocated" in r.output and "2 MXU(s) used" in r.output


def test_tune_compile_reranks():
    r = invoke("tune", "jax-matmul", "--hw", "v5e", *JAX_MM, "--compile", "2", "--json")
    assert r.exit_code == 0, r.output
    data = json.loads(r.output[r.output.index("{"):])
    got = [c for c in data["compiled"] if c["compiled_s"] is not None]
    assert len(data["compiled"]) == 2 and got
    assert [c["compiled_s"] for c in got] == sorted(c["compiled_s"] for c in got)
