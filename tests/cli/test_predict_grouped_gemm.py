"""`perfmodel predict gemm --groups / --group-sizes`: the grouped GEMM of mixture of experts (the bundled
grouped_matmul's op model) through click's test runner."""

import json

from click.testing import CliRunner

from perfmodel.cli.main import main


def run(*args, code=0):
    result = CliRunner().invoke(main, ["predict", "gemm", "--hw", "v5e", *args])
    assert result.exit_code == code, result.output
    return result.output


def test_decode_over_eight_experts_reads_each_experts_weights_once():
    # 64 tokens over 8 experts (8 rows each), K = 4096, N = 14336, bf16: weights 8 * 4096 * 14336 * 2 B =
    # 939,524,096 B + lhs 64 * 4096 * 2 B = 524,288 B read; out 64 * 14336 * 2 B = 1,835,008 B written;
    # HBM-bound on v5e: 941,883,392 B / 819 GB/s = 1.15 ms.
    rec = json.loads(run("-m", "64", "-k", "4096", "-n", "14336", "--groups", "8", "--json"))[0]
    assert rec["cost"]["name"] == "grouped_gemm"
    assert rec["cost"]["hbm_read_bytes"] == 939_524_096 + 524_288
    assert rec["cost"]["hbm_write_bytes"] == 1_835_008
    assert rec["roofline"]["bound"] == "HBM-bound"
    assert "1.15 ms" in run("-m", "64", "-k", "4096", "-n", "14336", "--groups", "8")


def test_group_sizes_skip_empty_experts_and_count_padded_tiles():
    # Sizes 3, 0, 5 (M = 8 by default): 2 experts' weights, 2 * 4096 * 14336 * 2 B = 234,881,024 B, + lhs
    # 8 * 4096 * 2 B = 65,536 B. --block-m 16: tile 0 is computed for groups 0 and 2, 2 * 16 rows issued:
    # 2 * 32 * 14336 * 4096 = 3,758,096,384 FLOPs (4x the useful 939,524,096).
    rec = json.loads(run("-k", "4096", "-n", "14336", "--group-sizes", "3,0,5", "--block-m", "16", "--json"))[0]
    assert rec["cost"]["hbm_read_bytes"] == 234_881_024 + 65_536
    assert (rec["cost"]["mxu_flops"], rec["cost"]["useful_flops"]) == (3_758_096_384, 939_524_096)


def test_grouped_errors_name_the_flags():
    out = run("-m", "4", "-k", "128", "-n", "128", "--group-sizes", "3,5", code=2)
    assert "--group-sizes sum to 8 rows, more than --m=4" in out and "Traceback" not in out
    out = run("-k", "128", "-n", "128", "--group-sizes", "3,x", code=2)
    assert "--group-sizes: expected comma-separated whole numbers" in out
    out = run("-m", "64", "-k", "128", "-n", "128", "--groups", "8", "--group-sizes", "8,56", code=2)
    assert "give one of --groups (even split) and --group-sizes" in out
    out = run("-m", "64", "-k", "128", "-n", "128", "--groups", "8", "--epilogue", "bias", code=2)
    assert "--epilogue: not modelled for a grouped GEMM" in out
    out = run("-m", "64", "-k", "128", "-n", "128", "--block-m", "16", code=2)
    assert "--block-m: only for a grouped GEMM" in out


def test_xla_implementation_is_xlas_ragged_dot_kernel():
    # 8192 rows over 8 experts, K = 4096, N = 14336 bf16 on v5e. XLA's kernel takes 128 x 4096 x 256 tiles
    # (2*128*4096*2 + 2*4096*256*2 + 128*256*12 = 6.68 MB under v5e's 8 MiB; 384 columns would not fit):
    # 56 column tiles, each reading all of lhs again; 8 groups of 1024 rows fill 64 row tiles exactly.
    args = ("-m", "8192", "-k", "4096", "-n", "14336", "--groups", "8", "--json")
    kernel = json.loads(run(*args))[0]
    xla = json.loads(run(*args, "--implementation", "xla"))[0]
    lhs = 8192 * 4096 * 2
    assert xla["cost"]["hbm_read_bytes"] == kernel["cost"]["hbm_read_bytes"] + 55 * lhs
    assert xla["cost"]["mxu_flops"] == kernel["cost"]["mxu_flops"]  # 14336 = 56 x 256: no padded column
    assert xla["roofline"]["expected_s"] > kernel["roofline"]["expected_s"]
    assert any("XLA's ragged-dot kernel, tiles 128 x 4096 x 256" in n for n in xla["cost"]["notes"])
    out = run("-m", "64", "-k", "128", "-n", "128", "--groups", "2", "--implementation", "xla", "--block-m", "64",
              code=2)
    assert "--block-m" in out and "XLA picks its own tiles" in out and "Traceback" not in out


def test_implementation_is_for_a_grouped_gemm_only():
    out = run("-m", "64", "-k", "128", "-n", "128", "--implementation", "xla", code=2)
    assert "--implementation" in out and "--groups" in out and "Traceback" not in out
    out = run("-m", "64", "-k", "128", "-n", "128", "--groups", "2", "--implementation", "cuda", code=2)
    assert "--implementation" in out


def test_ragged_contraction_is_a_weight_gradient():
    # --ragged contraction: 4 groups split K = 4096 rows evenly; out[g] = lhs[rows of g]^T @ rhs[rows of g] is
    # [512 x 1024] per group: 2 x 512 x 1024 x 4096 = 4,294,967,296 FLOPs; lhs 4096 x 512 and rhs 4096 x 1024
    # bf16 read once = 12,582,912 B; a kernel writes each group's bf16 output: 4 x 512 x 1024 x 2 = 4,194,304 B.
    rec = json.loads(run("-m", "512", "-n", "1024", "-k", "4096", "--groups", "4", "--ragged", "contraction",
                         "--json"))[0]
    assert rec["cost"]["useful_flops"] == 4_294_967_296
    assert rec["cost"]["hbm_read_bytes"] == 12_582_912 and rec["cost"]["hbm_write_bytes"] == 4_194_304
    # XLA's convolution writes its outputs alone: the text report says how long
    out = run("-m", "512", "-n", "1024", "--group-sizes", "1024,1024,0,2048", "--ragged", "contraction",
              "--implementation", "xla")
    assert "in expected: HBM traffic run alone" in out and "XLA's convolution over the rows" in out


def test_ragged_contraction_errors_name_the_flags():
    out = run("-m", "512", "-n", "1024", "--groups", "4", "--ragged", "contraction", code=2)
    assert "missing option --k" in out and "Traceback" not in out  # --groups splits K evenly
    out = run("-n", "1024", "--group-sizes", "8,8", "--ragged", "contraction", code=2)
    assert "missing option --m" in out
    out = run("-m", "64", "-k", "128", "-n", "128", "--ragged", "contraction", code=2)
    assert "--ragged: only for a grouped GEMM" in out
    out = run("-m", "64", "-n", "128", "--group-sizes", "8,8", "--ragged", "diagonal", code=2)
    assert "Invalid value for '--ragged'" in out
