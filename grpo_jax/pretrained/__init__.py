"""Pretrained checkpoints from outside grpo_jax, in and out: Hugging Face directories (hf, safetensors_io),
GGUF files (gguf) and one entry point for both (api). Our own model code is grpo_jax.policies; tokenizers are
grpo_jax.tokenization.

Import cost: the submodules import JAX; nothing here imports transformers or torch.
"""

# --- Hugging Face safetensors checkpoints (grpo_jax.policies.families): grpo_jax.pretrained.hf ---
# --- GGUF files (llama / qwen2, dequantized): grpo_jax.pretrained.gguf ---
# --- one entry point (a directory, a .gguf file or a known name): grpo_jax.pretrained.api ---
from grpo_jax.pretrained.api import KNOWN, load_pretrained, load_tokenizer, resolve, save_pretrained
from grpo_jax.pretrained.gguf import load_gguf
from grpo_jax.pretrained.hf import (
    CheckpointError,
    HFConfigError,
    config_from_hf,
    config_to_hf,
    fold_merged,
    load_hf,
    save_hf,
    save_peft_adapters,
)

# --- tokenizers (re-exported from grpo_jax.tokenization) ---
from grpo_jax.tokenization import HFTokenizer, Tokenizer, render_chat_template

__all__ = [
    "CheckpointError",
    "HFConfigError",
    "config_from_hf",
    "config_to_hf",
    "fold_merged",
    "load_hf",
    "save_hf",
    "save_peft_adapters",
    "load_gguf",
    "KNOWN",
    "load_pretrained",
    "resolve",
    "save_pretrained",
    "HFTokenizer",
    "Tokenizer",
    "load_tokenizer",
    "render_chat_template",
]
