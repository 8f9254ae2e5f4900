"""SmolLM3 (model_type "smollm3"; transformers models/smollm3/modeling_smollm3.py, configuration_smollm3.py).

A Llama-style decoder (SwiGLU, `attention_bias` on q, k, v and o, tied embeddings by default, rope_theta
2e6 by default) with "NoPE" layers: `no_rope_layers[i]` = 0 means layer i applies no rotary embedding
(SmolLM3Attention `use_rope`); omitted, every `no_rope_layer_interval`-th layer (4) has none. The optional
sliding window applies on the layers `layer_types` marks "sliding_attention" (by default the NoPE layers when
`use_sliding_window` and `sliding_window` are set), through their attention mask.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family, same_bias


class SmolLM3(Family):
    model_type = "smollm3"
    architecture = "SmolLM3ForCausalLM"
    defaults = dict(  # transformers 5.x SmolLM3Config
        vocab_size=128256,
        hidden_size=2048,
        intermediate_size=11008,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=None,  # __post_init__: None -> num_attention_heads
        head_dim=None,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        use_sliding_window=False,
        sliding_window=None,
        no_rope_layer_interval=4,
        attention_bias=False,
        mlp_bias=False,
    )
    default_theta = 2000000.0  # SmolLM3Config.default_theta
    extras = frozenset({"sliding_window", "layer_types", "no_rope_layers"})
    eog_tokens = ("<|im_end|>",)  # ChatML

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        mlp_act = r.activation()
        r.no_mlp_bias()
        no_rope = r.hf.get("no_rope_layers")
        if no_rope is None:  # SmolLM3Config.__post_init__
            interval = r.num("no_rope_layer_interval")
            no_rope = [int((i + 1) % interval != 0) for i in range(n_layers)]
        if not isinstance(no_rope, list) or len(no_rope) != n_layers or any(v not in (0, 1) for v in no_rope):
            r.refuse("no_rope_layers", no_rope, f"valid: {n_layers} (num_hidden_layers) flags 0 / 1")
        window = r.get("sliding_window") if r.get("use_sliding_window") else None
        layer_types = r.hf.get("layer_types")
        if layer_types is None:
            layer_types = [
                "sliding_attention" if window is not None and not no_rope[i] else "full_attention"
                for i in range(n_layers)
            ]
        out: dict[str, Any] = dict(mlp_act=mlp_act, no_rope_layers=tuple(int(v) for v in no_rope))
        if "sliding_attention" in layer_types:
            if window is None:
                r.refuse(
                    "use_sliding_window",
                    r.hf.get("use_sliding_window"),
                    "layer_types has sliding_attention layers but no window is in use (transformers' "
                    "attention implementations disagree on them); valid: true with a sliding_window",
                )
            out.update(sliding_window=r.num("sliding_window"), layer_types=tuple(layer_types))
        else:
            r.full_attention_only(layer_types)
        out["rope_theta"], out["rope_scaling"] = r.rope(max_pos, layer_types, self.default_theta)
        bias = bool(r.get("attention_bias"))
        return dict(out, qkv_bias=bias, o_bias=bias)

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return dict(
            attention_bias=bool(cfg.qkv_bias),
            mlp_bias=False,
            no_rope_layers=list(cfg.no_rope_layers or (1,) * cfg.n_layers),
            use_sliding_window=cfg.sliding_window is not None,
            sliding_window=cfg.sliding_window,
            layer_types=list(cfg.layer_types or ("full_attention",) * cfg.n_layers),
        )

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if cfg.qk_norm:
            return "smollm3 has no q/k norm: needs qk_norm=False"
        return same_bias(self.model_type, cfg) or self.extras_check(cfg)


FAMILY = SmolLM3()
