"""Llama (model_type "llama"; transformers models/llama/modeling_llama.py, configuration_llama.py).

Llama 2 / 3 / 3.1 / 3.2, SmolLM2, Mistral-style dense models published as llama: `attention_bias` biases q,
k, v AND o (LlamaAttention), `mlp_bias` (refused), `head_dim` may differ from hidden / heads, RoPE "default"
or "llama3" (Llama 3.1 frequency scaling). No sliding window, no q/k norm.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family, same_bias


class Llama(Family):
    model_type = "llama"
    architecture = "LlamaForCausalLM"
    defaults = dict(  # transformers 5.x LlamaConfig
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=None,
        head_dim=None,
        hidden_act="silu",
        max_position_embeddings=2048,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
    )
    eog_tokens = ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>")  # Llama 3's chat format
    gguf_architecture = "llama"
    gguf_permuted_qk = True  # convert_hf_to_gguf.py LlamaModel.permute

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        mlp_act = r.activation()
        r.no_mlp_bias()
        layer_types = r.hf.get("layer_types")
        r.full_attention_only(layer_types)
        theta, scaling = r.rope(max_pos, layer_types, self.default_theta)
        bias = bool(r.get("attention_bias"))
        return dict(mlp_act=mlp_act, rope_theta=theta, rope_scaling=scaling, qkv_bias=bias, o_bias=bias)

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return {"attention_bias": bool(cfg.qkv_bias), "mlp_bias": False}

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if cfg.qk_norm:
            return "llama has no q/k norm: needs qk_norm=False (qwen3 has it)"
        return same_bias(self.model_type, cfg) or self.extras_check(cfg)


FAMILY = Llama()
