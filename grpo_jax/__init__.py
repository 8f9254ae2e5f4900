"""grpo_jax: GRPO for code generation in JAX/Flax, with a sandboxed code-reward executor.

The public API for real checkpoints (loaded lazily, so `import grpo_jax.sandbox` stays free of JAX):

    cfg, params = grpo_jax.load_pretrained(path)          # an HF directory, a .gguf file, a known name
    grpo_jax.save_pretrained(path, cfg, params, tokenizer=None)
    tok = grpo_jax.load_tokenizer(path)
    logits = grpo_jax.policies.transformer.forward(params, cfg, tokens, mask)[0]

A run: grpo_jax.config.RunConfig -> grpo_jax.train.loop.run (or `python -m experiments.codegen`).
"""

from __future__ import annotations

import importlib

_LAZY = {
    "load_pretrained": "grpo_jax.pretrained.api",
    "save_pretrained": "grpo_jax.pretrained.api",
    "load_tokenizer": "grpo_jax.pretrained.api",
}

__all__ = ["load_pretrained", "save_pretrained", "load_tokenizer"]


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in (
        "policies",
        "core",
        "train",
        "codegen",
        "sandbox",
        "pretrained",
        "tokenization",
        "config",
        "pool",
    ):
        return importlib.import_module(f"grpo_jax.{name}")
    raise AttributeError(f"module 'grpo_jax' has no attribute {name!r}")
