"""Transformer model presets and the model lookup: a preset name, a model YAML file or a config.json path.

Presets live in ``perfmodel/data/models/*.yaml``, one file per model, every
number with a source; they are read only when asked for (nothing happens at
import time). :func:`get_model` takes a preset name or alias, a YAML file, or a
local Hugging Face ``config.json`` path (read by :mod:`perfmodel.model.hf_config`).
The :class:`~perfmodel.model.schema.ModelConfig` they return and its checks are
in :mod:`perfmodel.model.schema`.
"""

from __future__ import annotations

import functools
from pathlib import Path

from perfmodel.errors import InputError
from perfmodel.model.schema import ModelConfig, validate

# --------------------------------------------------------------------------- presets


def normalize(name: str) -> str:
    """Case-, space- and underscore-insensitive key for a model name."""
    return "-".join(name.strip().lower().replace("_", " ").split())


def presets_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "models"


def _load_checked(file: Path, text: str | None = None) -> ModelConfig:
    from perfmodel.hw.loader import load_yaml_file

    return validate(load_yaml_file(file, ModelConfig, text), str(file))


@functools.lru_cache(maxsize=None)
def load_model_yaml(path: str) -> ModelConfig:
    """Load and validate one preset file (cached by path; a built-in preset also on disk, see
    :func:`perfmodel.hw.speccache.load_cached`: used only for the same YAML text and loading code)."""
    file = Path(path)
    if file.parent == presets_dir():
        from perfmodel.hw.speccache import load_cached

        return load_cached(file, ModelConfig, lambda text: _load_checked(file, text), code=(__file__,))
    return _load_checked(file)


def all_presets() -> list[ModelConfig]:
    """Every built-in model, sorted by name."""
    return sorted((load_model_yaml(str(f)) for f in sorted(presets_dir().glob("*.yaml"))), key=lambda c: c.name)


#: Top-level keys holding a preset's names, as perfmodel.hw.loader.scan_header reads them.
_NAME_KEYS: dict[str, type] = {"name": str, "display_name": str, "aliases": tuple}


@functools.lru_cache(maxsize=256)
def _scan_preset(path: str, mtime_ns: int, size: int) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """((name, display_name, *aliases), their normalized forms) of one preset from the file's first lines
    (no YAML parse), or None when the scan is unsure. Keyed by mtime and size too, so an edited file is
    scanned again."""
    from perfmodel.hw.speccache import scan_names

    return scan_names(path, _NAME_KEYS, lambda h: (h["name"], h["display_name"], *h["aliases"]), normalize)


def _find_preset(key: str) -> ModelConfig | None:
    """The preset get_model() would pick for ``key`` (same order as all_presets()), loading only its file;
    None when a file's head cannot be scanned, nothing matches, or the loaded preset's names are not what
    the scan read (the caller then loads every preset)."""
    from perfmodel.hw.speccache import scan_heads

    heads = scan_heads(sorted(presets_dir().glob("*.yaml")), _scan_preset)
    if heads is None:
        return None
    for f, names, keys in sorted(heads, key=lambda h: h[1][0]):
        if key in keys:
            cfg = load_model_yaml(str(f))
            return cfg if (cfg.name, cfg.display_name, *cfg.aliases) == names else None
    return None


def get_model(name_or_path: str) -> ModelConfig:
    """A preset by name or alias, a model YAML file, or a Hugging Face config.json path."""
    text = str(name_or_path)
    path = Path(text)
    if text.endswith((".json", ".yaml", ".yml")) or "/" in text or path.is_dir():
        if path.is_dir():
            path = path / "config.json"
        if not path.is_file():
            raise InputError(f"model config '{path}' does not exist; pass a preset name or a config.json path")
        if path.suffix in (".yaml", ".yml"):
            return load_model_yaml(str(path.resolve()))
        from perfmodel.model.hf_config import load_hf_config  # it imports normalize from here

        return load_hf_config(path)
    key = normalize(text)
    found = _find_preset(key)
    if found is not None:
        return found
    presets = all_presets()
    for cfg in presets:
        if key in {normalize(n) for n in (cfg.name, cfg.display_name, *cfg.aliases)}:
            return cfg
    import difflib

    names = {normalize(n): cfg.name for cfg in presets for n in (cfg.name, cfg.display_name, *cfg.aliases)}
    close = sorted({names[m] for m in difflib.get_close_matches(key, list(names), n=3, cutoff=0.6)})
    hint = f"did you mean {', '.join(close)}? " if close else ""
    known = ", ".join(cfg.name for cfg in presets)
    raise InputError(f"unknown model '{text}'; {hint}known models: {known} (or pass `config` PATH/config.json)")


def describe(cfg: ModelConfig) -> str:
    """One line: the architecture at a glance."""
    parts = [f"{cfg.num_layers} layers", f"hidden {cfg.hidden_size}",
             f"{cfg.num_q_heads}q/{cfg.num_kv_heads}kv heads x {cfg.head_dim}"]
    if cfg.mla:
        parts.append(f"MLA latent {cfg.mla.kv_lora_rank}+{cfg.mla.qk_rope_head_dim}")
    if cfg.moe:
        parts.append(f"MoE {cfg.moe.experts_per_token}/{cfg.moe.num_experts} experts x "
                     f"{cfg.moe.expert_intermediate_size} on {cfg.moe.num_moe_layers} layers")
    if cfg.num_dense_layers:
        layout = ("gated " if cfg.mlp_gated else "") + cfg.mlp_activation + (" +bias" if cfg.mlp_bias else "")
        parts.append(f"dense MLP {cfg.intermediate_size} ({layout})")
    if cfg.sliding_window_tokens:
        parts.append(f"{cfg.num_sliding_window_layers} sliding-window layers ({cfg.sliding_window_tokens} tokens)")
    parts.append(f"vocab {cfg.vocab_size}")
    return ", ".join(parts)
