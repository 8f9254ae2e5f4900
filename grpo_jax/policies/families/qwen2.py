"""Qwen2 / Qwen2.5 (model_type "qwen2"; transformers models/qwen2/modeling_qwen2.py, configuration_qwen2.py).

q/k/v always biased, o never (Qwen2Attention hardcodes it; `attention_bias` is not read); head_dim =
hidden / heads unless given. The optional sliding window (`use_sliding_window` on the layers >=
max_window_layers, or as `layer_types` says) is refused: no released Qwen2 checkpoint uses it.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family


def qwen_layer_types(r: ConfigReader, n_layers: int) -> list[str]:
    """Qwen2Config / Qwen3Config.__post_init__: the window is used only with use_sliding_window, on the layers
    i >= max_window_layers unless layer_types says otherwise; refused when any layer would slide."""
    window = r.get("sliding_window") if r.get("use_sliding_window") else None
    layer_types = r.hf.get("layer_types")
    if layer_types is None:
        mwl = r.get("max_window_layers")
        slides = [window is not None and i >= mwl for i in range(n_layers)]
        layer_types = ["sliding_attention" if s else "full_attention" for s in slides]
    if "sliding_attention" in layer_types and window is not None:
        r.refuse(
            "use_sliding_window",
            r.hf.get("use_sliding_window"),
            f"sliding-window attention (sliding_window={window}, on layers "
            f"{[i for i, t in enumerate(layer_types) if t != 'full_attention']}) is not "
            "representable; valid: false",
        )
    r.full_attention_only(layer_types)
    return list(layer_types)


def qwen_window_keys(cfg: tfm.TransformerConfig) -> dict[str, Any]:
    return dict(
        use_sliding_window=False,
        sliding_window=None,
        max_window_layers=cfg.n_layers,
        layer_types=["full_attention"] * cfg.n_layers,
    )


class Qwen2(Family):
    model_type = "qwen2"
    architecture = "Qwen2ForCausalLM"
    defaults = dict(  # transformers 5.x Qwen2Config
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=None,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        use_sliding_window=False,
        sliding_window=4096,
        max_window_layers=28,
    )
    eog_tokens = ("<|im_end|>", "<|endoftext|>")  # ChatML
    gguf_architecture = "qwen2"  # llama.cpp's Qwen2Model converter: q/k rows as stored

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        mlp_act = r.activation()
        layer_types = qwen_layer_types(r, n_layers)
        theta, scaling = r.rope(max_pos, layer_types, self.default_theta)
        return dict(mlp_act=mlp_act, rope_theta=theta, rope_scaling=scaling, qkv_bias=True, o_bias=False)

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return qwen_window_keys(cfg)

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if not cfg.qkv_bias or cfg.o_bias or cfg.qk_norm:
            return (
                "qwen2 has q/k/v biases, no o_proj bias, no q/k norm: needs qkv_bias=True, "
                "o_bias=False, qk_norm=False"
            )
        return self.extras_check(cfg)


FAMILY = Qwen2()
