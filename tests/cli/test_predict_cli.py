"""`perfmodel predict ...` through click's test runner."""

import csv
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfmodel.errors import InputError
from click.testing import CliRunner

from perfmodel.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def run(*args, code=0):
    result = CliRunner().invoke(main, ["predict", *args])
    assert result.exit_code == code, result.output
    return result.output


def run_json(*args):
    return json.loads(run(*args, "--json"))


def test_gemm_report_hand_worked():
    out = run("gemm", "--hw", "v5e", "-m", "8192", "-n", "8192", "-k", "8192")
    # 2*8192^3 / 1.97e14 = 5.58 ms; 3*8192^2*2 = 402.7 MB split 268 MB read + 134 MB written
    assert "MXU-bound" in out and "5.58 ms" in out
    assert "268 MB" in out and "134 MB" in out
    rec = run_json("gemm", "--hw", "v5e", "-m", "8192", "-n", "8192", "-k", "8192")[0]
    assert rec["roofline"]["floor_s"] == pytest.approx(2 * 8192**3 / 1.97e14)
    assert rec["cost"]["hbm_bytes"] == 3 * 8192**2 * 2
    assert rec["roofline"]["bound"] == "MXU-bound" and rec["chip"] == "tpu-v5e"


def test_side_by_side_chips():
    out = run("gemm", "--hw", "v5e,v6e", "--hw", "tpu-v5e", "-m", "1", "-n", "8192", "-k", "8192")
    header = out.splitlines()[2]
    assert "tpu-v5e" in header and "tpu-v6e" in header
    recs = run_json("gemm", "--hw", "v5e", "--hw", "v6e", "-m", "1", "-n", "8192", "-k", "8192")
    assert [r["chip"] for r in recs] == ["tpu-v5e", "tpu-v6e"]
    # GEMV is HBM-bound; v6e's 1638 GB/s vs v5e's 819 GB/s: half the floor
    assert recs[1]["roofline"]["floor_s"] == pytest.approx(recs[0]["roofline"]["floor_s"] / 2, rel=1e-3)


def test_sweep_marks_bound_change():
    out = run("gemm", "--hw", "v5e", "--sweep", "m=1,16,512", "-n", "8192", "-k", "8192")
    lines = [l for l in out.splitlines() if l.startswith(("1 ", "16 ", "512 "))]
    assert len(lines) == 3
    assert "HBM-bound" in lines[0] and "<- bound changes" not in lines[0]
    # m=512: intensity ~ 2*512*8192^2 / (8192^2*2) = 512 FLOP/B > v5e's ridge of 240 -> MXU-bound
    assert "MXU-bound" in lines[2] and "<- bound changes" in lines[2]


def test_sweep_cross_product_csv():
    text = run("gemm", "--hw", "v5e", "--sweep", "m=1,64", "--sweep", "k=128,256", "-n", "128", "--csv")
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [(r["m"], r["k"]) for r in rows] == [("1", "128"), ("1", "256"), ("64", "128"), ("64", "256")]
    # useful FLOPs 2*m*n*k
    assert [float(r["useful_flops"]) for r in rows] == [2 * m * 128 * k for m in (1, 64) for k in (128, 256)]


def test_decode_attention_report():
    out = run("decode-attention", "--hw", "v5e", "--context", "4096", "--batch", "32", "--q-heads", "32",
              "--kv-heads", "8")
    assert "HBM-bound" in out
    # KV: 32 sequences * 4096 tokens * 8 kv heads * 128 * 2 (K, V) * 2 bytes = 537 MB
    assert "537 MB" in out
    rec = run_json("decode-attention", "--context-lens", "17,1000x2", "--q-heads", "8", "--kv-heads", "8")[0]
    assert rec["cost"]["metrics"]["kv_pages_read"] == 2 + 63 * 2


def test_decode_context_distribution():
    rec = run_json("decode-attention", "--context-dist", "uniform:1000:3000", "--batch", "4", "--q-heads", "8")[0]
    # quantiles at 1/8, 3/8, 5/8, 7/8 of [1000, 3000]: 1250, 1750, 2250, 2750
    assert rec["cost"]["metrics"]["context_tokens"] == 1250 + 1750 + 2250 + 2750


def test_attention_and_ragged_and_mla():
    rec = run_json("attention", "--q-len", "1024", "--q-heads", "8", "--block-q", "128", "--block-kv", "128")[0]
    assert rec["cost"]["metrics"]["kv_tiles"] == 36  # 8 q blocks: 1 + 2 + ... + 8
    out = run("ragged-attention", "--query-lens", "1x8,256", "--context-lens", "1024x8,512", "--q-heads", "16",
              "--kv-heads", "4")
    assert "part: prefill" in out and "part: decode" in out
    rec = run_json("mla-decode", "--context", "4096", "--batch", "4")[0]
    assert rec["cost"]["metrics"]["kv_bytes"] == 4 * 4096 * 576 * 2


def test_sampling_shows_both_methods():
    out = run("sampling", "--batch", "64", "--vocab", "128256", "--top-p", "0.9")
    assert "threshold" in out and "sort" in out
    recs = run_json("sampling", "--batch", "64", "--vocab", "128256", "--top-p", "0.9")
    by = {r["variant"]: r["roofline"]["floor_s"] for r in recs}
    assert by["threshold"] < by["sort"]


def test_sampling_models_the_kernel_variants():
    plain = run_json("sampling", "--batch", "8", "--vocab", "1024", "--top-k", "5")[0]["cost"]
    rec = run_json("sampling", "--batch", "8", "--vocab", "1024", "--top-k", "5", "--logit-bias", "--logprobs",
                   "2")[0]["cost"]
    # The bias adds a [8, 1024] f32 read; logprobs write the chosen + 2 ids + 2 values per row (5 x 4 B).
    assert rec["hbm_read_bytes"] - plain["hbm_read_bytes"] == 8 * 1024 * 4
    assert rec["hbm_write_bytes"] - plain["hbm_write_bytes"] == 8 * 5 * 4
    spec = run_json("sampling", "--batch", "8", "--vocab", "1024", "--draft-tokens", "3")[0]["cost"]
    assert spec["name"] == "rejection sampling" and spec["hbm_read_bytes"] == 7 * 8 * 1024 * 4


def test_kv_cache_commands():
    rec = run_json("kv-cache", "update", "--tokens", "128", "--kv-dtype", "int8")[0]
    assert rec["cost"]["hbm_write_bytes"] == 2 * 128 * 8 * 128 + 2 * 128 * 8 * 4
    run("kv-cache", "gather", "--context-lens", "100,200")
    out = run("kv-cache", "capacity", "--hw", "v5e", "--params-b", "8", "--weight-dtype", "bf16", "--layers", "32",
              "--kv-heads", "8", "--context", "4096")
    # 16e9 bytes of weights exceed 90% of 16 GiB (15.46e9)
    assert "no: weights exceed usable HBM" in out
    recs = json.loads(run("kv-cache", "capacity", "--hw", "v6e", "--params-b", "8", "--weight-dtype", "int8",
                          "--layers", "32", "--kv-heads", "8", "--json"))
    free = 0.9 * 32 * 2**30 - 8e9
    assert recs[0]["capacity"]["tokens"] == (free // (131072 * 16)) * 16


def test_kv_capacity_quantized_cache_defaults_to_per_token_scales():
    # as `kv-cache update` and `predict model`: an int8 cache stores one f32 scale per token, kv head, K and V:
    # 2 * 32 layers * 8 heads * (128 * 1 B + 4 B) = 67584 B per token; --kv-scale none drops the scales (65536 B)
    base = ["kv-cache", "capacity", "--params-b", "8", "--layers", "32", "--kv-heads", "8", "--kv-dtype", "int8"]
    assert run_json(*base)[0]["capacity"]["kv_bytes_per_token"] == 67584
    assert run_json(*base, "--kv-scale", "none")[0]["capacity"]["kv_bytes_per_token"] == 65536


def test_fused_commands_show_both_forms():
    recs = run_json("fused", "rms-norm", "--tokens", "4096", "--hidden", "8192")
    by = {r["variant"]: r["cost"]["hbm_bytes"] for r in recs}
    act = 4096 * 8192 * 2
    assert by["fused"] == 4 * act + 8192 * 2
    assert by["unfused"] > by["fused"]
    for args in (["swiglu", "--tokens", "8", "--intermediate", "1024"], ["geglu", "--tokens", "8", "--intermediate",
                                                                           "1024"],
                 ["rope", "--tokens", "8", "--heads", "4"], ["dequant-gemm", "-m", "8", "-n", "256", "-k", "256"]):
        out = run("fused", *args)
        assert "fused" in out and "unfused" in out


def test_collective_sweep_through_one_chip():
    # one chip moves no bytes at all: intensity is n/a (not a crash on 0 FLOP / 0 B), nothing bounds it
    out = run("collective", "all-gather", "--shape", "8,8", "--sweep", "num-chips=1,2")
    one = next(l for l in out.splitlines() if l.startswith("1 "))
    two = next(l for l in out.splitlines() if l.startswith("2 "))
    assert "no work" in one and "n/a" in one
    assert "ICI-bound" in two and "<- bound changes" in two


def test_collective():
    rec = run_json("collective", "all-gather", "--bytes-per-chip", "64e6", "--num-chips", "8", "--hw", "v5e")[0]
    assert rec["roofline"]["floor_s"] == pytest.approx(7 * 64e6 / 1e11)  # 2 links of 50 GB/s
    run("collective", "all-reduce", "--shape", "8,4096", "--num-chips", "4", "--topology", "torus")


@pytest.mark.parametrize("args,code,match", [
    (["gemm", "-m", "1", "-n", "8", "-k", "8", "--hw", "tpu-v99"], 2, "unknown chip 'tpu-v99'"),
    (["gemm", "-m", "0", "-n", "8", "-k", "8"], 2, "--m must be >= 1, got 0"),
    (["gemm", "-m", "1", "-n", "8", "-k", "8", "--rhs-dtype", "int3"], 2, "--rhs-dtype: unknown dtype 'int3'"),
    (["gemm", "-n", "8", "-k", "8"], 2, "missing option --m"),
    (["gemm", "-n", "8", "-k", "8", "--sweep", "q=1,2"], 2, "--sweep: 'q' cannot be swept here"),
    (["gemm", "-n", "8", "-k", "8", "--sweep", "m"], 2, "--sweep 'm': write NAME=V1,V2"),
    (["gemm", "-n", "8", "-k", "8", "--sweep", "=1,2"], 2, "--sweep '=1,2': write NAME=V1,V2"),
    (["gemm", "-n", "8", "-k", "8", "--sweep", "m=1,x"], 2, "--sweep m:"),
    (["gemm", "-m", "1", "-n", "8", "-k", "8", "--json", "--csv"], 2, "pick one output format"),
    (["attention", "--q-len", "64", "--q-heads", "6", "--kv-heads", "4"], 2, "--kv-heads 4 must divide --q-heads 6"),
    (["decode-attention", "--context", "5000", "--pages-per-seq", "4"], 2,
     "--context: a context of 5000 tokens needs 313 pages of 16 tokens but --pages-per-seq is 4"),
    (["decode-attention", "--context", "10", "--context-lens", "3"], 2, "give exactly one of --context"),
    (["decode-attention", "--context-dist", "zipf:1:2"], 2, "--context-dist: 'zipf:1:2'"),
    (["ragged-attention", "--query-lens", "9", "--context-lens", "4"], 2, "--query-lens 9 exceeds --context-lens 4"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2"], 2, "give exactly one of --weight-bytes"),
    (["collective", "all-gather", "--num-chips", "4"], 2, "give exactly one of --bytes-per-chip and --shape"),
    # messages name the flag the command really has (--tokens, --projection-hidden, --context, --params-b)
    (["kv-cache", "update"], 2, "missing option --tokens: give --tokens VALUE or --sweep tokens=V1,V2"),
    (["kv-cache", "update", "--tokens", "0"], 2, "--tokens must be >= 1, got 0"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2", "--params-b", "-8"], 2,
     "--params-b must be a positive number of billions of parameters, got -8"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2", "--params-b", "8", "--reserved-bytes", "-1"], 2,
     "--reserved-bytes must be >= 0"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2", "--weight-bytes", "nan"], 2,
     "--weight-bytes must be a finite number of bytes, got nan"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2", "--params-b", "8", "--context", "0"], 2,
     "--context must be >= 1, got 0"),
    (["kv-cache", "capacity", "--layers", "2", "--kv-heads", "2", "--params-b", "8", "--kv-scale", "per-token"], 2,
     "--kv-scale per-token: a bf16 KV cache has no scales"),
    (["sampling", "--batch", "2", "--vocab", "100", "--greedy", "--top-k", "5"], 2,
     "greedy sampling takes the argmax and applies no filters; drop --top-k / --top-p / --min-p or sample with "
     "--temperature"),
    (["sampling", "--batch", "2", "--vocab", "100", "--projection-hidden", "0"], 2,
     "--projection-hidden must be >= 1, got 0"),
    (["sampling", "--batch", "2", "--vocab", "100", "--draft-tokens", "2", "--top-k", "5"], 2,
     "--top-k does not apply with --draft-tokens"),
    (["sampling", "--batch", "2", "--vocab", "100", "--logprobs", "-1"], 2, "--logprobs must be >= 0, got -1"),
    (["fused", "rope", "--tokens", "8", "--heads", "2", "--rotary-dim", "33"], 2, "--rotary-dim must be even"),
    (["fused", "dequant-gemm", "-m", "8", "-n", "8", "-k", "8", "--weight-dtype", "bf16"], 2,
     "--weight-dtype bf16: weights are not quantized"),
    (["gemm", "-m", "1", "-n", "8", "-k", "8", "--hw", "./no-such-chip.yaml"], 2,
     "spec file './no-such-chip.yaml' does not exist; give a chip name"),
    (["gemm", "-m", "1", "-n", "8", "-k", "8", "--hw", str(ROOT / "hwspecs")], 2, "is a directory; give one chip"),
])
def test_errors_are_one_line(args, code, match):
    result = CliRunner().invoke(main, ["predict", *args])
    assert result.exit_code == code
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and match in lines[0], result.output


#: One small invocation of every `perfmodel predict` command (each must take --json and never import jax).
EVERY_COMMAND = [
    ["gemm", "-m", "8", "-n", "128", "-k", "128"],
    ["attention", "--q-len", "128", "--q-heads", "4", "--kv-heads", "2"],
    ["chunked-attention", "--q-len", "256", "--q-heads", "4", "--kv-heads", "2"],
    ["decode-attention", "--context", "100", "--batch", "2"],
    ["ragged-attention", "--query-lens", "1,64", "--context-lens", "100,200"],
    ["mla-decode", "--context", "100"],
    ["sampling", "--batch", "2", "--vocab", "1000", "--top-p", "0.9"],
    ["kv-cache", "update", "--tokens", "4"],
    ["kv-cache", "gather", "--context", "100"],
    ["kv-cache", "capacity", "--layers", "32", "--kv-heads", "8", "--params-b", "8"],
    ["copy", "--shape", "8,128"],
    ["gather", "--rows", "8", "--row-elements", "128"],
    ["fused", "rms-norm", "--tokens", "8", "--hidden", "128"],
    ["fused", "swiglu", "--tokens", "8", "--intermediate", "128"],
    ["fused", "geglu", "--tokens", "8", "--intermediate", "128"],
    ["fused", "rope", "--tokens", "8", "--heads", "2"],
    ["fused", "dequant-gemm", "-m", "8", "-n", "128", "-k", "128"],
    ["collective", "all-gather", "--num-chips", "4", "--shape", "8,8"],
    ["collective", "reduce-scatter", "--num-chips", "4", "--shape", "8,8"],
    ["collective", "all-reduce", "--num-chips", "4", "--shape", "8,8"],
    ["model", "llama-3.1-8b", "--batch", "2"],
    ["model", "--list"],
]


def test_every_command_is_covered():
    """EVERY_COMMAND names every leaf command of `perfmodel predict` (so a new one gets the checks below)."""
    import click

    from perfmodel.cli.predict import predict

    def leaves(group, prefix=()):
        for name, cmd in group.commands.items():
            if isinstance(cmd, click.Group):
                yield from leaves(cmd, prefix + (name,))
            else:
                yield prefix + (name,)

    covered = {tuple(a[: 2 if a[0] in ("kv-cache", "fused") else 1]) for a in EVERY_COMMAND}
    assert set(leaves(predict)) == covered


@pytest.mark.parametrize("args", EVERY_COMMAND, ids=[" ".join(a[:2]) for a in EVERY_COMMAND])
def test_every_command_takes_json(args):
    data = json.loads(run(*args, "--json"))
    assert isinstance(data, list) and data


def test_no_predict_command_imports_jax():
    code = ("import sys\nfrom click.testing import CliRunner\nfrom perfmodel.cli.main import main\n"
            f"for args in {EVERY_COMMAND!r}:\n"
            "    r = CliRunner().invoke(main, ['predict', *args])\n"
            "    assert r.exit_code == 0, (args, r.output)\n"
            "    assert 'jax' not in sys.modules, f'jax imported by predict {args}'\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_predict_path_does_not_import_jax():
    code = ("import sys\nfrom perfmodel.cli.main import main\n"
            "try:\n    main(['predict', 'gemm', '-m', '1', '-n', '8', '-k', '8'])\nexcept SystemExit:\n    pass\n"
            "assert 'jax' not in sys.modules, 'jax imported'\n")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True)


# ----------------------------------------------------------------------------- --sweep next to the flag it sweeps


@pytest.mark.parametrize("args, match", [
    (["predict", "gemm", "-m", "4", "--sweep", "m=1,2", "-n", "8", "-k", "8"],
     r"^Error: --sweep m: --m is also given and would be ignored; drop --m or the sweep$"),
    (["predict", "decode-attention", "--context", "100", "--batch", "4", "--sweep", "batch=1,2"],
     r"^Error: --sweep batch: --batch is also given and would be ignored; drop --batch or the sweep$"),
    (["predict", "model", "llama-3.1-8b", "--batch", "4", "--sweep", "batch=1,32"],
     r"^Error: --sweep batch: --batch is also given and would be ignored; drop --batch or the sweep$"),
])
def test_sweep_and_explicit_flag_conflict_is_one_line(args, match):
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert len(lines) == 1
    assert re.match(match, lines[0]), lines[0]


def test_sweep_without_the_flag_still_sweeps():
    result = CliRunner().invoke(main, ["predict", "gemm", "--sweep", "m=1,2", "-n", "8", "-k", "8", "--csv"])
    assert result.exit_code == 0, result.output
    rows = result.output.strip().splitlines()
    assert len(rows) == 3  # header + one row per swept m


# ----------------------------------------------------------------------------- units and counts in reports


def _row(output: str, label: str) -> str:
    """The value column of one report row."""
    lines = [line for line in output.splitlines() if line.startswith(label + "  ")]
    assert len(lines) == 1, output
    return lines[0][len(label):].strip()


def test_attention_report_vmem_in_binary_and_reread_factor_with_x():
    # 512 x 512 blocks given (the default is the bundled kernel's tuned block for the chip)
    out = run("attention", "--q-len", "4096", "--kv-heads", "4", "--block-q", "512", "--block-kv", "512")
    assert re.fullmatch(r"\d+(\.\d+)? MiB", _row(out, "VMEM working set"))
    # 8 causal q blocks of 512 read 1 + 2 + ... + 8 = 36 KV tiles instead of 8: 36 / 8 = 4.50x
    assert _row(out, "kv reread factor") == "4.50x"


def test_counts_in_reports_have_thousands_separators():
    out = run("decode-attention", "--context", "127076", "--batch", "1")
    assert _row(out, "context tokens") == "127,076"
    # ceil(127076 / 16) = 7943 pages (16 x 7942 = 127072, 4 tokens over)
    assert _row(out, "kv pages read") == "7,943"


# ----------------------------------------------------------------------------- the page-table error names the flag


@pytest.mark.parametrize("args, match", [
    # ceil(100 / 16) = 7 pages
    (["decode-attention", "--context", "100", "--batch", "2", "--pages-per-seq", "2"],
     r"^Error: --context: a context of 100 tokens needs 7 pages of 16 tokens but --pages-per-seq is 2; "
     r"give --pages-per-seq 7 or more, or a larger --page-size$"),
    # uniform:100:200 at batch 2 -> quantiles 125 and 175; ceil(125 / 16) = 8
    (["decode-attention", "--context-dist", "uniform:100:200", "--batch", "2", "--pages-per-seq", "2"],
     r"^Error: --context-dist: a context of 125 tokens needs 8 pages of 16 tokens but --pages-per-seq is 2; "),
    # ceil(1000 / 64) = 16
    (["mla-decode", "--context-lens", "100,1000", "--pages-per-seq", "2"],
     r"^Error: --context-lens: a context of 1000 tokens needs 16 pages of 64 tokens but --pages-per-seq is 2; "),
    (["ragged-attention", "--query-lens", "1,5", "--context-lens", "100,50", "--pages-per-seq", "2"],
     r"^Error: --context-lens: a context of 100 tokens needs 7 pages of 16 tokens but --pages-per-seq is 2; "),
])
def test_page_table_error_names_the_context_flag_given(args, match):
    res = CliRunner().invoke(main, ["predict", *args])
    assert res.exit_code == 2
    assert len(res.output.strip().splitlines()) == 1, res.output
    assert re.search(match, res.output.strip())


def test_gemm_precision_sets_the_fp32_passes():
    # 1024^3 f32 on v5e: 2.147 GFLOP useful; HIGHEST issues 6 bf16 passes, DEFAULT one, so the MXU floor is 6x.
    base = ["predict", "gemm", "-m", "1024", "-n", "1024", "-k", "1024", "--lhs-dtype", "f32", "--rhs-dtype", "f32",
            "--out-dtype", "f32", "--hw", "v5e", "--json"]
    rows = {}
    for precision in ("default", "high", "highest"):
        result = CliRunner().invoke(main, base + ["--precision", precision])
        assert result.exit_code == 0, result.output
        rows[precision] = json.loads(result.output)
    mxu = {p: r[0]["cost"]["mxu_flops"] for p, r in rows.items()}
    assert mxu["default"] == 2 * 1024**3
    assert mxu["high"] == 3 * mxu["default"] and mxu["highest"] == 6 * mxu["default"]
    bad = CliRunner().invoke(main, base + ["--precision", "fastest"])
    assert bad.exit_code == 2 and "--precision" in bad.output


@pytest.mark.parametrize("argv", [
    ["predict", "attention", "--q-len", "1024", "--dtype", "f32"],
    ["predict", "decode-attention", "--context", "2048", "--batch", "8", "--q-dtype", "f32", "--kv-dtype", "f32"],
    ["predict", "ragged-attention", "--query-lens", "64,1", "--context-lens", "1024,2048", "--q-dtype", "f32",
     "--kv-dtype", "f32"],
])
def test_attention_precision_multiplies_the_f32_mxu_work(argv):
    def mxu(precision):
        result = CliRunner().invoke(main, argv + ["--hw", "v5e", "--precision", precision, "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)[0]["cost"]["mxu_flops"]

    assert mxu("highest") == pytest.approx(6 * mxu("default")) and mxu("high") == pytest.approx(3 * mxu("default"))


# ----------------------------------------------------------------------------- copy / gather, fixed costs


def test_copy_reports_fixed_costs_apart():
    out = run("copy", "--hw", "v5e", "--shape", "1024,1024")
    # 4 MiB at 819 GB/s = 5.12 us floor; + 1 us launch + 0.51 us DMA latency in expected (7.54 us)
    assert re.search(r"floor \(roofline\)\s+5\.12 µs", out)
    assert re.search(r"in expected: launch\s+1\.00 µs", out)
    assert re.search(r"in expected: DMA latency\s+510 ns", out)
    assert "expected + host dispatch" in out


def test_copy_json_says_which_part_is_which():
    (rec,) = run_json("copy", "--hw", "v5e", "--bytes", "1e6")
    roof = rec["roofline"]
    assert roof["fixed_parts_s"]["launch"] == pytest.approx(1e-6)
    assert roof["expected_with_dispatch_s"] == pytest.approx(roof["expected_s"] + roof["host_dispatch_s"])


def test_gather_is_row_bound_on_one_7x_core():
    (rec,) = run_json("gather", "--hw", "tpu-7x/core", "--rows", "4194304", "--row-elements", "128",
                      "--dtype", "int32")
    # 4,194,304 rows x 7.25 cycles / 1.9 GHz = 16.0 ms of row issue on top of 1.17 ms of traffic
    assert rec["roofline"]["fixed_parts_s"]["op"] == pytest.approx(4194304 * 7.25 / 1.9e9)
    assert rec["roofline"]["floor_s"] < 0.1 * rec["roofline"]["expected_s"]


def test_copy_with_out_dtype_converts():
    # 1024 x 1024 f32 read (4 MiB), written as bf16 (2 MiB): one VPU op per element.
    (rec,) = run_json("copy", "--hw", "v5e", "--shape", "1024,1024", "--dtype", "fp32", "--out-dtype", "bf16")
    assert rec["cost"]["hbm_read_bytes"] == 4 * 2**20 and rec["cost"]["hbm_write_bytes"] == 2 * 2**20
    assert rec["cost"]["vpu_ops"] == 2**20
    out = run("copy", "--hw", "v5e", "--bytes", "1e6", "--out-dtype", "bf16", code=2)
    assert "--out-dtype converts elements: give --elements instead of --bytes" in out
    out = run("copy", "--hw", "v5e", "--elements", "64", "--out-dtype", "bf17", code=2)
    assert "--out-dtype" in out and "Traceback" not in out


def test_fused_layer_norm_and_one_form():
    recs = run_json("fused", "rms-norm", "--hw", "v5e", "--tokens", "4096", "--hidden", "8192", "--no-residual",
                    "--subtract-mean")
    assert [r["cost"]["name"] for r in recs] == ["layer-norm", "layer-norm"]
    # unfused: x read three times (mean, variance, normalize) = 3 x 4096 x 8192 x 2 B, plus 3 f32 statistics
    # read back (the mean by the variance and normalizing passes, the rms by the latter: 3 x 4096 x 4 B) and the
    # weight (8192 x 2 B)
    assert recs[1]["cost"]["hbm_read_bytes"] == 3 * 4096 * 8192 * 2 + 3 * 4096 * 4 + 8192 * 2
    from perfmodel.hw.registry import get_chip
    from perfmodel.predict.ops import predict_op

    (pred,) = predict_op("rms-norm", {"tokens": 8, "hidden": 128, "form": "unfused"}, chips=[get_chip("v5e")]).predictions
    assert pred.cost.metrics["kernels"] == 3
    with pytest.raises(InputError, match="unfused"):
        predict_op("rms-norm", {"tokens": 8, "hidden": 128, "form": "both"}, chips=[get_chip("v5e")])


def test_norm_over_a_leading_axis_takes_no_xlu():
    # tokamax's axis-0 layer norm of [128, 384, 384]: 147,456 rows of 128, summed across whole vregs on the VPU
    args = ("fused", "rms-norm", "--hw", "tpu-7x/core", "--tokens", "147456", "--hidden", "128", "--no-residual",
            "--subtract-mean")
    last = run_json(*args)
    leading = run_json(*args, "--normalized-axis", "leading")
    assert all(r["cost"]["xlu_ops"] > 0 for r in last) and all(r["cost"]["xlu_ops"] == 0 for r in leading)
    assert all(b["roofline"]["expected_s"] < a["roofline"]["expected_s"] for a, b in zip(last, leading))
    assert last[0]["roofline"]["limiter"] == "xlu" and leading[0]["roofline"]["limiter"] == "hbm"
    out = run(*args, "--normalized-axis", "middle", code=2)
    assert "--normalized-axis" in out and "Traceback" not in out


def test_fused_norm_backward():
    recs = run_json("fused", "rms-norm", "--hw", "v5e", "--tokens", "4096", "--hidden", "8192", "--no-residual",
                    "--subtract-mean", "--backward")
    assert [r["cost"]["name"] for r in recs] == ["layer-norm backward"] * 2
    # fused: x and dout (2 x 4096 x 8192 x 2 B), rstd and mean (2 x 4096 x 4 B) and the weight (8192 x 2 B)
    assert recs[0]["cost"]["hbm_read_bytes"] == 2 * 4096 * 8192 * 2 + 2 * 4096 * 4 + 8192 * 2
    assert recs[1]["cost"]["metrics"]["kernels"] == 2 and recs[0]["cost"]["eup_ops"] == 0
    text = run("fused", "rms-norm", "--hw", "v5e", "--tokens", "4096", "--hidden", "8192", "--backward")
    assert "backward=True" in text and "µs" in text


def test_copy_needs_one_size():
    out = run("copy", "--hw", "v5e", code=2)
    assert "--bytes" in out and "--elements" in out


def test_gather_requires_rows():
    out = run("gather", "--hw", "v5e", "--row-bytes", "64", code=2)
    assert "--rows" in out


def test_gemm_dynamic_activation_quantization():
    # M=8, K=N=128 on v5e, int8 x int8: activations read as bf16 (8*128*2 = 2048 B) + int8 weights 16384 B
    # + per-channel scales 512 B = 18944 B; int8 activations quantized outside (--lhs-dtype int8) are 1024 B and 8
    # f32 per-token scales (32 B): 17952 B.
    args = ("gemm", "--hw", "v5e", "-m", "8", "-n", "128", "-k", "128", "--rhs-dtype", "int8")
    fused = run_json(*args, "--lhs-dtype", "bf16", "--quantize-activations")[0]
    plain = run_json(*args, "--lhs-dtype", "int8")[0]
    assert fused["cost"]["hbm_read_bytes"] == 18944 and plain["cost"]["hbm_read_bytes"] == 17952
    assert fused["cost"]["mxu_dtype"] == "int8"
    result = CliRunner().invoke(main, ["predict", "gemm", *args[1:], "--lhs-dtype", "int8", "--quantize-activations"])
    assert result.exit_code != 0 and len(result.output.strip().splitlines()) == 1
    assert "--quantize-activations" in result.output and "Traceback" not in result.output


def test_a_sweep_names_an_option_by_its_flag():
    # predict copy's --bytes is the option array_bytes: `--sweep bytes=...` sweeps it (2 MiB and 4 MiB: 2 rows),
    # and an unknown name lists the flags.
    res = CliRunner().invoke(main, ["predict", "copy", "--hw", "v5e", "--sweep", "bytes=2097152,4194304", "--json"])
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.output)) == 2
    res = CliRunner().invoke(main, ["predict", "copy", "--hw", "v5e", "--sweep", "foo=1"])
    assert res.exit_code == 2 and "sweepable: bytes, shape, elements" in res.output


def test_chunked_attention_cli():
    # tokamax's mixtral shapes on one 7x core: the loop's 1,024 chunk pairs, VPU-bound (its bundles as issue slots)
    rec = run_json("chunked-attention", "--hw", "tpu-7x/core", "--batch", "32", "--q-len", "4096", "--q-heads",
                   "32", "--kv-heads", "8", "--head-dim", "128")[0]
    assert rec["cost"]["metrics"]["iterations"] == 1024 and rec["roofline"]["limiter"] == "vpu"
    assert rec["roofline"]["floor_s"] < rec["roofline"]["expected_s"]
    text = run("chunked-attention", "--hw", "tpu-7x/core", "--q-len", "1024", "--bias-and-mask", "--head-dim", "64")
    assert "chunk loop" in text and "VPU-bound" in text
    out = run("chunked-attention", "--hw", "h100-sxm", "--q-len", "1024", code=2)
    assert "not a TPU" in out and "Traceback" not in out
