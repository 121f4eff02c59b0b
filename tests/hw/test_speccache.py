"""Fast spec loading: the header scan picks the one file a name refers to, and the JSON cache of checked
loads is used only for the same YAML text and loading code (never a stale spec)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
import yaml

from perfmodel.errors import SpecError, UnknownChipError
from perfmodel.hw import registry, spec, speccache
from perfmodel.hw.speccache import dataclass_fields, from_plain, load_cached, scan_header, to_plain
from perfmodel.model import configs, schema

ROOT = Path(__file__).resolve().parents[2]
CHIP_KEYS = {"name": str, "aliases": tuple, "jax_device_kinds": tuple}
MODEL_KEYS = {"name": str, "display_name": str, "aliases": tuple}
BUNDLED = [(f, CHIP_KEYS) for f in sorted((ROOT / "hwspecs").glob("*.yaml"))] + [
    (f, MODEL_KEYS) for f in sorted((ROOT / "perfmodel" / "data" / "models").glob("*.yaml"))]


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Empty in-process caches and a spec cache of this test's own."""
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(tmp_path / "cache"))
    registry.load_spec_file.cache_clear()
    configs.load_model_yaml.cache_clear()
    yield tmp_path / "cache" / "specs"
    registry.load_spec_file.cache_clear()
    configs.load_model_yaml.cache_clear()


# --------------------------------------------------------------------------- scan_header


@pytest.mark.parametrize("file,keys", BUNDLED, ids=lambda v: v.name if isinstance(v, Path) else "")
def test_scan_reads_what_yaml_reads_in_every_bundled_file(file, keys):
    data = yaml.safe_load(file.read_text())
    assert scan_header(file.read_text(), keys) == {k: tuple(data[k]) if t is tuple else data[k]
                                                   for k, t in keys.items()}


def test_scan_reads_block_lists_quotes_and_comments():
    text = ("# comment\nname: 'chip-a'  # trailing\nvendor: acme\naliases:\n  - a\n  - \"b c\"\n"
            "jax_device_kinds: [\"X 1\", Y]\ncores:\n  n: 1\n")
    assert scan_header(text, CHIP_KEYS) == {"name": "chip-a", "aliases": ("a", "b c"),
                                            "jax_device_kinds": ("X 1", "Y")}
    assert scan_header("name: a\naliases: []\njax_device_kinds: []\n", CHIP_KEYS)["aliases"] == ()


@pytest.mark.parametrize("text", [
    "name: a\n  b\naliases: []\njax_device_kinds: []\n",           # the name goes on on the next line
    "name: &x a\naliases: []\njax_device_kinds: []\n",             # anchor
    "name: !!str a\naliases: []\njax_device_kinds: []\n",          # tag
    'name: "a\\tb"\naliases: []\njax_device_kinds: []\n',          # escape
    "name: a\nname: b\naliases: []\njax_device_kinds: []\n",       # twice
    "name: a\naliases: [b,\n  c]\njax_device_kinds: []\n",         # flow list over two lines
    "name: a\naliases:\n  - b\n    c\njax_device_kinds: []\n",     # block item goes on
    "name: a\njax_device_kinds: []\n",                             # missing key
    "---\nname: a\naliases: []\njax_device_kinds: []\n",           # document marker first
    "cores:\n  n: 1\nname: a\naliases: []\njax_device_kinds: []\n",  # names after the simple head
    "other:\n  name: a\n",                                          # nested, not top level
    "name: a\naliases: {x: 1}\njax_device_kinds: []\n",            # not a list
])
def test_scan_gives_up_rather_than_guess(text):
    assert scan_header(text, CHIP_KEYS) is None


# --------------------------------------------------------------------------- registry: one file per lookup


def test_get_chip_loads_only_the_chip_asked_for(fresh):
    assert registry.get_chip("v5e").name == "tpu-v5e"
    assert registry.load_spec_file.cache_info().currsize == 1


def test_every_name_resolves_as_a_search_of_all_chips(fresh):
    chips = registry.all_chips()
    for chip in chips:
        for name in (chip.name, *chip.aliases, *chip.jax_device_kinds):
            expect = next(c for c in chips if registry.normalize(name) in {registry.normalize(n)
                                                                          for n in registry._names(c)})
            assert registry.get_chip(name) is expect
            assert registry.get_chip(f" {name.upper()} ") is expect


def _user_spec(d: Path, name: str, head: str) -> Path:
    d.mkdir(exist_ok=True)
    text = (ROOT / "hwspecs" / "tpu-v5e.yaml").read_text()
    start = text.index("name: tpu-v5e")
    end = text.index("vendor:")
    out = d / f"{name}.yaml"
    out.write_text(text[:start] + head + text[end:])
    return out


def test_user_spec_shadows_builtin_of_same_name(fresh, monkeypatch, tmp_path):
    d = tmp_path / "specs"
    _user_spec(d, "tpu-v5e", "name: tpu-v5e\ndisplay_name: Lab v5e\naliases: [v5e, lab]\njax_device_kinds: []\n")
    monkeypatch.setenv(registry.ENV_VAR, str(d))
    assert registry.get_chip("lab").display_name == "Lab v5e"
    assert registry.get_chip("v5e").display_name == "Lab v5e"
    # the built-in's device kinds went with it, as in all_chips()
    with pytest.raises(UnknownChipError, match="unknown chip .TPU v5 lite."):
        registry.get_chip("TPU v5 lite")


def test_unscannable_user_spec_falls_back_to_loading_every_file(fresh, monkeypatch, tmp_path):
    d = tmp_path / "specs"
    _user_spec(d, "odd", "name: odd-chip\ndisplay_name: Odd\naliases: &a [oddity]\njax_device_kinds: []\n")
    monkeypatch.setenv(registry.ENV_VAR, str(d))
    assert registry.get_chip("oddity").name == "odd-chip"
    assert registry.get_chip("v6e").name == "tpu-v6e"


def test_broken_unrelated_user_spec_is_reported_when_its_head_cannot_be_scanned(fresh, monkeypatch, tmp_path):
    d = tmp_path / "specs"
    d.mkdir()
    (d / "broken.yaml").write_text("name: [broken\n")
    monkeypatch.setenv(registry.ENV_VAR, str(d))
    with pytest.raises(SpecError, match="broken.yaml"):
        registry.get_chip("v5e")


def test_get_model_loads_only_the_preset_asked_for(fresh):
    assert configs.get_model("Llama 3.1 8B").name == "llama-3.1-8b"
    assert configs.load_model_yaml.cache_info().currsize == 1
    presets = configs.all_presets()
    for cfg in presets:
        for name in (cfg.name, cfg.display_name, *cfg.aliases):
            assert configs.get_model(name) is cfg


# --------------------------------------------------------------------------- the JSON cache


def test_dataclass_fields_match_typing():
    for cls in (spec.ChipSpec, spec.Cores, spec.Compute, spec.Memory, spec.Interconnect, spec.Overheads,
                spec.Disagreement, schema.ModelConfig, schema.MoEConfig, schema.MLAConfig):
        hints, names = dataclass_fields(cls)
        assert hints == typing.get_type_hints(cls)
        assert names == [f.name for f in dataclasses.fields(cls)]


def test_cached_specs_equal_fresh_loads_exactly(fresh):
    for f in registry.spec_files():
        first = registry.load_spec_file(str(f))  # a miss: loads and writes the entry
        registry.load_spec_file.cache_clear()
        again = registry.load_spec_file(str(f))  # from the entry
        assert again is not first and again == registry._load_checked(f)
        assert repr(again) == repr(registry._load_checked(f))  # same types too (int vs float, tuple vs list)
    for f in sorted(configs.presets_dir().glob("*.yaml")):
        configs.load_model_yaml(str(f))
        configs.load_model_yaml.cache_clear()
        assert repr(configs.load_model_yaml(str(f))) == repr(configs._load_checked(f))
    assert len(list(fresh.glob("*.json"))) == len(registry.spec_files()) + len(list(configs.presets_dir().glob("*.yaml")))


def test_builtin_chip_comes_from_the_cache_when_warm(fresh, monkeypatch):
    registry.get_chip("v6e")
    registry.load_spec_file.cache_clear()

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed the YAML although the cache entry is current")

    monkeypatch.setattr(registry, "_load_checked", no_parse)
    assert registry.get_chip("v6e").name == "tpu-v6e"


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Rec:
    name: str
    size: float | None
    tags: tuple[str, ...]


def _loader(calls: list, file: Path):
    def load(text):
        calls.append(text)
        data = yaml.safe_load(text if text is not None else file.read_text())
        return _Rec(name=data["name"], size=data["size"], tags=tuple(data["tags"]))
    return load


def test_cache_entry_is_used_only_for_the_same_text(fresh, tmp_path):
    f = tmp_path / "rec.yaml"
    f.write_text("name: a\nsize: 1.5\ntags: [x]\n")
    calls: list = []
    assert load_cached(f, _Rec, _loader(calls, f)) == _Rec(name="a", size=1.5, tags=("x",))
    assert load_cached(f, _Rec, _loader(calls, f)) == _Rec(name="a", size=1.5, tags=("x",))
    assert len(calls) == 1
    # same size, same mtime: only the text tells them apart
    st = f.stat()
    f.write_text("name: b\nsize: 1.5\ntags: [x]\n")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert load_cached(f, _Rec, _loader(calls, f)).name == "b"
    assert len(calls) == 2


def test_cache_entry_is_dropped_when_the_loading_code_changes(fresh, tmp_path):
    f = tmp_path / "rec.yaml"
    f.write_text("name: a\nsize: null\ntags: []\n")
    code = tmp_path / "checks.py"
    code.write_text("# v1\n")
    calls: list = []
    load_cached(f, _Rec, _loader(calls, f), code=(code,))
    load_cached(f, _Rec, _loader(calls, f), code=(code,))
    assert len(calls) == 1
    code.write_text("# v2, longer\n")
    assert load_cached(f, _Rec, _loader(calls, f), code=(code,)) == _Rec(name="a", size=None, tags=())
    assert len(calls) == 2


def test_a_damaged_or_foreign_entry_is_a_miss(fresh, tmp_path):
    f = tmp_path / "rec.yaml"
    f.write_text("name: a\nsize: 2.0\ntags: [x, y]\n")
    calls: list = []
    load_cached(f, _Rec, _loader(calls, f))
    (entry,) = fresh.glob("rec-*.json")
    data = json.loads(entry.read_text())
    data["value"]["size"] = "2.0"  # the wrong type
    entry.write_text(json.dumps(data))
    assert load_cached(f, _Rec, _loader(calls, f)).size == 2.0
    entry.write_text("{not json")
    assert load_cached(f, _Rec, _loader(calls, f)).tags == ("x", "y")
    assert len(calls) == 3
    assert json.loads(entry.read_text())["value"]["size"] == 2.0  # rewritten


def test_unwritable_cache_is_skipped(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("PERFMODEL_CACHE_DIR", str(blocker))  # a file: no directory can be made under it
    f = tmp_path / "rec.yaml"
    f.write_text("name: a\nsize: 1.0\ntags: []\n")
    calls: list = []
    assert load_cached(f, _Rec, _loader(calls, f)).name == "a"
    assert load_cached(f, _Rec, _loader(calls, f)).name == "a"
    assert len(calls) == 2


def test_loader_errors_are_not_cached(fresh, tmp_path):
    f = tmp_path / "rec.yaml"
    f.write_text("name: a\n")

    def load(text):
        raise SpecError("bad")

    with pytest.raises(SpecError):
        load_cached(f, _Rec, load)
    assert not list(fresh.glob("*.json"))


def test_from_plain_round_trips_and_rejects_wrong_shapes():
    v5e = registry.get_chip("v5e")
    assert from_plain(spec.ChipSpec, json.loads(json.dumps(to_plain(v5e)))) == v5e
    with pytest.raises(ValueError):
        from_plain(_Rec, {"name": "a", "size": 1, "tags": []})  # int where a float belongs
    with pytest.raises(ValueError):
        from_plain(_Rec, {"name": "a", "tags": []})


def test_warm_lookup_imports_no_yaml(tmp_path):
    """What `predict` pays: with a warm cache, resolving a chip and a model preset never imports yaml."""
    env = dict(os.environ, PERFMODEL_CACHE_DIR=str(tmp_path))
    code = ("import sys; from perfmodel.hw import get_chip; from perfmodel.model.configs import get_model; "
            "get_chip('v5e'); get_model('llama-3.1-8b'); print('yaml' in sys.modules)")
    runs = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
            for _ in range(2)]
    assert [r.stdout.strip() for r in runs] == ["True", "False"]


def test_data_files_are_cached_by_text_and_non_json_data_is_not(fresh, tmp_path):
    from perfmodel.hw.speccache import load_data_cached

    f = tmp_path / "table.yaml"
    f.write_text("chips:\n  a: {share: 0.5}\n")
    calls: list = []

    def parse(text):
        calls.append(text)
        return yaml.safe_load(text)

    assert load_data_cached(f, parse) == {"chips": {"a": {"share": 0.5}}}
    assert load_data_cached(f, parse) == {"chips": {"a": {"share": 0.5}}}
    assert len(calls) == 1
    f.write_text("chips:\n  a: {share: 0.7}\n")  # another text: parsed again
    assert load_data_cached(f, parse)["chips"]["a"]["share"] == 0.7 and len(calls) == 2
    # integer keys do not survive JSON: parsed every time, never cached wrong
    g = tmp_path / "ints.yaml"
    g.write_text("1: one\n")
    assert load_data_cached(g, parse) == {1: "one"} and load_data_cached(g, parse) == {1: "one"}
    assert len(calls) == 4 and not list(fresh.glob("ints-*.json"))


def test_a_warm_predict_reads_the_efficiency_table_without_yaml(fresh):
    code = ("import sys; from perfmodel.model.efficiency import _table; t = _table(); "
            "print('yaml' in sys.modules, sorted(t))")
    env = {**os.environ, "PERFMODEL_CACHE_DIR": str(fresh.parent)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    warm = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert first.stdout.startswith("True") and warm.stdout.startswith("False")
    assert first.stdout.split(" ", 1)[1] == warm.stdout.split(" ", 1)[1]
