"""Issue 14: property-based fuzzing of every loader and each command's main flags.

Hypothesis draws malformed values (NaN, inf, negatives, zero, huge or 300-digit numbers, text, empty strings,
non-UTF-8 bytes) into a spec YAML, a config.json, a results JSONL line, a published-measurement YAML and the
flags of the commands, and runs each through the CLI (click's CliRunner). Every run must

* exit 0 or 2 (2: a user error, a one-line message; never 1, a tool failure, for bad input),
* raise nothing past the CLI (``res.exception`` is None or the SystemExit of the exit code): no traceback,
* print, with --json, no NaN, infinite or negative time: every number under a key ending in ``_s`` is finite
  and >= 0, and the headline times (``floor_s``, ``expected_s``) are numbers, not null (NaN and inf are
  written as null, so a null headline time is a silent NaN).

Derandomized (the same examples every run) and small (well under 30 s in all on 2 cores).
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfmodel.cli.main import main

ROOT = Path(__file__).resolve().parents[1]

#: A numpy RuntimeWarning (an overflowing cast, a division by zero) is a silent wrong number in the making.
pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")

FAST = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])
SLOW = settings(FAST, max_examples=6)

#: Values no hand-written list of good inputs covers, as command-line text.
NASTY_TEXT = ["0", "-1", "-0", "nan", "NaN", "inf", "-inf", "1e308", "1e-320", "0.5", "1.5", "", " ", "abc",
              "9" * 300, "0x10", "1_000", "2**62", "4096,", ",", "1,2", "+7", "\x00", "é"]
#: Valid but extreme sizes: plausible values to huge ones (powers of two up to 2**64, floats up to 1e30).
big_ints = st.one_of(st.integers(min_value=1, max_value=2**64), st.integers(0, 64).map(lambda e: 2**e))
big_floats = st.floats(min_value=1e-9, max_value=1e30)
cli_values = st.one_of(
    big_ints.map(str),
    big_floats.map(repr),
    st.sampled_from(NASTY_TEXT),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12),
)
#: The same as JSON / YAML values (NaN and inf as the loaders' parsers read them).
json_values = st.one_of(
    big_ints,
    big_floats,
    st.sampled_from([0, -1, 1, 0.5, -0.5, 10**30, 2**63, 1e308, float("nan"), float("inf"), -float("inf"), None,
                     True, False, "", "abc", "4096", [], {}, [1, 2]]),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
)
yaml_scalars = st.one_of(
    big_ints.map(str),
    big_floats.map(repr),
    st.sampled_from([".nan", ".inf", "-.inf", "-1", "0", "1e400", "9" * 300, "null", "abc", "[]", "{}", "''",
                     "true", "0x10", "1_000", "- 1", ": x", "'\\x00'"]),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def _tmp() -> Path:
    return Path(tempfile.mkdtemp(prefix="perfmodel-fuzz-"))


def _walk_times(obj: Any, timed: str = "") -> None:
    """Every number under a key ending in ``_s`` (or inside one: ``unit_s: {hbm: ...}``) is finite and >= 0;
    headline times are numbers. ``timed``: the name of the time key obj is under ("" when none)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k in ("floor_s", "expected_s") and "error" not in obj:
                assert v is not None, f"{k} is null (a NaN or inf written as null?)"
            _walk_times(v, k if isinstance(k, str) and k.endswith("_s") else timed)
    elif isinstance(obj, list):
        for v in obj:
            _walk_times(v, timed)
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool) and timed:
        assert math.isfinite(obj) and obj >= 0, f"{timed} = {obj}"


def check(argv: list[str]) -> Any:
    """Run argv (with --json); exit 0 or 2, nothing escaping, and sane times in the JSON when it succeeds."""
    res = CliRunner().invoke(main, argv)
    assert res.exception is None or isinstance(res.exception, SystemExit), (argv, repr(res.exception))
    assert res.exit_code in (0, 2), (argv, res.exit_code, res.output[-2000:])
    if res.exit_code == 2:
        assert "Traceback" not in res.output, res.output
        return None
    out = json.loads(res.output)  # strict enough: perfmodel writes NaN/inf as null
    _walk_times(out)
    return out


def test_walk_times_catches_what_it_should():
    # the checker itself: a negative time, an infinite one and a null headline time are each caught
    for bad in ({"expected_s": -1.0, "floor_s": 1.0}, {"unit_s": {"hbm": float("inf")}},
                {"floor_s": None, "expected_s": 1.0}):
        with pytest.raises(AssertionError):
            _walk_times([bad])
    _walk_times({"floor_s": 0.0, "expected_s": 1e-6, "unit_s": {"mxu": 0.0}, "bytes": -5})


# ----------------------------------------------------------------------------- command flags


def _flags(draw: Any, base: dict[str, str], fuzzed: list[str]) -> list[str]:
    """base flags with up to three of ``fuzzed`` replaced (or added) by drawn values."""
    over = draw(st.dictionaries(st.sampled_from(fuzzed), cli_values, max_size=3))
    argv: list[str] = []
    for flag, value in {**base, **over}.items():
        argv += [flag, value]
    return argv


PREDICT = {
    "gemm": ({"-m": "8", "-n": "128", "-k": "128"}, ["-m", "-n", "-k", "--batch", "--rhs-dtype", "--hw"]),
    "attention": ({"--q-len": "128"}, ["--q-len", "--kv-len", "--q-heads", "--kv-heads", "--head-dim",
                                       "--sliding-window", "--block-q", "--batch"]),
    "chunked-attention": ({"--q-len": "256"}, ["--q-len", "--kv-len", "--q-heads", "--kv-heads", "--head-dim",
                                               "--v-head-dim", "--chunk", "--batch"]),
    "decode-attention": ({"--context": "1024", "--batch": "2"},
                         ["--context", "--batch", "--context-lens", "--context-dist", "--kv-heads", "--page-size",
                          "--pages-per-seq", "--kv-dtype"]),
    "copy": ({"--bytes": "1000000"}, ["--bytes", "--shape", "--elements", "--dtype"]),
    "gather": ({"--rows": "8", "--row-bytes": "8192"}, ["--rows", "--row-bytes", "--row-elements", "--dtype"]),
    "sampling": ({"--batch": "8", "--vocab": "32000"}, ["--batch", "--vocab", "--top-k", "--top-p", "--min-p",
                                                        "--logprobs", "--draft-tokens", "--passes"]),
}


@pytest.mark.parametrize("op", sorted(PREDICT))
def test_predict_flags(op):
    base, fuzzed = PREDICT[op]

    @FAST
    @given(st.data())
    def run(data):
        check(["predict", op, *_flags(data.draw, base, fuzzed), "--json"])

    run()


@FAST
@given(st.data())
def test_predict_sweep(data):
    # --sweep values go through the option's own type
    values = data.draw(st.lists(cli_values, min_size=1, max_size=3))
    check(["predict", "gemm", "-n", "128", "-k", "128", "--sweep", "m=" + ",".join(values), "--json"])


@FAST
@given(st.data())
def test_predict_collective_flags(data):
    kind = data.draw(st.sampled_from(["all-reduce", "all-gather", "reduce-scatter"]))
    argv = _flags(data.draw, {"--bytes-per-chip": "1048576", "--num-chips": "8"},
                  ["--bytes-per-chip", "--shape", "--num-chips", "--slice-chips", "--dtype"])
    check(["predict", "collective", kind, *argv, "--json"])


@FAST
@given(st.data())
def test_predict_model_flags(data):
    argv = _flags(data.draw, {"--hw": "v6e"}, ["--batch", "--context", "--context-lens", "--prefill-len", "--tp",
                                               "--weight-dtype", "--kv-dtype", "--page-size", "--hbm-utilization"])
    check(["predict", "model", "llama-3.1-8b", *argv, "--json"])


@FAST
@given(cli_values)
def test_hw_show_names(name):
    check(["hw", "show", name, "--json"])


@SLOW
@given(st.data())
def test_analyze_tiny_kernel_shapes(data):
    # the bundled fused RMSNorm on a tiny problem; fuzz the dims of x (residual and weight follow it)
    dims = data.draw(st.one_of(st.sampled_from(["8x128", "0x128", "8x0", "-8x128", "8x127", "1x1", "8", "8x128x2",
                                                "x", "", "8xx128", "99999999999x99999999999"]),
                               st.lists(st.integers(-4, 300), min_size=1, max_size=3).map(
                                   lambda d: "x".join(map(str, d)))))
    hidden = dims.rsplit("x", 1)[-1]
    check(["analyze", "kernels.rms_norm:rms_norm", "--shape", f"x={dims}:bf16", "--shape",
           f"residual={dims}:bf16", "--shape", f"weight={hidden}:f32", "--json"])


# ----------------------------------------------------------------------------- loaders


SPEC_TEXT = (ROOT / "hwspecs" / "tpu-v5e.yaml").read_text()
_SPEC_LINES = SPEC_TEXT.splitlines()
#: Lines "key: value" of the v5e spec whose value is a plain number (the physical quantities).
_NUMERIC = [i for i, line in enumerate(_SPEC_LINES)
            if ":" in line and line.split(":", 1)[1].strip().replace(".", "", 1).replace("e", "", 1).replace(
                "+", "").replace("-", "").isdigit()]


@FAST
@given(st.sampled_from(_NUMERIC), yaml_scalars, st.booleans())
def test_spec_yaml(line_no, value, garble):
    lines = list(_SPEC_LINES)
    key = lines[line_no].split(":", 1)[0]
    lines[line_no] = f"{key}: {value}"
    # a distinct name, so the file never clashes with the built-in v5e
    text = "\n".join(lines).replace("name: tpu-v5e", "name: tpu-fuzz", 1).replace(
        "aliases: [v5e, v5litepod, v5-lite, tpu-v5-lite]", "aliases: []").replace(
        'jax_device_kinds: ["TPU v5 lite", "TPU v5e"]', "jax_device_kinds: []")
    f = _tmp() / "spec.yaml"
    f.write_bytes(text.encode() + (b"\n# \xff\xfe" if garble else b""))
    check(["hw", "show", str(f), "--json"])
    check(["predict", "gemm", "--hw", str(f), "-m", "8", "-n", "4096", "-k", "4096", "--json"])


LLAMA_HF = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
    "vocab_size": 128256, "torch_dtype": "bfloat16",
}


@FAST
@given(st.dictionaries(st.sampled_from(sorted(LLAMA_HF)), json_values, min_size=1, max_size=2))
def test_config_json(changes):
    f = _tmp() / "config.json"
    f.write_text(json.dumps({**LLAMA_HF, **changes}))  # json.dumps writes NaN / Infinity, as some tools do
    check(["predict", "model", "--config", str(f), "--hw", "v6e", "--json"])


PUBLISHED = """source: {title: fuzz, measurement: timeit mean over 100 calls}
chip: tpu-v5e
points:
  - {kernel: xla, m: 4096, n: 4096, k: 4096, measured_ms: 0.82729}
  - {kernel: xla, m: M, n: N, k: K, measured_ms: MEASURED}
"""


@FAST
@given(st.fixed_dictionaries({"M": yaml_scalars, "N": st.just("4096"), "K": st.just("4096"),
                              "MEASURED": yaml_scalars}) | st.fixed_dictionaries(
    {"M": st.just("64"), "N": yaml_scalars, "K": yaml_scalars, "MEASURED": st.just("1.5")}))
def test_published_yaml(fields):
    text = PUBLISHED
    for k, v in fields.items():
        text = text.replace(k if k != "M" else "m: M", v if k != "M" else f"m: {v}")
    f = _tmp() / "published.yaml"
    f.write_text(text)
    check(["compare", str(f), "--json"])


def _record() -> dict:
    f = _tmp() / "v.yaml"
    f.write_text(PUBLISHED.replace("m: M", "m: 8192").replace("N", "8192").replace("K", "8192").replace(
        "MEASURED", "6.04715"))
    res = CliRunner().invoke(main, ["compare", str(f), "--json"])
    assert res.exit_code == 0, res.output
    rec = json.loads(res.output)["records"][0]
    rec.pop("where")
    return rec


def _leaves(obj: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(obj, dict):
        return [p for k, v in obj.items() for p in _leaves(v, path + (k,))]
    return [path]


@pytest.fixture(scope="module")
def record() -> dict:
    return _record()


def test_results_jsonl(record):
    paths = _leaves(record)

    @FAST
    @given(st.sampled_from(paths), json_values, st.sampled_from(["compare", "calibrate"]))
    def run(path, value, command):
        rec = json.loads(json.dumps(record))
        node = rec
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        f = _tmp() / "r.jsonl"
        f.write_text(json.dumps(rec) + "\n")
        check([command, str(f), "--json"])

    run()


# ----------------------------------------------------------------------------- regressions found by fuzzing


def test_absurd_spec_numbers_print_in_e_notation_not_hundreds_of_digits():
    # a spec with hbm_bw_bytes_per_s_per_chip: 1e-300 is accepted; the GEMM's HBM time is then
    # 33.7 MB / 1e-300 B/s = 3.37e+301 s = 3.37e+277 Ys, which printed as a 280-digit number
    from perfmodel.units import intensity, seconds

    assert seconds(3.37e301) == "3.37e+277 Ys"
    assert seconds(3.37e-293) == "3.37e-278 fs"  # and 1e300 B/s: hundreds of decimal places before
    assert intensity(5e-5) == "5.00e-05 FLOP/B"
    assert seconds(1.5e-9) == "1.50 ns" and seconds(2e29) == "200000 Ys"  # in range: unchanged
    text = SPEC_TEXT.replace("name: tpu-v5e", "name: tpu-fuzz", 1).replace(
        "aliases: [v5e, v5litepod, v5-lite, tpu-v5-lite]", "aliases: []").replace(
        'jax_device_kinds: ["TPU v5 lite", "TPU v5e"]', "jax_device_kinds: []").replace(
        "hbm_bw_bytes_per_s_per_chip: 8.19e11", "hbm_bw_bytes_per_s_per_chip: 1e-300")
    f = _tmp() / "spec.yaml"
    f.write_text(text)
    res = CliRunner().invoke(main, ["predict", "gemm", "--hw", str(f), "-m", "8", "-n", "4096", "-k", "4096"])
    assert res.exit_code == 0, res.output
    assert max(len(line) for line in res.output.splitlines()) < 120


def test_a_float_size_beyond_int64_is_refused_not_wrapped():
    # 9.3e18 > 2**63 wrapped to -9223372036854775808 in the int64 cast ("must be >= 1, got -9223372036854775808")
    res = CliRunner().invoke(main, ["predict", "collective", "all-reduce", "--bytes-per-chip", "9.3e18",
                                    "--num-chips", "8"])
    assert res.exit_code == 2
    assert res.output.strip() == "Error: --bytes-per-chip: 9.3e+18 is too large (at most 2**62)"
    from perfmodel.errors import InputError
    from perfmodel.model.shapes import sizes

    with pytest.raises(InputError, match=r"`bytes`: 4\.7e\+18 is too large"):  # 4.7e18 > 2**62 = 4.61e18
        sizes("bytes", 4.7e18)
    assert int(sizes("bytes", 4.6e18)) == 46 * 10**17  # fits: no wrap


@settings(FAST, max_examples=25)
@given(st.data())
def test_serve_flags(data):
    # a small stream so that a valid draw simulates quickly
    argv = _flags(data.draw, {"--hw": "v6e", "--num-prompts": "8", "--random-input-len": "64",
                              "--random-output-len": "8"},
                  ["--num-prompts", "--random-input-len", "--random-output-len", "--random-range-ratio",
                   "--request-rate", "--burstiness", "--max-concurrency", "--max-num-seqs", "--max-num-batched-tokens",
                   "--max-model-len", "--block-size", "--gpu-memory-utilization", "--tp", "--acceptance-rate",
                   "--metric-percentiles", "--host-overhead-ms"])
    try:
        check(["serve", "llama-3.1-8b", *argv, "--json"])
    except MemoryError:  # a huge --num-prompts or length is the machine's limit, not a wrong answer
        pass
