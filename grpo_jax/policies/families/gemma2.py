"""Gemma 2 (model_type "gemma2"; transformers models/gemma2/modeling_gemma2.py, configuration_gemma2.py).

Differences from Llama (Gemma2DecoderLayer, Gemma2Attention, Gemma2Model, Gemma2ForCausalLM):
* RMSNorm scales by (1 + w) (Gemma2RMSNorm; the checkpoint stores w, initialised to 0): norm_offset 1;
* GeGLU MLP, hidden_activation "gelu_pytorch_tanh" (Gemma2MLP);
* embeddings x sqrt(hidden_size), rounded to the embedding dtype (Gemma2TextScaledWordEmbedding);
* attention scale query_pre_attn_scalar^-0.5 instead of head_dim^-0.5;
* four norms per layer: input_layernorm, post_attention_layernorm (of the attention output, before the
  residual add), pre_feedforward_layernorm, post_feedforward_layernorm (post_norms);
* attention scores soft-capped, tanh(s / cap) * cap with attn_logit_softcapping (eager_attention_forward),
  and the logits with final_logit_softcapping;
* layers alternate sliding-window (even i) and global attention (`layer_types`; Gemma2Config default);
* tied embeddings by default; `attention_bias` biases q, k, v and o.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import EXTRA_FIELDS, ConfigReader, Family, same_bias

GEMMA_NORMS = {
    "attn_norm": "input_layernorm",
    "attn_post_norm": "post_attention_layernorm",
    "mlp_norm": "pre_feedforward_layernorm",
    "mlp_post_norm": "post_feedforward_layernorm",
}


def gemma_common(r: ConfigReader, layer_types: list[str]) -> dict[str, Any]:
    """The TransformerConfig fields Gemma 2 and 3 read alike: MLP, norms, embedding scale, attention scale,
    logit soft-cap, biases and the sliding window of `layer_types`."""
    if r.get("use_bidirectional_attention"):
        r.refuse(
            "use_bidirectional_attention",
            r.hf.get("use_bidirectional_attention"),
            "bidirectional attention is not a causal LM; valid: false / null",
        )
    out: dict[str, Any] = dict(
        mlp_act=r.activation(),
        norm_offset=1.0,
        post_norms=True,
        embed_scale=True,
        query_pre_attn_scalar=r.num("query_pre_attn_scalar", float),
        final_softcap=None
        if r.get("final_logit_softcapping") is None
        else r.num("final_logit_softcapping", float),
    )
    bias = bool(r.get("attention_bias"))
    out.update(qkv_bias=bias, o_bias=bias)
    if not isinstance(layer_types, list) or any(t not in tfm.ATTENTION_TYPES for t in layer_types):
        r.refuse("layer_types", layer_types, f"valid: a list of {', '.join(tfm.ATTENTION_TYPES)}")
    if "sliding_attention" in layer_types:
        if r.get("sliding_window") is None:
            r.refuse("sliding_window", None, "layer_types has sliding_attention layers: needs a window")
        out.update(sliding_window=r.num("sliding_window"), layer_types=tuple(layer_types))
    return out


def gemma_write(cfg: tfm.TransformerConfig) -> dict[str, Any]:
    if cfg.query_pre_attn_scalar is None:  # gemma_check refuses such a config before any write
        raise ValueError("Gemma config.json needs query_pre_attn_scalar (got None)")
    return dict(
        hidden_activation="gelu_pytorch_tanh",
        query_pre_attn_scalar=_number(cfg.query_pre_attn_scalar),
        final_logit_softcapping=cfg.final_softcap,
        attention_bias=bool(cfg.qkv_bias),
        sliding_window=cfg.sliding_window,
        layer_types=list(cfg.layer_types or ("full_attention",) * cfg.n_layers),
        use_bidirectional_attention=False,
    )


def _number(x: float) -> int | float:
    """x as config.json writes it: an int when it is one (Gemma*Config: query_pre_attn_scalar is an int)."""
    return int(x) if float(x).is_integer() else float(x)


def gemma_check(fam: Family, cfg: tfm.TransformerConfig) -> str | None:
    want = dict(norm_offset=1.0, mlp_act="gelu_tanh", post_norms=True, embed_scale=True)
    for name, value in want.items():
        if getattr(cfg, name) != value:
            return f"{fam.model_type} needs {name}={value!r} (got {getattr(cfg, name)!r})"
    if cfg.query_pre_attn_scalar is None:
        return f"{fam.model_type} needs query_pre_attn_scalar (its attention scale, config.json's)"
    return same_bias(fam.model_type, cfg) or fam.extras_check(cfg)


class Gemma2(Family):
    model_type = "gemma2"
    architecture = "Gemma2ForCausalLM"
    defaults = dict(  # transformers 5.x Gemma2Config
        vocab_size=256000,
        hidden_size=2304,
        intermediate_size=9216,
        num_hidden_layers=26,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=256,
        hidden_activation="gelu_pytorch_tanh",
        max_position_embeddings=8192,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        attention_bias=False,
        query_pre_attn_scalar=256,
        sliding_window=4096,
        final_logit_softcapping=30.0,
        attn_logit_softcapping=50.0,
        use_bidirectional_attention=None,
    )
    activation_key = "hidden_activation"
    activations = ("gelu_tanh",)
    extras = frozenset(EXTRA_FIELDS) - {"rope_local_theta", "no_rope_layers"}
    eog_tokens = ("<end_of_turn>",)
    norm_tensors = GEMMA_NORMS

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        layer_types = r.hf.get("layer_types")
        if layer_types is None:  # Gemma2Config.__post_init__
            layer_types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
        out = gemma_common(r, layer_types)
        cap = r.get("attn_logit_softcapping")
        out["attn_softcap"] = None if cap is None else r.num("attn_logit_softcapping", float)
        out["rope_theta"], out["rope_scaling"] = r.rope(max_pos, layer_types, self.default_theta)
        return out

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        return dict(gemma_write(cfg), attn_logit_softcapping=cfg.attn_softcap)

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if cfg.qk_norm:
            return "gemma2 has no q/k norm: needs qk_norm=False (gemma3_text has it)"
        return gemma_check(self, cfg)


FAMILY = Gemma2()
