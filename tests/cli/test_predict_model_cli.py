"""`perfmodel predict model`: tables, JSON, CSV, several chips, sweeps, config files, errors."""

from __future__ import annotations

import csv
import io
import json
import re
import subprocess
import sys

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.hw import get_chip
from perfmodel.model.configs import get_model
from perfmodel.model.step import make_step
from perfmodel.model.transformer import predict_step
from perfmodel.units import seconds


def run(*args: str):
    return CliRunner().invoke(main, ["predict", "model", *args])


def test_table_report():
    r = run("llama-3.1-8b", "--hw", "v5e", "--batch", "1", "--context", "1024")
    assert r.exit_code == 0, r.output
    lib = predict_step(get_model("llama-3.1-8b"), make_step(batch=1, context=1024), get_chip("tpu-v5e"))
    out = r.output
    assert out.startswith("Llama-3.1 8B on TPU v5e: decode, batch 1, context 1024 tokens")
    for op in ("qkv_proj", "attention", "gate_up", "down", "lm_head", "sampling"):
        assert f"\n{op} " in out
    assert re.search(rf"step floor \(sum of op floors\) +{re.escape(seconds(lib.floor_s))}\n", out)
    assert "tokens/s per chip expected" in out and "MBU at floor" in out and "MFU at floor" in out
    # 2 bytes x 8.03e9 weights + 128 MiB KV do not fit in 90% of 16 GiB:
    # 16,060,522,496 + 134,217,728 - 0.9 * 17,179,869,184 = 732,857,958 B = 699 MiB
    assert re.search(r"\nfits in HBM +NO, short by 699 MiB\n", out) and re.search(r"\nlargest batch that fits +0 \(the weights alone", out)


def test_json_matches_library():
    r = run("mixtral-8x7b", "--hw", "tpu-v5e", "--tp", "4", "--batch", "8", "--context", "512", "--json")
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.output)
    lib = predict_step(get_model("mixtral-8x7b"), make_step(tp=4, batch=8, context=512), get_chip("tpu-v5e"))
    assert rec["floor_s"] == pytest.approx(lib.floor_s)
    assert rec["chip"] == "tpu-v5e" and rec["model"] == "mixtral-8x7b" and rec["step"]["tp"] == 4
    assert rec["routing"]["tokens_per_expert"] == 8 * 2 / 8
    assert sum(op["floor_s"] for op in rec["ops"]) == pytest.approx(rec["floor_s"])
    assert {"fits", "max_batch", "shortfall_bytes", "weight_bytes", "kv_bytes"} <= set(rec["memory"])
    assert rec["tokens_per_s_per_chip"] == pytest.approx(rec["tokens_per_s"] / 4)


def test_csv_rows_sum_to_step():
    r = run("qwen3-32b", "--hw", "v5e", "--tp", "4", "--csv")
    assert r.exit_code == 0, r.output
    rows = list(csv.DictReader(io.StringIO(r.output)))
    step = rows[-1]
    assert step["op"] == "step"
    assert sum(float(x["floor_s"]) for x in rows[:-1]) == pytest.approx(float(step["floor_s"]))
    assert {x["op"] for x in rows} >= {"qkv_proj", "qk_norm", "all_reduce(attn)", "all_gather(logits)"}


def test_several_chips_side_by_side():
    r = run("llama-3.1-8b", "--hw", "v5e", "--hw", "v6e", "--batch", "4")
    assert r.exit_code == 0, r.output
    assert "on TPU v5e, TPU v6e" in r.output.splitlines()[0]
    assert "time [tpu-v5e]" in r.output and "time [tpu-v6e]" in r.output
    j = run("llama-3.1-8b", "--hw", "v5e,v6e", "--batch", "4", "--json")
    recs = json.loads(j.output)
    assert [x["chip"] for x in recs] == ["tpu-v5e", "tpu-v6e"]
    assert recs[1]["floor_s"] < recs[0]["floor_s"]  # v6e has more HBM bandwidth


def test_sweep_marks_where_decode_turns_mxu_bound():
    # short contexts: the weight GEMMs dominate and have intensity ~ batch FLOP/B in bf16;
    # v5e's ridge is 197e12 / 819e9 = 240 FLOP/B, so batch 64 is HBM-bound and batch 2048 MXU-bound
    r = run("llama-3.1-8b", "--hw", "v5e", "--context", "16", "--sweep", "batch=1,64,2048", "--wide")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "sweeping batch" in lines[0]
    rows = {line.split()[0]: line for line in lines[3:]}
    assert "HBM-bound" in rows["64"] and "MXU-bound" in rows["2048"]
    assert rows["2048"].rstrip().endswith("<- bound changes") and "<-" not in rows["64"]


def test_sweep_over_phase_and_dtype():
    r = run("llama-3.1-8b", "--hw", "v5e", "--prefill-len", "256", "--context", "64", "--sweep",
            "phase=prefill,decode", "--sweep", "weight-dtype=bf16,int8", "--json")
    assert r.exit_code == 0, r.output
    recs = json.loads(r.output)
    assert [(x["step"]["phase"], x["step"]["weight_dtype"]) for x in recs] == [
        ("prefill", "bf16"), ("prefill", "int8"), ("decode", "bf16"), ("decode", "int8")]
    assert recs[0]["step"]["chunk_tokens"] == 256 and recs[2]["step"]["chunk_tokens"] == 1


def test_config_json(tmp_path):
    d = tmp_path / "tiny-llama"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 2048, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 8192, "vocab_size": 128256, "tie_word_embeddings": True}))
    r = run("--config", str(d / "config.json"), "--hw", "v5e")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("tiny-llama (llama, from config.json) on TPU v5e")
    assert re.search(r"\nfits in HBM +yes\n", r.output)


def test_config_missing_field_is_one_line(tmp_path):
    f = tmp_path / "config.json"
    f.write_text(json.dumps({"hidden_size": 2048, "num_attention_heads": 32, "intermediate_size": 8192,
                             "vocab_size": 1000}))
    r = run("--config", str(f))
    assert r.exit_code == 2
    expected = f"Error: {f}: field 'num_hidden_layers' is missing; the model needs it (add it to the file)"
    assert r.output.strip() == expected


def test_list():
    r = run("--list")
    assert r.exit_code == 0
    for name in ("llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-32b", "gemma-3-27b", "mixtral-8x7b",
                 "qwen3-235b-a22b", "deepseek-v3"):
        assert f"\n{name} " in r.output
    assert "671 G" in r.output and "37.6 G" in r.output  # DeepSeek-V3 total and active


def test_list_json_has_every_preset_with_sources_and_counts():
    r = run("--list", "--json")
    assert r.exit_code == 0, r.output
    recs = {x["name"]: x for x in json.loads(r.output)}
    assert set(recs) == {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "qwen3-32b", "gemma-3-27b",
                         "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"}
    ds = recs["deepseek-v3"]
    assert ds["sources"]["hidden_size"] in ds["references"]
    # DeepSeek-V3 publishes 671B total / 37B active; the counts come from the shapes
    assert ds["parameter_counts"]["total"] == pytest.approx(671e9, rel=0.01)
    assert ds["parameter_counts"]["active"] == pytest.approx(37e9, rel=0.02)


def test_list_csv():
    r = run("--list", "--csv")
    assert r.exit_code == 0, r.output
    rows = {x["name"]: x for x in csv.DictReader(io.StringIO(r.output))}
    assert len(rows) == 8
    # Mixtral 8x7B: 46.7B total, 12.9B active (Mistral's announcement)
    assert float(rows["mixtral-8x7b"]["params_total"]) == pytest.approx(46.7e9, rel=0.01)
    assert float(rows["mixtral-8x7b"]["params_active"]) == pytest.approx(12.9e9, rel=0.01)


@pytest.mark.parametrize(("args", "message"), [
    ((), r"give a model NAME or --config PATH"),
    (("llama-3.1-8b", "--config", "x.json"), r"give a model NAME or --config PATH"),
    (("llama-9b",), r"unknown model 'llama-9b'"),
    (("llama-3.1-8b", "--tp", "3"), r"--tp 3 must divide llama-3.1-8b's 32 query heads"),
    (("llama-3.1-8b", "--batch", "0"), r"--batch must be a whole number >= 1, got 0"),
    (("llama-3.1-8b", "--prefill-len", "64"), r"--prefill-len applies to --phase prefill"),
    (("llama-3.1-8b", "--weight-dtype", "int3"), r"--weight-dtype: unknown dtype 'int3'"),
    (("llama-3.1-8b", "--hw", "tpu-v9"), r"unknown chip 'tpu-v9'"),
    (("llama-3.1-8b", "--json", "--csv"), r"--json and --csv: pick one"),
    (("llama-3.1-8b", "--sweep", "hbm-utilization=0.5,0.9"), r"--sweep: 'hbm-utilization' cannot be swept"),
    (("llama-3.1-8b", "--sweep", "batch=1,x"), r"--sweep batch: 'x' is not a valid integer"),
    (("llama-3.1-8b", "--hbm-utilization", "0"), r"--hbm-utilization must be in \(0, 1\]"),
])
def test_errors_are_one_line(args, message):
    r = run(*args)
    assert r.exit_code != 0
    assert re.search(message, r.output), r.output
    assert len(r.output.strip().splitlines()) == 1


def test_bad_phase_is_a_click_usage_error():
    r = run("llama-3.1-8b", "--phase", "train")
    assert r.exit_code == 2 and "'train' is not one of 'prefill', 'decode'" in r.output


def test_help_lists_examples():
    r = run("--help")
    assert r.exit_code == 0 and "perfmodel predict model llama-3.1-8b" in r.output and "--prefill-len" in r.output


def test_no_jax_import():
    code = ("import sys; from click.testing import CliRunner; from perfmodel.cli.main import main; "
            "r = CliRunner().invoke(main, ['predict', 'model', 'deepseek-v3', '--tp', '8', '--hw', 'v5e']); "
            "assert r.exit_code == 0, r.output; assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_context_lens_and_dist():
    r = run("llama-3.1-8b", "--hw", "v6e", "--context-lens", "4096x3,128x29", "--json")
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.output)
    assert rec["step"]["batch"] == 32 and rec["step"]["context_lens"] == [4096] * 3 + [128] * 29
    t = run("llama-3.1-8b", "--hw", "v6e", "--context-dist", "uniform:100:900", "--batch", "8")
    assert t.exit_code == 0, t.output
    assert "decode, batch 8, contexts 150..850 tokens (mean 500)" in t.output  # quantiles at (i + 0.5) / 8
    assert "sequences of this length mix" in t.output


@pytest.mark.parametrize(("args", "message"), [
    (("--context-lens", "10,20", "--context-dist", "uniform:1:9"),
     r"give exactly one of --context, --context-lens, --context-dist \(got --context-lens, --context-dist\)"),
    (("--context-lens", "10,20", "--batch", "2"), r"--batch: not with --context-lens"),
    (("--context-lens", "10,abc"), r"--context-lens: 'abc' is not an integer"),
    (("--context-dist", "zipf:1:2"), r"--context-dist: 'zipf:1:2': use uniform"),
    (("--context-lens", "10,20", "--context", "5"),
     r"give exactly one of --context, --context-lens, --context-dist \(got --context, --context-lens\)"),
])
def test_context_list_errors(args, message):
    r = run("llama-3.1-8b", *args)
    assert r.exit_code == 2 and re.search(message, r.output), r.output


def test_weight_scale_and_quantized_activations_reach_the_model():
    r = run("llama-3.1-8b", "--hw", "v5e", "--phase", "prefill", "--weight-dtype", "int8", "--weight-scale",
            "per-block", "--scale-block", "256", "--quantize-activations", "--json")
    assert r.exit_code == 0, r.output
    rec = json.loads(r.output)[0]
    lib = predict_step(get_model("llama-3.1-8b"), make_step(phase="prefill", weight_dtype="int8",
                                                            weight_scale="per-block", scale_block=256,
                                                            quantize_activations=True), get_chip("tpu-v5e"))
    assert rec["step"]["weight_scale"] == "per-block" and rec["step"]["scale_block"] == 256
    assert rec["step"]["quantize_activations"] is True
    assert rec["floor_s"] == pytest.approx(lib.floor_s)
    text = run("llama-3.1-8b", "--hw", "v5e", "--weight-dtype", "int8", "--weight-scale", "per-block",
               "--quantize-activations").output
    assert "weights int8 (scales per 128 rows of K), GEMMs int8 x" in text


@pytest.mark.parametrize("args, match", [
    (["--quantize-activations"], "--quantize-activations: int8 x int8 / int8 x int4 GEMMs quantize float "
                                 "activations for int8 or int4 weights; got --weight-dtype bf16"),
    (["--weight-scale", "per-block"], "--weight-scale per-block: weights of dtype bf16 are not quantized; drop the "
                                      "flag or pick --weight-dtype int8/int4/fp8"),
    (["--weight-dtype", "int8", "--scale-block", "64"], "--scale-block applies only with --weight-scale per-block"),
    (["--weight-dtype", "int8", "--quantize-activations", "--compile"], "are for the analytic model"),
])
def test_weight_gemm_option_errors(args, match):
    r = run("llama-3.1-8b", *args)
    assert r.exit_code == 2 and match in r.output and "Traceback" not in r.output
