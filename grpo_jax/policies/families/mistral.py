"""Mistral (model_type "mistral"; transformers models/mistral/modeling_mistral.py, configuration_mistral.py).

A Llama without biases whose every layer attends within `sliding_window` (None: full attention; Mistral
7B v0.1 has 4096, v0.2 / v0.3 null). MistralModel builds `create_sliding_window_causal_mask` for all layers
when the window is set and ignores `layer_types` (MistralConfig warns about it), so it is ignored here too.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family


class Mistral(Family):
    model_type = "mistral"
    architecture = "MistralForCausalLM"
    defaults = dict(  # transformers 5.x MistralConfig
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=14336,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=8,
        head_dim=None,
        hidden_act="silu",
        max_position_embeddings=4096 * 32,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        sliding_window=4096,
    )
    extras = frozenset({"sliding_window", "layer_types"})

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        mlp_act = r.activation()
        theta, scaling = r.rope(max_pos, [], self.default_theta)
        window = r.get("sliding_window")
        out: dict[str, Any] = dict(mlp_act=mlp_act, rope_theta=theta, rope_scaling=scaling)
        if window is not None:
            out.update(sliding_window=r.num("sliding_window"), layer_types=("sliding_attention",) * n_layers)
        return out

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return {"sliding_window": cfg.sliding_window}

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if cfg.qkv_bias or cfg.o_bias or cfg.qk_norm:
            return "mistral has no attention biases and no q/k norm: needs qkv_bias=o_bias=qk_norm=False"
        if cfg.layer_types is not None and set(cfg.layer_types) != {"sliding_attention"}:
            return "mistral's window is on every layer or none: needs layer_types all sliding_attention"
        return self.extras_check(cfg)


FAMILY = Mistral()
