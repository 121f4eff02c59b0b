"""The compile cache: an entry is served only while every file its compile imported or read hashes the same.

Unit cases build entries by hand (no compiler); the cases marked needs_libtpu compile for real: what a real
compile records, and edits to each kind of recorded file in a copy of the tree invalidating exactly the entries
that read it."""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.compiler import cache, deps

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PERFMODEL_CACHE_MAX_MB", raising=False)
    return tmp_path / "cache"


def _record(*paths):
    return {"version": deps.RECORD_VERSION,
            "files": {str(p): deps.file_sha256(Path(p)) for p in paths}}


def _report(label="call"):
    return {"call_label": label, "compiled": True, "kernels": [], "other_ops": []}


def test_a_record_holds_until_one_of_its_files_changes(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.json"
    a.write_text("x = 1\n")
    b.write_text("{}")
    record = _record(a, b)
    assert deps.still_valid(record)
    b.write_text("{ }")  # same meaning, other bytes: the compile may have read either
    assert not deps.still_valid(record)
    b.write_text("{}")
    assert deps.still_valid(record)
    a.unlink()
    assert not deps.still_valid(record)


@pytest.mark.parametrize("record", [None, {}, {"version": 0, "files": {"/x": "0"}},
                                    {"version": deps.RECORD_VERSION, "files": {}},
                                    {"version": deps.RECORD_VERSION, "files": {"/nonexistent/x.py": "00"}}],
                         ids=["none", "empty", "old-version", "no-files", "missing-file"])
def test_a_damaged_or_foreign_record_is_never_valid(record):
    assert not deps.still_valid(record)


def test_project_files_are_recorded_relative_to_the_project_root(tmp_path):
    inside = ROOT / "kernels" / "matmul" / "kernel.py"
    assert deps.relative_name(str(inside), ROOT) == "kernels/matmul/kernel.py"
    assert deps.resolve("kernels/matmul/kernel.py", ROOT) == inside
    outside = tmp_path / "user_kernel.py"
    outside.write_text("")
    assert deps.relative_name(str(outside), ROOT) == str(outside.resolve())
    # a clone elsewhere resolves the same names against its own root
    assert deps.resolve("kernels/matmul/kernel.py", tmp_path) == tmp_path / "kernels" / "matmul" / "kernel.py"


def test_the_read_recorder_keeps_local_data_reads_only(tmp_path):
    data, code, out, skip = (tmp_path / n for n in ("tuned.json", "mod.py", "out.json", "dump"))
    skip.mkdir()
    for f in (data, code, skip / "x.txt"):
        f.write_text("1")
    rec = deps.ReadRecorder(exclude=[str(skip)])
    rec.audit("open", (str(data), "r", 0))
    rec.audit("open", (str(code), "r", 0))  # modules come from sys.modules, not from opens
    rec.audit("open", (str(out), "w", 0))  # written, not read
    rec.audit("open", (str(skip / "x.txt"), "rb", 0))  # the compiler's dump folder
    rec.audit("open", (os.path.join(sys.base_prefix, "lib", "x.json"), "r", 0))  # the Python installation
    rec.audit("open", ("/proc/cpuinfo", "r", 0))  # the machine, not an input (and it changes between reads)
    rec.audit("import", ("json",))
    assert rec.data_files() == [str(data)]


def test_lookup_serves_the_valid_variant_and_never_a_forged_one(cache_dir, tmp_path):
    src = tmp_path / "kernel.py"
    src.write_text("v = 1\n")
    key = cache.sub_cache("0.0.test") / "k1"
    stale = cache.store(key, _report("stale"), _record(src))
    src.write_text("v = 2\n")
    assert cache.lookup(key) is None  # the only variant read v = 1
    fresh = cache.store(key, _report("fresh"), _record(src))
    assert fresh != stale and stale.is_dir()  # both kept: two checkouts may differ in this file
    var, report = cache.lookup(key)
    assert var == fresh and report["call_label"] == "fresh"
    # a forged entry: a report that claims the current source, with a record of other bytes
    forged = key / "forged"
    shutil.copytree(fresh, forged)
    (forged / "report.json").write_text(json.dumps(_report("forged")))
    (forged / "deps.json").write_text(json.dumps({"version": deps.RECORD_VERSION,
                                                  "files": {str(src): "0" * 64}}))
    os.utime(forged, (2**31, 2**31))  # newest: looked at first
    assert cache.lookup(key)[1]["call_label"] == "fresh"
    (fresh / "deps.json").write_text("{not json")  # damaged: skipped, never served
    assert cache.lookup(key) is None


def test_least_recently_used_compiles_are_evicted_past_the_cap(cache_dir, tmp_path, monkeypatch):
    src = tmp_path / "k.py"
    src.write_text("")
    big = {**_report(), "pad": "x" * 250_000}  # about 0.25 MB a variant
    keys = [cache.sub_cache("0.0.test") / f"k{i}" for i in range(3)]
    for i, key in enumerate(keys):
        var = cache.store(key, dict(big), _record(src))
        os.utime(var, (1000 + i, 1000 + i))  # k0 oldest
    assert cache.lookup(keys[0]) is not None  # a hit marks k0 used now: k1 is the least recently used
    monkeypatch.setenv("PERFMODEL_CACHE_MAX_MB", "0.8")  # room for two
    cache.store(cache.sub_cache("0.0.test") / "k3", dict(big), _record(src))
    assert cache.lookup(keys[1]) is None and not keys[1].exists()
    assert cache.lookup(keys[0]) is not None and cache.lookup(keys[2]) is not None
    assert cache.info().size_bytes <= 0.8 * 2**20


def test_cache_info_and_clear_cli(cache_dir, tmp_path):
    src = tmp_path / "k.py"
    src.write_text("")
    cache.store(cache.sub_cache("0.0.test") / "k", _report(), _record(src))
    r = CliRunner().invoke(main, ["cache", "info", "--json"])
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["variants"] == 1 and info["sub_caches"][0]["libtpu_version"] == "0.0.test"
    assert info["path"] == str(cache_dir / "compile")
    r = CliRunner().invoke(main, ["cache", "info"])
    assert "holds 1 compiles" in r.output and "libtpu 0.0.test: 1 requests" in r.output
    assert f"XLA:CPU program cache {cache_dir / 'jax-cpu'}" in r.output
    r = CliRunner().invoke(main, ["cache", "clear"])
    assert r.exit_code == 0 and "removed 1 compiles" in r.output
    assert not (cache_dir / "compile").exists()
    assert json.loads(CliRunner().invoke(main, ["cache", "info", "--json"]).output)["variants"] == 0


@pytest.mark.parametrize("value", ["-1", "0", "lots", "inf"])
def test_a_bad_size_cap_is_one_line_naming_the_variable(cache_dir, monkeypatch, value):
    monkeypatch.setenv("PERFMODEL_CACHE_MAX_MB", value)
    r = CliRunner().invoke(main, ["cache", "info"])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "PERFMODEL_CACHE_MAX_MB" in r.output and "positive number" in r.output


def test_the_key_follows_the_compilers_settings_not_the_dump_folder(monkeypatch):
    from perfmodel.compiler.api import CompileCall, cache_key
    from perfmodel.compiler.toolchain import Toolchain

    tools = Toolchain(jax_version="j", jaxlib_version="jl", libtpu_version="t")
    call = CompileCall(kind="catalog", target="rms_norm", shapes=("x=8x128:bf16",))
    monkeypatch.delenv("LIBTPU_INIT_ARGS", raising=False)
    base = cache_key(call, "tpu-v5e", tools)
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_jf_dump_to=/somewhere")
    assert cache_key(call, "tpu-v5e", tools) == base  # where the dumps go changes no compile
    monkeypatch.setenv("JAX_PLATFORMS", "tpu")
    assert cache_key(call, "tpu-v5e", tools) == base  # the compile process always runs on the CPU
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/elsewhere")  # the test suite's XLA:CPU program cache
    assert cache_key(call, "tpu-v5e", tools) == base
    from perfmodel.compiler.toolchain import worker_environment

    env = worker_environment(None)  # never reaches a compile process: its compiles must run to dump schedules
    assert "JAX_COMPILATION_CACHE_DIR" not in env and env["JAX_ENABLE_COMPILATION_CACHE"] == "false"
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_tpu_some_flag=true")
    assert cache_key(call, "tpu-v5e", tools) != base
    monkeypatch.delenv("LIBTPU_INIT_ARGS")
    monkeypatch.setenv("JAX_ENABLE_X64", "1")
    assert cache_key(call, "tpu-v5e", tools) != base
    monkeypatch.delenv("JAX_ENABLE_X64")
    assert cache_key(call, "tpu-v6e", tools) != base
    assert cache_key(call, "tpu-v5e", Toolchain(jax_version="j", jaxlib_version="jl", libtpu_version="u")) != base


# --------------------------------------------------------------------------- real compiles

RMS = ("x=256x1024:bf16", "residual=256x1024:bf16", "weight=1024:f32")
MM = ("x=256x512:bf16", "w=512x512:bf16")


def test_a_server_serves_every_call_of_its_environment(monkeypatch):
    from perfmodel.compiler.client import _fingerprint

    env = {"LIBTPU_INIT_ARGS": "", "PATH": "/bin", "PYTEST_CURRENT_TEST": "a (call)"}
    base = _fingerprint(env)
    # pytest sets PYTEST_CURRENT_TEST for every test: one server per test was started (and kept) before
    assert _fingerprint({**env, "PYTEST_CURRENT_TEST": "b (call)", "PATH": "/usr/bin"}) == base
    for var in ("LIBTPU_INIT_ARGS", "XLA_FLAGS", "JAX_ENABLE_X64", "PYTHONPATH", "PERFMODEL_HW_PATH"):
        assert _fingerprint({**env, var: "changed"}) != base, var
    monkeypatch.chdir("/")  # MODULE:FUNCTION targets resolve from the working directory
    assert _fingerprint(env) != base


@pytest.mark.needs_libtpu
def test_a_compile_records_what_it_imported_and_read(cache_dir, monkeypatch):
    from perfmodel.compiler import client
    from perfmodel.compiler.api import CompileCall, compile_report

    rms = compile_report(CompileCall(kind="catalog", target="rms_norm", shapes=RMS), "tpu-v5e")
    running = client.servers_running()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another test")  # what pytest changes between tests
    mm = compile_report(CompileCall(kind="catalog", target="matmul", shapes=MM), "tpu-v5e")
    assert rms.compiled and mm.compiled and not rms.from_cache
    assert client.servers_running() == running  # the same server (one compile at a time here)
    rms_files = set(json.loads((Path(rms.cache_dir) / "deps.json").read_text())["files"])
    mm_files = set(json.loads((Path(mm.cache_dir) / "deps.json").read_text())["files"])
    for f in ("kernels/rms_norm/kernel.py", "kernels/rms_norm/tuned.json", "hwspecs/tpu-v5e.yaml",
              "perfmodel/compiler/worker.py"):
        assert f in rms_files, f
    for f in ("kernels/matmul/kernel.py", "kernels/matmul/tuned.json", "perfmodel/model/gemm.py"):
        assert f in mm_files and f not in rms_files, f
    assert "kernels/rms_norm/kernel.py" not in mm_files
    assert not any(".egg-info" in f or "site-packages" in f for f in rms_files | mm_files)
    again = compile_report(CompileCall(kind="catalog", target="rms_norm", shapes=RMS), "tpu-v5e")
    assert again.from_cache and again.kernels[0].loop == rms.kernels[0].loop


_PROBE = textwrap.dedent("""
    import json, perfmodel
    from perfmodel.compiler.api import CompileCall, compile_report
    calls = {"rms": CompileCall(kind="catalog", target="rms_norm", shapes=%r),
             "mm": CompileCall(kind="catalog", target="matmul", shapes=%r)}
    hits = {name: compile_report(c, "tpu-v5e").from_cache for name, c in calls.items()}
    print(json.dumps({"root": perfmodel.__file__, **hits}))
""") % (RMS, MM)


@pytest.mark.needs_libtpu
@pytest.mark.slow
def test_an_edit_invalidates_exactly_the_entries_that_read_the_file(tmp_path):
    tree = tmp_path / "tree"
    for part in ("perfmodel", "kernels", "hwspecs"):
        shutil.copytree(ROOT / part, tree / part, ignore=shutil.ignore_patterns("__pycache__"))
    env = {**os.environ, "PYTHONPATH": str(tree), "PERFMODEL_CACHE_DIR": str(tmp_path / "cache")}

    def probe():
        r = subprocess.run([sys.executable, "-c", _PROBE], cwd=tree, env=env, capture_output=True, text=True)
        assert r.returncode == 0, r.stderr[-2000:]
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out.pop("root").startswith(str(tree))  # the copy is what runs
        return out

    def edit(rel, text="\n# edited\n"):
        with open(tree / rel, "a") as fh:
            fh.write(text)

    assert probe() == {"rms": False, "mm": False}
    assert probe() == {"rms": True, "mm": True}
    edit("kernels/matmul/kernel.py")  # a kernel's source: that kernel only
    assert probe() == {"rms": True, "mm": False}
    edit("perfmodel/model/gemm.py")  # perfmodel's code-path rules for the matmul
    assert probe() == {"rms": True, "mm": False}
    edit("kernels/rms_norm/tuned.json", " ")  # a kernel's tuned defaults (data, not code)
    assert probe() == {"rms": False, "mm": True}
    edit("hwspecs/tpu-v5e.yaml")  # the chip's spec: every compile for it
    assert probe() == {"rms": False, "mm": False}
    assert probe() == {"rms": True, "mm": True}
