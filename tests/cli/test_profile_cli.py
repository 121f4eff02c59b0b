"""`perfmodel profile`: a profile captured here on the CPU backend (a real xplane, xprof's real converters), read
by the CLI and put on a TPU's roofline."""

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main

# x[M, K] @ w[K, N] in f32, then an elementwise epilogue (tanh, scale, shift)
M, K, N = 256, 512, 128
RUNS = 3
# The matmul's FLOPs per call: 2 x M x N x K = 2 x 256 x 128 x 512 = 33,554,432 (one multiply and one add per
# term of each of the 256 x 128 outputs' 512-long dot products).
MATMUL_FLOPS = 2 * M * N * K


@pytest.fixture(scope="module")
def profile_dir(tmp_path_factory):
    import jax
    import jax.numpy as jnp

    def profiled_mlp(x, w):
        return jnp.tanh(x @ w) * 2.0 + 1.0

    fn = jax.jit(profiled_mlp)
    x = jnp.full((M, K), 0.5, jnp.float32)
    w = jnp.full((K, N), 0.25, jnp.float32)
    fn(x, w).block_until_ready()  # compiled before the trace: the trace holds the runs only
    out = tmp_path_factory.mktemp("trace")
    with jax.profiler.trace(str(out)):
        for _ in range(RUNS):
            fn(x, w).block_until_ready()
    assert list(out.glob("plugins/profile/*/*.xplane.pb"))
    return out


def _run(*args):
    return CliRunner().invoke(main, ["profile", *map(str, args)])


def test_cpu_profile_on_a_tpu_roofline(profile_dir):
    res = _run(profile_dir, "--hw", "tpu-v5e", "--json", "--top", "0")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert rec["source"] == "trace_viewer@"  # the CPU backend's hlo_stats has no rows
    assert rec["chip"] == "tpu-v5e" and rec["device_type"] == "CPU"
    matmuls = [o for o in rec["ops"] if o["op"]["category"] == "matmul"]
    assert len(matmuls) == 1, [o["op"]["name"] for o in rec["ops"]]
    mm = matmuls[0]
    assert mm["op"]["occurrences"] == RUNS and mm["op"]["measured_s"] > 0
    # FLOPs from the module's HLO: the dot's 2*M*N*K per run (the epilogue is a fusion of its own on XLA:CPU)
    assert mm["op"]["flops"] == pytest.approx(RUNS * MATMUL_FLOPS)
    # bytes: x, w read and the result written once per run, f32
    assert mm["op"]["bytes"] == pytest.approx(RUNS * 4 * (M * K + K * N + M * N))
    for o in rec["ops"]:
        assert o["op"]["measured_s"] > 0
        if o["floor_s"] is not None:
            assert o["ratio"] >= 1.0  # a CPU is no faster than a v5e's floor
    assert rec["op_count"] == len(rec["ops"]) >= 2
    assert rec["total_lost_s"] == pytest.approx(sum(o["lost_s"] for o in rec["ops"] if o["lost_s"] is not None))


def test_top_limits_rows_and_text_output(profile_dir):
    res = _run(profile_dir, "--hw", "v5e", "--json", "--top", "1")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)
    assert len(rec["ops"]) == 1 and rec["op_count"] >= 2
    every = json.loads(_run(profile_dir, "--hw", "v5e", "--json", "--top", "0").output)["ops"]
    assert rec["ops"][0]["lost_s"] == max(o["lost_s"] for o in every if o["lost_s"] is not None)  # most lost first
    text = _run(profile_dir, "--hw", "v5e", "--top", "1")
    assert text.exit_code == 0, text.output
    assert "x floor" in text.output and "more op(s)" in text.output and "why not faster" in text.output
    assert "FLOP" in text.output and "µs" in text.output  # numbers with units and SI prefixes


def test_cpu_profile_needs_a_chip(profile_dir):
    res = _run(profile_dir)
    assert res.exit_code == 2
    assert "--hw" in res.output and "CPU" in res.output


@pytest.mark.parametrize("missing", [True, False])
def test_no_profile_is_one_line_exit_2(tmp_path, missing):
    target = tmp_path / ("nothing-here" if missing else "empty")
    if not missing:
        target.mkdir()
    res = _run(target, "--hw", "v5e")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    # the path is named (long paths are shortened in the middle, so its last part is checked)
    assert len(lines) == 1 and target.name in lines[0] and "jax.profiler.trace" in lines[0]


def test_plot_writes_a_png(profile_dir, tmp_path):
    png = tmp_path / "ops.png"
    res = _run(profile_dir, "--hw", "v5e", "--plot", png)
    assert res.exit_code == 0, res.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


#: The profile the harness README's example reads (tests/data/profiles/README.md says how it was captured).
SHIPPED = "tests/data/profiles/cpu-mlp"


def test_shipped_profile_reads_the_same_every_time():
    # The same captured xplane gives the same table: what lets the README example be regenerated and checked.
    first, second = _run(SHIPPED, "--hw", "tpu-v5e"), _run(SHIPPED, "--hw", "tpu-v5e")
    assert first.exit_code == 0, first.output
    assert first.output == second.output
    rec = json.loads(_run(SHIPPED, "--hw", "tpu-v5e", "--json").output)
    (mm,) = [o for o in rec["ops"] if o["op"]["category"] == "matmul"]
    assert mm["op"]["occurrences"] == RUNS and mm["op"]["flops"] == pytest.approx(RUNS * MATMUL_FLOPS)
