"""The compiler stays optional: availability, one-line errors, no libtpu or jax where nobody asks for them."""

import subprocess
import sys

import pytest
from click.testing import CliRunner

from perfmodel.cli.main import main
from perfmodel.compiler import toolchain
from perfmodel.compiler.toolchain import CompilerUnavailable, topology_for, worker_environment


def test_missing_libtpu_is_one_line(monkeypatch):
    monkeypatch.setattr(toolchain, "_version", lambda dist: None)
    with pytest.raises(CompilerUnavailable, match=r"libtpu\) is not installed; install it with .*tpu-compiler"):
        toolchain.toolchain()
    r = CliRunner().invoke(main, ["inspect", "jax-matmul", "--compile", "--shape", "x=256x256:bf16",
                                  "--shape", "y=256x256:bf16", "--block", "bm=128", "--block", "bk=128",
                                  "--block", "bn=128"])
    assert r.exit_code == 1
    assert r.output.count("\n") == 1 and "libtpu) is not installed" in r.output


def test_gpu_and_unknown_targets_are_refused():
    with pytest.raises(CompilerUnavailable, match=r"--hw tpu-v3: .*compile for one of tpu-v4, tpu-v5e"):
        topology_for("tpu-v3")


def test_worker_environment_does_not_touch_ours(monkeypatch):
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_jf_dump_to=/old --foo=1")
    env = worker_environment("/tmp/x")
    assert env["LIBTPU_INIT_ARGS"] == "--foo=1 --xla_jf_dump_to=/tmp/x"
    assert env["TPU_SKIP_MDS_QUERY"] == "1" and env["JAX_PLATFORMS"] == "cpu"
    import os

    assert os.environ["LIBTPU_INIT_ARGS"] == "--xla_jf_dump_to=/old --foo=1"


def test_compiler_modules_import_neither_jax_nor_libtpu():
    code = ("import sys; import perfmodel.compiler.api, perfmodel.compiler.render, perfmodel.harness.compile_matrix, "
            "perfmodel.schedule.compiled; import perfmodel.cli.main; "
            "bad = [m for m in ('jax', 'libtpu', 'jaxlib') if m in sys.modules]; print(bad); sys.exit(bool(bad))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_a_kernel_found_only_through_the_editable_install_resolves_for_the_cache_key(monkeypatch):
    # The `perfmodel` command runs without the repository root on sys.path: kernels/ is found through the
    # editable install's finder, and the compile cache's key still names the file a MODULE:FUNCTION target
    # resolves to (the same module name could be another file from another working directory).
    import os
    import sys
    from pathlib import Path

    from perfmodel.compiler.api import _module_path

    root = Path(__file__).resolve().parents[2]
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p and Path(p).resolve() != root])
    monkeypatch.chdir(os.path.dirname(root))  # no "kernels" folder in the working directory either
    assert _module_path("kernels.matmul") == root / "kernels" / "matmul" / "__init__.py"


def test_a_function_target_resolving_elsewhere_is_another_key(tmp_path, monkeypatch):
    from perfmodel.compiler import api
    from perfmodel.compiler.api import CompileCall, cache_key
    from perfmodel.compiler.toolchain import Toolchain

    tools = Toolchain(jax_version="j", jaxlib_version="jl", libtpu_version="t")
    call = CompileCall(kind="function", target="mykernels.mm:matmul", shapes=("x=8x128:bf16",))
    first, second = tmp_path / "a" / "mm.py", tmp_path / "b" / "mm.py"
    monkeypatch.setattr(api, "_module_path", lambda module: first)
    key = cache_key(call, "tpu-v5e", tools)
    monkeypatch.setattr(api, "_module_path", lambda module: second)
    assert cache_key(call, "tpu-v5e", tools) != key


def test_a_prng_key_argument_travels_to_the_compile_worker_as_json():
    import json

    import jax

    from perfmodel.compiler.api import CompileCall, decode_arg

    key = jax.random.key(7)
    call = CompileCall(kind="catalog", target="sampling", shapes=("logits=8x1024:f32",), blocks=None,
                       extra={"key": key, "top_k": 50})
    request = json.loads(json.dumps(call.to_request()))  # what the worker reads
    assert request["args"]["top_k"] == 50
    rebuilt = decode_arg(request["args"]["key"])
    assert (jax.random.bits(rebuilt) == jax.random.bits(key)).all()
