"""Qwen3 (model_type "qwen3"; transformers models/qwen3/modeling_qwen3.py, configuration_qwen3.py).

Qwen2 plus a per-head q/k RMSNorm before RoPE (Qwen3Attention q_norm / k_norm), `attention_bias` biasing q,
k, v and o as Llama, head_dim 128 by default. The sliding window is refused as for Qwen2.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family, same_bias
from grpo_jax.policies.families.qwen2 import Qwen2, qwen_layer_types, qwen_window_keys


class Qwen3(Family):
    model_type = "qwen3"
    architecture = "Qwen3ForCausalLM"
    # transformers 5.x Qwen3Config: Qwen2Config's, but for these
    defaults = {**Qwen2.defaults, "head_dim": 128, "attention_bias": False}
    eog_tokens = ("<|im_end|>", "<|endoftext|>")  # ChatML

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        mlp_act = r.activation()
        layer_types = qwen_layer_types(r, n_layers)
        theta, scaling = r.rope(max_pos, layer_types, self.default_theta)
        bias = bool(r.get("attention_bias"))
        return dict(
            mlp_act=mlp_act, rope_theta=theta, rope_scaling=scaling, qkv_bias=bias, o_bias=bias, qk_norm=True
        )

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return {"attention_bias": bool(cfg.qkv_bias), **qwen_window_keys(cfg)}

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if not cfg.qk_norm:
            return "qwen3 always has the per-head q/k norm: needs qk_norm=True"
        return same_bias(self.model_type, cfg) or self.extras_check(cfg)


FAMILY = Qwen3()
