"""Issue 14's reproductions: each bad input exits 2 with one line naming the flag, field or file:line (no
traceback, no silent wrong number)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.inputcheck import short

# Two XLA points (the op model: no jax tracing), as in perfmodel/data/validation/tpu_v5e_matmul.yaml.
PUBLISHED = """source: {title: test, measurement: timeit mean over 100 calls}
chip: tpu-v5e
points:
  - {kernel: xla, m: 4096, n: 4096, k: 4096, measured_ms: 0.82729}
  - {kernel: xla, m: 8192, n: 8192, k: 8192, measured_ms: MEASURED}
"""


def run(*args: str, **kwargs):
    return CliRunner().invoke(main, list(args), **kwargs)


def one_line_error(res, *needles: str) -> str:
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), res.output
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


@pytest.mark.parametrize("measured", [".nan", ".inf", "-0.5", "0"])
@pytest.mark.parametrize("command", ["compare", "calibrate", "report"])
def test_bad_measured_time_is_refused_with_file_line(tmp_path, command, measured):
    f = tmp_path / "v.yaml"
    f.write_text(PUBLISHED.replace("MEASURED", measured))
    extra = ["--out", str(tmp_path / "r.md")] if command == "report" else []
    # the second point is on line 5 of the file
    one_line_error(run(command, str(f), *extra), f"{f}:5: field 'measured_ms'")


def _record_line(tmp_path) -> dict:
    f = tmp_path / "v.yaml"
    f.write_text(PUBLISHED.replace("MEASURED", "6.04715"))
    res = run("compare", str(f), "--json")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)["records"][0]
    rec.pop("where")
    return rec


@pytest.mark.parametrize("command", ["compare", "calibrate"])
def test_compiled_record_of_an_unknown_chip_names_file_line(tmp_path, command):
    rec = _record_line(tmp_path)
    rec["prediction"]["chip"] = rec["device_chip"] = "tpu-v99"
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(rec) + "\n")
    one_line_error(run(command, str(f)), f"{f}:1: field 'prediction.chip' is 'tpu-v99': unknown chip")


def test_nan_time_in_a_results_line(tmp_path):
    rec = _record_line(tmp_path)
    rec["timing"]["measured_s"] = float("nan")
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(rec) + "\n")  # json.dumps writes NaN, which json.loads reads back
    one_line_error(run("compare", str(f)), f"{f}:1: field 'timing.measured_s' is nan")


def test_gemm_that_would_overflow_int64_is_refused():
    # 2e15 * 65536 * 65536 = 8.6e24 > 2**62
    one_line_error(run("predict", "gemm", "-m", "2000000000000000", "-n", "65536", "-k", "65536"),
                   "--m, --n, --k", "8.59e+24")


#: Real long-context shapes (128k contexts, 64k-token prefill chunks, 128k-256k vocabularies) on every predict op:
#: none may be refused by the overflow guard, which multiplies only the sizes each model multiplies.
LONG_CONTEXT = [
    # the false refusal of issue 32: all flags multiplied gave 9.2e18; the model's largest count is
    # 1 x 32 heads x 16384 x 16384 x 64 = 5.5e11
    ("attention", "--hw", "tpu-7x", "--batch", "1", "--q-len", "16384", "--kv-len", "16384", "--q-heads", "32",
     "--kv-heads", "32", "--head-dim", "64", "--block-q", "512", "--block-kv", "1024"),
    ("attention", "--q-len", "131072", "--q-heads", "128", "--kv-heads", "8", "--head-dim", "128",
     "--block-q", "2048", "--block-kv", "2048"),
    ("chunked-attention", "--hw", "tpu-7x/core", "--batch", "1", "--q-len", "131072", "--q-heads", "128",
     "--kv-heads", "8", "--head-dim", "256"),
    ("decode-attention", "--batch", "256", "--context", "131072", "--q-heads", "128", "--kv-heads", "8",
     "--head-dim", "128", "--page-size", "256"),
    ("ragged-attention", "--query-lens", "65536,1x255", "--context-lens", "131072x256", "--q-heads", "64",
     "--kv-heads", "8", "--head-dim", "128", "--page-size", "256", "--block-q", "512"),
    ("mla-decode", "--batch", "256", "--context", "131072"),
    ("gemm", "-m", "65536", "-n", "131072", "-k", "16384", "--batch", "4"),
    ("sampling", "--batch", "1024", "--vocab", "262144", "--projection-hidden", "16384"),
    ("kv-cache", "update", "--tokens", "65536", "--kv-heads", "8", "--head-dim", "128", "--page-size", "256"),
    ("kv-cache", "gather", "--batch", "256", "--context", "131072", "--kv-heads", "8", "--head-dim", "128"),
    ("copy", "--elements", str(1 << 36)),
    ("gather", "--rows", "65536", "--row-elements", "16384"),
    ("fused", "rms-norm", "--tokens", "65536", "--hidden", "16384"),
    ("fused", "rms-norm", "--tokens", "131072", "--hidden", "16384", "--subtract-mean", "--backward"),
    ("fused", "swiglu", "--tokens", "65536", "--intermediate", "53248"),
    ("fused", "rope", "--tokens", "65536", "--heads", "128", "--head-dim", "128"),
    ("fused", "dequant-gemm", "-m", "65536", "-n", "53248", "-k", "16384"),
]


@pytest.mark.parametrize("argv", LONG_CONTEXT, ids=lambda a: " ".join(a[:2]))
def test_real_long_context_shapes_are_not_refused(argv):
    res = run("predict", *argv, "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)


def test_the_overflow_guard_names_the_sizes_the_model_multiplies():
    # 1 x 32 x 2**26 x 2**26 x 128 = 1.8e19 > 2**58: refused, naming the product's flags (not the block sizes)
    one_line_error(run("predict", "attention", "--q-len", str(1 << 26), "--q-heads", "32", "--head-dim", "128",
                       "--block-q", "512"), "--q-heads, --q-len, --kv-len (= --q-len), --head-dim", "past 2**58")


def test_context_list_that_would_exhaust_memory_is_refused():
    one_line_error(run("predict", "decode-attention", "--context-lens", "4096x1000000000"),
                   "--context-lens", "1,000,000,000 lengths")


def test_analyze_shape_larger_than_any_chip_is_refused():
    # 1e6 * 1e6 elements * 2 bytes = 2e12 bytes > 2**40
    one_line_error(run("analyze", "kernels.matmul.kernel:matmul", "--shape", "x=1000000x1000000:bf16",
                       "--shape", "w=1000000x1000000:bf16"), "--shape 'x=1000000x1000000:bf16': 2e+12 bytes")


def test_sweep_with_an_empty_value():
    one_line_error(run("predict", "gemm", "-n", "8", "-k", "8", "--sweep", "m=1,,2"), "--sweep 'm=1,,2'",
                   "empty value")


def test_hw_with_only_a_comma():
    one_line_error(run("predict", "gemm", "-m", "8", "-n", "8", "-k", "8", "--hw", ","), "--hw ','")


def test_single_chip_commands_refuse_a_repeated_hw():
    one_line_error(run("tune", "matmul", "--hw", "v5e", "--hw", "v6e"), "--hw given 2 times")


def test_spec_file_that_is_not_utf8(tmp_path):
    f = tmp_path / "chip.yaml"
    f.write_bytes(b"name: x\n\xff\xfe\n")
    one_line_error(run("hw", "show", str(f)), f"{f}:2: not UTF-8 text (byte 0xff")


def test_hw_show_dev_null_is_not_a_regular_file():
    one_line_error(run("hw", "show", "/dev/null"), "'/dev/null' is not a regular file")


def test_user_spec_alias_clashing_with_a_builtin_names_both_files(tmp_path, monkeypatch):
    from perfmodel.hw import registry

    src = (registry._builtin_dir() / "tpu-v5e.yaml").read_text()
    text = src.replace("name: tpu-v5e", "name: lab-chip", 1)
    text = text.replace("aliases: [v5e, v5litepod, v5-lite, tpu-v5-lite]", "aliases: [lab, v6e]")
    text = text.replace('jax_device_kinds: ["TPU v5 lite", "TPU v5e"]', "jax_device_kinds: []")
    assert text.count("lab") == 2
    d = tmp_path / "specs"
    d.mkdir()
    (d / "lab.yaml").write_text(text)
    monkeypatch.setenv(registry.ENV_VAR, str(d))
    one_line_error(run("hw", "show", "v6e"), str(d / "lab.yaml"), "tpu-v6e.yaml", "both answer to 'v6e'")


def test_config_json_nan_and_not_utf8(tmp_path):
    f = tmp_path / "config.json"
    f.write_text('{"hidden_size": NaN, "num_attention_heads": 32, "intermediate_size": 8192, '
                 '"vocab_size": 1000, "num_hidden_layers": 2}')
    one_line_error(run("predict", "model", "--config", str(f)), "field 'hidden_size' must be a whole number")
    f.write_bytes(b'{"hidden_size": \xff}')
    one_line_error(run("predict", "model", "--config", str(f)), f"{f}:1: not UTF-8 text")


def test_report_of_a_png(tmp_path):
    f = tmp_path / "x.png"
    f.write_bytes(b"\x89PNG\r\n\x1a\n")
    one_line_error(run("report", str(f), "--out", str(tmp_path / "r.md")), "INPUT", "not UTF-8 text (byte 0x89")


def test_a_long_chip_name_is_not_echoed_in_full():
    line = one_line_error(run("predict", "gemm", "-m", "8", "-n", "8", "-k", "8", "--hw", "x" * 100_000))
    assert len(line) < 400


def test_short_keeps_both_ends():
    assert short("abc", 10) == "abc"
    # 10 characters: (10 - 3) // 2 = 3 kept at each end
    assert short("0123456789abcdef", 10) == "012...def (16 characters)"


def test_report_and_compare_plot_never_overwrite_without_force(tmp_path):
    f = tmp_path / "v.yaml"
    f.write_text(PUBLISHED.replace("MEASURED", "6.04715"))
    (tmp_path / "n.png").write_bytes(b"mine")
    # report --out n.md would also write n.png, which the user never named: refused, and named
    one_line_error(run("report", str(f), "--out", str(tmp_path / "n.md")), f"--plot '{tmp_path / 'n.png'}' exists",
                   "--force")
    assert not (tmp_path / "n.md").exists() and (tmp_path / "n.png").read_bytes() == b"mine"
    assert run("report", str(f), "--out", str(tmp_path / "n.md"), "--force").exit_code == 0
    one_line_error(run("compare", str(f), "--plot", str(tmp_path / "n.png")), "--plot", "exists")


def test_measure_out_is_checked_before_measuring(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    one_line_error(run("measure", "no-such-kernel", "--out", str(notes)), "is not a results file")
    assert notes.read_text() == "my notes\n"
    one_line_error(run("measure", "no-such-kernel", "--out", str(tmp_path / "missing" / "r.jsonl")),
                   "does not exist")
