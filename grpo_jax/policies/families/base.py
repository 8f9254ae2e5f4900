"""What every model family module provides, and the config.json reading they share.

A family is one Hugging Face `model_type`: a `Family` subclass in its own module of this package, registered
by name in grpo_jax.policies.families. It holds everything that differs between families:

* `defaults`: transformers' configuration-class defaults (configuration_<family>.py), for omitted keys;
* `read(r, ...)`: its config.json fields -> TransformerConfig fields (refusing what the model cannot express,
  with one HFConfigError naming the field), `write(cfg)`: the inverse, `check(cfg)`: why a TransformerConfig
  is not of this family (None if it is);
* `layer_tensors` / `top_tensors`: the checkpoint's tensor names -> the parameter leaves;
* GGUF quirks (`gguf_architecture`, `gguf_permuted_qk`) and tokenizer hints (`eog_tokens`).

The shape fields (vocab, widths, heads, eps, tying) are read the same way for every family by
grpo_jax.pretrained.hf; `ConfigReader` gives a family the file's values with its defaults and the RoPE reading
of transformers' modeling_rope_utils.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, NoReturn

from grpo_jax.errors import ConfigError
from grpo_jax.policies import transformer as tfm

TensorSpec = tuple[str, tuple[str, ...], bool, tuple[int, ...]]  # (HF name, leaf path, transpose, our shape)
DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
SWIGLU_ACTIVATIONS = ("silu", "swish")  # config values of the SwiGLU MLP (ACT2FN: both are SiLU)
GEGLU_ACTIVATIONS = ("gelu_pytorch_tanh",)  # Gemma's tanh-approximated GELU
# TransformerConfig fields of the later families, with the value that means "not used"
EXTRA_FIELDS = {
    f.name: f.default
    for f in dataclasses.fields(tfm.TransformerConfig)
    if f.name
    in (
        "sliding_window",
        "layer_types",
        "rope_local_theta",
        "no_rope_layers",
        "norm_offset",
        "mlp_act",
        "post_norms",
        "embed_scale",
        "query_pre_attn_scalar",
        "attn_softcap",
        "final_softcap",
    )
}


class HFConfigError(ConfigError):
    """A config.json field grpo_jax cannot represent: "<file>: <field>=<value>: <why / what is valid>"."""

    def __init__(self, file: str, field: str, value: Any, why: str):
        super().__init__("config.json", field, value, why)
        self.file = file
        self.args = (f"{file}: {field}={value!r}: {why}",)


class CheckpointError(ValueError):
    """A checkpoint directory or tensor problem (missing / unexpected / mis-shaped tensor); names it."""


def number(file: str, key: str, value: Any, kind: type = int):
    """int / float of a config.json value, or HFConfigError naming the field."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise HFConfigError(file, key, value, f"expected {'an integer' if kind is int else 'a number'}")
    try:
        return kind(value)
    except ValueError:
        raise HFConfigError(
            file, key, value, f"expected {'an integer' if kind is int else 'a number'}"
        ) from None


class ConfigReader:
    """One config.json dict as transformers reads it for a family: `get` falls back to the family's
    configuration-class defaults, `num` converts (or names the field), `refuse` raises the one error."""

    def __init__(self, hf: dict, family: Family, file: str):
        self.hf, self.family, self.file = hf, family, file

    def get(self, key: str) -> Any:
        return self.hf.get(key, self.family.defaults.get(key))

    def num(self, key: str, kind: type = int):
        return number(self.file, key, self.get(key), kind)

    def refuse(self, field: str, value: Any, why: str) -> NoReturn:
        raise HFConfigError(self.file, field, value, why)

    def activation(self) -> str:
        """The MLP's activation (the family's `activation_key`), as TransformerConfig.mlp_act."""
        fam, act = self.family, self.get(self.family.activation_key)
        if act in SWIGLU_ACTIVATIONS and "silu" in fam.activations:
            return "silu"
        if act in GEGLU_ACTIVATIONS and "gelu_tanh" in fam.activations:
            return "gelu_tanh"
        valid = "'silu' (the SwiGLU MLP)" if fam.activations == ("silu",) else "'gelu_pytorch_tanh' (GeGLU)"
        self.refuse(fam.activation_key, act, f"valid: {valid}")

    def no_mlp_bias(self) -> None:
        if self.get("mlp_bias"):
            self.refuse("mlp_bias", self.hf["mlp_bias"], "MLP biases are not representable; valid: false")

    def full_attention_only(self, layer_types) -> None:
        odd = sorted({t for t in layer_types or [] if t != "full_attention"})
        if odd:
            self.refuse("layer_types", odd, "valid: 'full_attention' on every layer")

    def rope(self, max_pos: int, layer_types, default_theta: float = DEFAULT_THETA):
        """(rope_theta, RopeScaling | None), with transformers' precedence (modeling_rope_utils
        `convert_rope_params_to_dict` / `standardize_rope_params`): the `rope_scaling` dict, else
        `rope_parameters`; rope_theta from that dict, else top level, else the family's default; rope_type
        from "rope_type", else "type", else "default"; llama3's original_max_position_embeddings: top level,
        else the dict, else max_position_embeddings. Per-layer-type dicts must all be the same."""
        hf = self.hf
        src = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
        rp = dict(hf.get(src) or {})
        nested = [k for k in rp if k in set(layer_types or [])]
        if nested:  # per-layer-type RoPE dicts: representable only if they are all the same
            dicts = [rp[k] for k in nested if rp[k] is not None]
            if any(d != dicts[0] for d in dicts):
                self.refuse(src, hf.get(src), "different RoPE per layer type is not representable")
            rp, src = dict(dicts[0]) if dicts else {}, f"{src}.{nested[0]}"
        return self.rope_dict(rp, src, max_pos, float(hf.get("rope_theta", default_theta)))

    def rope_dict(self, rp: dict, src: str, max_pos: int, theta_default: float):
        """(rope_theta, RopeScaling | None) of one RoPE parameter dict `rp` (named `src` in errors)."""
        hf = self.hf
        theta = float(rp.get("rope_theta", theta_default))
        prf = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
        if prf is not None and float(prf) != 1.0:
            self.refuse(
                "partial_rotary_factor",
                prf,
                "partial rotary embeddings are not representable; valid: 1.0 or absent",
            )
        rope_type = rp.get("rope_type", rp.get("type", "default"))
        if rope_type == "default":
            return theta, None
        if rope_type != "llama3":
            valid = "valid: 'default', 'llama3' (other RoPE scalings are not implemented)"
            self.refuse(f"{src}.rope_type", rope_type, valid)
        for k in ("factor", "low_freq_factor", "high_freq_factor"):
            if rp.get(k) is None:
                self.refuse(f"{src}.{k}", None, "required by rope_type 'llama3'")
        orig = hf.get("original_max_position_embeddings", rp.get("original_max_position_embeddings", max_pos))
        try:
            scaling = tfm.RopeScaling(
                factor=float(rp["factor"]),
                low_freq_factor=float(rp["low_freq_factor"]),
                high_freq_factor=float(rp["high_freq_factor"]),
                original_max_position_embeddings=int(orig),
            )
        except ValueError as e:
            self.refuse(src, hf.get(src), str(e))
        return theta, scaling


def rope_to_hf(theta: float, scaling: tfm.RopeScaling | None) -> tuple[dict, dict | None]:
    """(rope_parameters, rope_scaling) of a RoPE: transformers 5.x's dict and the 4.x / hub one (or None)."""
    if scaling is None:
        return {"rope_type": "default", "rope_theta": float(theta)}, None
    legacy = {
        "rope_type": "llama3",
        "factor": float(scaling.factor),
        "low_freq_factor": float(scaling.low_freq_factor),
        "high_freq_factor": float(scaling.high_freq_factor),
        "original_max_position_embeddings": int(scaling.original_max_position_embeddings),
    }
    return {**legacy, "rope_theta": float(theta)}, legacy


class Family:
    """One Hugging Face model family (see the module docstring). Subclasses set the class attributes and
    override what differs; the base implements a Llama-like decoder (SwiGLU, RoPE, RMSNorm, no extras)."""

    model_type: ClassVar[str] = ""
    architecture: ClassVar[str] = ""  # config.json "architectures" (the *ForCausalLM class)
    defaults: ClassVar[dict[str, Any]] = {}
    default_theta: ClassVar[float] = DEFAULT_THETA  # rope_theta when config.json has none
    activation_key: ClassVar[str] = "hidden_act"
    activations: ClassVar[tuple[str, ...]] = ("silu",)  # TransformerConfig.mlp_act values it can hold
    extras: ClassVar[frozenset[str]] = frozenset()  # EXTRA_FIELDS this family may set
    # tokenizer hints: the end-of-turn token texts of its chat format (each must be one of
    # grpo_jax.tokenization.hf's end-of-generation tokens, which stop the sampler wherever they appear)
    eog_tokens: ClassVar[tuple[str, ...]] = ()
    # GGUF: the llama.cpp general.architecture it is read from (None: not read from GGUF), and whether
    # llama.cpp's converter permuted its q/k rows (grpo_jax.pretrained.gguf)
    gguf_architecture: ClassVar[str | None] = None
    gguf_permuted_qk: ClassVar[bool] = False
    # parameter leaf -> HF per-layer norm name
    norm_tensors: ClassVar[dict[str, str]] = {
        "attn_norm": "input_layernorm",
        "mlp_norm": "post_attention_layernorm",
    }

    def __repr__(self) -> str:
        return f"<family {self.model_type}>"

    # --- config.json -> TransformerConfig ----------------------------------------------------------------

    def read(self, r: ConfigReader, *, n_layers: int, max_pos: int) -> dict[str, Any]:
        """The TransformerConfig fields of config.json beyond the shape (biases, RoPE, attention, MLP...)."""
        raise NotImplementedError

    # --- TransformerConfig -> config.json ----------------------------------------------------------------

    def write(self, cfg: tfm.TransformerConfig) -> dict[str, Any]:
        """The config.json keys beyond the common ones grpo_jax.pretrained.hf.config_to_hf writes (which
        include the RoPE of `rope_to_hf`; a family may override them)."""
        return {}

    def check(self, cfg: tfm.TransformerConfig) -> str | None:
        """Why `cfg` cannot be exported as this family (None: it can): one sentence naming the field."""
        return self.extras_check(cfg)

    def extras_check(self, cfg: tfm.TransformerConfig) -> str | None:
        """The first later-family field (EXTRA_FIELDS) set on cfg that this family does not have."""
        for name, default in EXTRA_FIELDS.items():
            if name not in self.extras and getattr(cfg, name) != default:
                return f"{self.model_type} has no {name}: needs {name}={default!r}"
        return None

    # --- tensor names -------------------------------------------------------------------------------------

    def layer_tensors(self, cfg: tfm.TransformerConfig) -> list[TensorSpec]:
        """(HF name template with {i}, leaf path under "layers", transpose, our per-layer shape)."""
        d, f, h, k, dh = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.dim_head
        a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
        out: list[TensorSpec] = [
            (f"model.layers.{{i}}.{hf}.weight", (leaf,), False, (d,))
            for leaf, hf in self.norm_tensors.items()
        ]
        for name, din, dout, bias in (
            ("q_proj", d, h * dh, cfg.qkv_bias),
            ("k_proj", d, k * dh, cfg.qkv_bias),
            ("v_proj", d, k * dh, cfg.qkv_bias),
            ("o_proj", h * dh, d, cfg.o_bias),
        ):
            out.append((a + name + ".weight", (name, "kernel"), True, (din, dout)))
            if bias:
                out.append((a + name + ".bias", (name, "bias"), False, (dout,)))
        if cfg.qk_norm:
            out += [
                (a + "q_norm.weight", ("q_norm",), False, (dh,)),
                (a + "k_norm.weight", ("k_norm",), False, (dh,)),
            ]
        for name, din, dout in (("gate_proj", d, f), ("up_proj", d, f), ("down_proj", f, d)):
            out.append((m + name + ".weight", (name, "kernel"), True, (din, dout)))
        return out

    def top_tensors(self, cfg: tfm.TransformerConfig) -> list[TensorSpec]:
        out: list[TensorSpec] = [
            ("model.embed_tokens.weight", ("embed",), False, (cfg.vocab_size, cfg.d_model)),
            ("model.norm.weight", ("final_norm",), False, (cfg.d_model,)),
        ]
        if not cfg.tie_embeddings:
            out.append(("lm_head.weight", ("lm_head",), True, (cfg.d_model, cfg.vocab_size)))
        return out


def same_bias(model_type: str, cfg: tfm.TransformerConfig) -> str | None:
    """The check of a family whose `attention_bias` biases q, k, v and o together (Llama, Qwen3, ...)."""
    if cfg.qkv_bias != cfg.o_bias:
        return (
            f"{model_type}'s attention_bias biases q, k, v and o together: needs "
            f"qkv_bias == o_bias (got qkv_bias={cfg.qkv_bias}, o_bias={cfg.o_bias})"
        )
    return None
