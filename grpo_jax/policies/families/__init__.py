"""Model families: one module per Hugging Face `model_type`, resolved through one registry.

    fam = families.get("gemma3_text")      # the Family of a config.json's model_type (KeyError if unknown)
    fam = families.find(model_type)        # ... or None
    fam = families.infer(cfg)              # the family that represents a TransformerConfig (export)
    families.FAMILIES                      # the model_type values, in `infer`'s order of preference

Each module (llama.py, qwen2.py, ..., see `_MODULES`) holds a `FAMILY`: a base.Family with the family's
transformers defaults, config.json import / export, tensor-name map, GGUF quirks and tokenizer hints.
grpo_jax.pretrained.hf (safetensors directories), grpo_jax.pretrained.gguf and the TransformerConfig
validation read everything family-specific from here. A new family is one module plus one line in
`_MODULES` (docs/MODEL_FAMILIES.md).

Why under policies/ and not pretrained/: TransformerConfig checks its `family` field against the family's
`check` when it is built, and policies may not import pretrained (docs/ARCHITECTURE.md §2, the import
layers); the modules hold data and pure functions over config dicts, no file I/O. Modules are imported on
first use: they import grpo_jax.policies.transformer, whose `FAMILIES` comes from here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from grpo_jax.policies.families.base import Family

# model_type -> module of this package. Order = preference when a TransformerConfig without `family` is
# exported (`infer`): the first family whose check() accepts it (Llama before Mistral / SmolLM3, which can
# hold a plain Llama too).
_MODULES = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "mistral": "mistral",
    "smollm3": "smollm3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
FAMILIES: tuple[str, ...] = tuple(_MODULES)
_LOADED: dict[str, Family] = {}


def get(model_type: str) -> Family:
    """The Family of `model_type` (KeyError naming the valid ones if there is none)."""
    fam = find(model_type)
    if fam is None:
        raise KeyError(f"model_type {model_type!r}: valid: {', '.join(FAMILIES)}")
    return fam


def find(model_type) -> Family | None:
    """The Family of `model_type`, or None."""
    if not isinstance(model_type, str) or model_type not in _MODULES:
        return None
    if model_type not in _LOADED:
        module = importlib.import_module(f"{__name__}.{_MODULES[model_type]}")
        fam = module.FAMILY
        if fam.model_type != model_type:
            raise RuntimeError(
                f"{module.__name__}.FAMILY.model_type={fam.model_type!r}, registered as {model_type!r}"
            )
        _LOADED[model_type] = fam
    return _LOADED[model_type]


def all_families() -> tuple[Family, ...]:
    """Every registered Family, in FAMILIES order."""
    return tuple(get(name) for name in FAMILIES)


def infer(cfg) -> Family:
    """cfg.family's Family, else the first (FAMILIES order) whose check() accepts cfg; ValueError listing
    each family's reason when none does."""
    if cfg.family is not None:
        return get(cfg.family)
    reasons = []
    for fam in all_families():
        why = fam.check(cfg)
        if why is None:
            return fam
        reasons.append(why)
    raise ValueError("no Hugging Face family represents this TransformerConfig: " + "; ".join(reasons))


def gguf_families() -> dict[str, Family]:
    """llama.cpp general.architecture -> the Family read from such a GGUF."""
    return {f.gguf_architecture: f for f in all_families() if f.gguf_architecture is not None}
