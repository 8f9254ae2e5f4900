"""Gemma 3 text (model_type "gemma3_text"; transformers models/gemma3/modeling_gemma3.py,
configuration_gemma3.py): the decoder of Gemma 3 1B (Gemma3ForCausalLM).

Gemma 2's layer (see gemma2.py: (1 + w) RMSNorm, GeGLU, sqrt(d) embedding scale, query_pre_attn_scalar,
pre + post norms, final-logit soft-cap) plus:
* a per-head q/k RMSNorm before RoPE, also (1 + w) (Gemma3Attention q_norm / k_norm);
* interleaved sliding-window and global layers, by default 5 sliding then 1 global: `layer_types`, or in the
  layout released checkpoints ship `sliding_window_pattern` (6: layer i slides unless (i + 1) % 6 == 0);
* two RoPE bases: global layers rope_theta (1e6; with rope_scaling, if any), sliding layers
  `rope_local_base_freq` (1e4, never scaled): in transformers 5.x `rope_parameters` = {"full_attention":
  {...}, "sliding_attention": {...}} (Gemma3TextConfig.convert_rope_params_to_dict, Gemma3RotaryEmbedding);
* attention scores are NOT soft-capped: Gemma3Attention does not pass attn_logit_softcapping to the attention
  function, so it is read and ignored, as transformers does.
"""

from __future__ import annotations

from typing import Any

from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import ConfigReader, Family, rope_to_hf
from grpo_jax.policies.families.gemma2 import GEMMA_NORMS, Gemma2, gemma_check, gemma_common, gemma_write

DEFAULT_THETA = {"global": 1_000_000.0, "local": 10_000.0}  # Gemma3TextConfig.default_theta


class Gemma3Text(Family):
    model_type = "gemma3_text"
    architecture = "Gemma3ForCausalLM"
    defaults = {  # transformers 5.x Gemma3TextConfig: Gemma2Config's, but for these
        **Gemma2.defaults,
        "vocab_size": 262_208,
        "max_position_embeddings": 131_072,
        "final_logit_softcapping": None,
        "attn_logit_softcapping": None,
        "use_bidirectional_attention": False,
        "sliding_window_pattern": 6,
    }
    default_theta = DEFAULT_THETA["global"]
    activation_key = "hidden_activation"
    activations = ("gelu_tanh",)
    extras = frozenset(
        {
            "sliding_window",
            "layer_types",
            "rope_local_theta",
            "norm_offset",
            "mlp_act",
            "post_norms",
            "embed_scale",
            "query_pre_attn_scalar",
            "final_softcap",
        }
    )
    eog_tokens = ("<end_of_turn>",)
    norm_tensors = GEMMA_NORMS

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        layer_types = r.hf.get("layer_types")
        if layer_types is None:  # Gemma3TextConfig.__post_init__: the pattern the released configs carry
            pattern = r.num("sliding_window_pattern")
            if pattern < 1:
                r.refuse("sliding_window_pattern", pattern, "valid: a positive integer")
            layer_types = [
                "sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n_layers)
            ]
        out = gemma_common(r, layer_types)
        out["qk_norm"] = True
        full, local = self._rope_parameters(r)
        out["rope_theta"], out["rope_scaling"] = r.rope_dict(
            full, "rope_parameters.full_attention", max_pos, DEFAULT_THETA["global"]
        )
        theta, scaling = r.rope_dict(
            local, "rope_parameters.sliding_attention", max_pos, DEFAULT_THETA["local"]
        )
        if scaling is not None:
            r.refuse(
                "rope_parameters.sliding_attention.rope_type",
                local.get("rope_type"),
                "valid: 'default' (the sliding layers' RoPE is never scaled here)",
            )
        if "sliding_attention" in layer_types:
            out["rope_local_theta"] = theta
        return out

    @staticmethod
    def _rope_parameters(r: ConfigReader) -> tuple[dict, dict]:
        """The full / sliding RoPE dicts as Gemma3TextConfig.convert_rope_params_to_dict builds them: the
        nested `rope_parameters` (5.x) or defaults; a legacy `rope_scaling` updates the full one; missing
        thetas from rope_theta / rope_local_base_freq, else 1e6 / 1e4."""
        rp = r.hf.get("rope_parameters")
        if rp is not None and not (isinstance(rp, dict) and set(rp) <= set(tfm.ATTENTION_TYPES)):
            r.refuse(
                "rope_parameters",
                rp,
                "gemma3_text needs one dict per layer type: "
                "{'full_attention': {...}, 'sliding_attention': {...}}",
            )
        rp = rp or {}
        full = dict(rp.get("full_attention") or {"rope_type": "default"})
        local = dict(rp.get("sliding_attention") or {"rope_type": "default"})
        if r.hf.get("rope_scaling") is not None:
            full.update(r.hf["rope_scaling"])
        full.setdefault("rope_theta", r.hf.get("rope_theta", DEFAULT_THETA["global"]))
        local.setdefault("rope_theta", r.hf.get("rope_local_base_freq", DEFAULT_THETA["local"]))
        return full, local

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        full, legacy = rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
        local_theta = cfg.rope_local_theta if cfg.rope_local_theta is not None else DEFAULT_THETA["local"]
        out = dict(
            gemma_write(cfg),
            attn_logit_softcapping=None,
            rope_parameters={
                "full_attention": full,
                "sliding_attention": {"rope_type": "default", "rope_theta": float(local_theta)},
            },
            rope_theta=float(cfg.rope_theta),
            rope_scaling=legacy,
            rope_local_base_freq=float(local_theta),
        )
        pattern = _pattern(out["layer_types"])
        if pattern is not None:  # the legacy key too, for readers that predate layer_types
            out["sliding_window_pattern"] = pattern
        return out

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        if not cfg.qk_norm:
            return "gemma3_text always has the per-head q/k norm: needs qk_norm=True"
        if cfg.layer_types is not None and cfg.rope_local_theta is None:
            return "gemma3_text's sliding layers have their own RoPE base: needs rope_local_theta"
        return gemma_check(self, cfg)


def _pattern(layer_types: list[str]) -> int | None:
    """p with layer i sliding unless (i + 1) % p == 0, if `layer_types` follows one (None otherwise)."""
    n = len(layer_types)
    for p in range(1, n + 2):
        if layer_types == ["sliding_attention" if (i + 1) % p else "full_attention" for i in range(n)]:
            return p
    return None


FAMILY = Gemma3Text()
