"""Checkpoints from outside grpo_jax: Hugging Face directories (hf), GGUF files and tokenizers.

Import cost: the submodules import JAX; nothing here imports transformers or torch.
"""

# --- Hugging Face safetensors checkpoints (llama / qwen2 / qwen3): grpo_jax.models.hf ---
# --- GGUF files (llama / qwen2, dequantized): grpo_jax.models.gguf ---
from grpo_jax.models.gguf import load_gguf
from grpo_jax.models.hf import (
    CheckpointError,
    HFConfigError,
    config_from_hf,
    config_to_hf,
    fold_merged,
    load_hf,
    save_hf,
    save_peft_adapters,
)

# --- one entry point (a directory, a .gguf file or a known name): grpo_jax.models.pretrained ---
from grpo_jax.models.pretrained import KNOWN, load_pretrained, load_tokenizer, resolve, save_pretrained

# --- tokenizers (the procedural CodeTokenizer, tokenizer.json, GGUF metadata; chat templates) ---
from grpo_jax.models.tokenizers import HFTokenizer, Tokenizer, render_chat_template

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
