"""Hugging Face checkpoints in and out of grpo_jax's transformer (families llama, qwen2, qwen3).

    cfg, params = load_hf("path/to/Qwen2.5-0.5B")          # config.json + model.safetensors (or sharded)
    logits, _ = transformer.forward(params, cfg, tokens, mask)
    save_hf("out/", cfg, params, tokenizer)                 # AutoModelForCausalLM.from_pretrained("out/")

Every architectural fact comes from config.json, read exactly as transformers 5.x reads it (the defaults
of `LlamaConfig` / `Qwen2Config` / `Qwen3Config` for omitted keys, `rope_scaling` or `rope_parameters`,
rope_theta inside the dict or at the top level, Qwen2's head_dim = hidden/heads unless given, Qwen3's default
128). What the model cannot represent is refused with one `HFConfigError` (a grpo_jax.errors.ConfigError, so
a ValueError) naming the config.json field and its value: sliding-window attention in use, MLP biases, RoPE
types other than default / llama3, partial rotary, activations other than silu, MoE, quantized weights,
other model_types. A missing, unexpected or mis-shaped tensor, or one of a non-float dtype, is a
`CheckpointError` naming the tensor; a config.json or index that is not a JSON object, or a field of the
wrong JSON type, names the file (and the field).

Family differences (transformers models/*/modeling_*.py):
* llama: `attention_bias` biases q, k, v AND o (LlamaAttention) -> qkv_bias = o_bias = attention_bias;
  `mlp_bias` biases the MLP (refused); `head_dim` may differ from hidden/heads.
* qwen2: q/k/v always biased, o never (Qwen2Attention hardcodes it; `attention_bias` is not read).
* qwen3: per-head q/k RMSNorm before RoPE (qk_norm); `attention_bias` as llama.

Weights: HF Linear stores [out, in]; grpo_jax stores kernels [in, out] stacked over layers on axis 0.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import tempfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.errors import ConfigError
from grpo_jax.policies import lora
from grpo_jax.policies import transformer as tfm
from grpo_jax.pretrained import safetensors_io

FAMILIES = tfm.FAMILIES
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

# transformers 5.x configuration-class defaults (configuration_{llama,qwen2,qwen3}.py), for omitted keys
_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": dict(
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
    ),
    "qwen2": dict(
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
    ),
    "qwen3": dict(
        vocab_size=151936,
        hidden_size=4096,
        intermediate_size=22016,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        head_dim=128,
        hidden_act="silu",
        max_position_embeddings=32768,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        attention_bias=False,
        use_sliding_window=False,
        sliding_window=4096,
        max_window_layers=28,
    ),
}
_DEFAULT_THETA = 10000.0  # RotaryEmbeddingConfigMixin.default_theta
_MOE_KEYS = (
    "num_experts",
    "num_local_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
_IGNORED_TENSOR = re.compile(
    r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq"
)  # old non-persistent buffer
_DTYPES = ("float32", "bfloat16", "float16")
_HF_NAME = {  # TransformerConfig field -> config.json key, for error messages
    "vocab_size": "vocab_size",
    "d_model": "hidden_size",
    "n_layers": "num_hidden_layers",
    "n_heads": "num_attention_heads",
    "n_kv_heads": "num_key_value_heads",
    "d_ff": "intermediate_size",
    "head_dim": "head_dim",
}


class HFConfigError(ConfigError):
    """A config.json field grpo_jax cannot represent: "<file>: <field>=<value>: <why / what is valid>"."""

    def __init__(self, file: str, field: str, value: Any, why: str):
        super().__init__("config.json", field, value, why)
        self.file = file
        self.args = (f"{file}: {field}={value!r}: {why}",)


class CheckpointError(ValueError):
    """A checkpoint directory or tensor problem (missing / unexpected / mis-shaped tensor); names it."""


# ----------------------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig


def _rope(hf: dict, file: str, max_pos: int, layer_types: list[str]) -> tuple[float, Any]:
    """(rope_theta, RopeScaling | None), with transformers' precedence (modeling_rope_utils
    `convert_rope_params_to_dict` / `standardize_rope_params`): the `rope_scaling` dict, else
    `rope_parameters`; rope_theta from that dict, else top level, else 10000; rope_type from "rope_type", else
    "type", else "default"; llama3's original_max_position_embeddings: top level, else the dict, else
    max_position_embeddings."""
    src = "rope_scaling" if hf.get("rope_scaling") else "rope_parameters"
    rp = dict(hf.get(src) or {})
    nested = [k for k in rp if k in set(layer_types)]
    if nested:  # per-layer-type RoPE dicts: representable only if they are all the same
        dicts = [rp[k] for k in nested if rp[k] is not None]
        if any(d != dicts[0] for d in dicts):
            raise HFConfigError(file, src, hf.get(src), "different RoPE per layer type is not representable")
        rp, src = dict(dicts[0]) if dicts else {}, f"{src}.{nested[0]}"
    theta = float(rp.get("rope_theta", hf.get("rope_theta", _DEFAULT_THETA)))
    prf = rp.get("partial_rotary_factor", hf.get("partial_rotary_factor"))
    if prf is not None and float(prf) != 1.0:
        raise HFConfigError(
            file,
            "partial_rotary_factor",
            prf,
            "partial rotary embeddings are not representable; valid: 1.0 or absent",
        )
    rope_type = rp.get("rope_type", rp.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type != "llama3":
        raise HFConfigError(
            file,
            f"{src}.rope_type",
            rope_type,
            "valid: 'default', 'llama3' (other RoPE scalings are not implemented)",
        )
    for k in ("factor", "low_freq_factor", "high_freq_factor"):
        if rp.get(k) is None:
            raise HFConfigError(file, f"{src}.{k}", None, "required by rope_type 'llama3'")
    orig = hf.get("original_max_position_embeddings", rp.get("original_max_position_embeddings", max_pos))
    try:
        scaling = tfm.RopeScaling(
            factor=float(rp["factor"]),
            low_freq_factor=float(rp["low_freq_factor"]),
            high_freq_factor=float(rp["high_freq_factor"]),
            original_max_position_embeddings=int(orig),
        )
    except ValueError as e:
        raise HFConfigError(file, src, hf.get(src), str(e)) from e
    return theta, scaling


def config_from_hf(
    hf: dict, *, param_dtype: str = "float32", file: str = "config.json"
) -> tfm.TransformerConfig:
    """The TransformerConfig of a Hugging Face config.json dict (llama / qwen2 / qwen3), or HFConfigError
    naming the field (a value of the wrong type included); CheckpointError for a file that is not a JSON
    object or is malformed otherwise."""
    if not isinstance(hf, dict):
        raise CheckpointError(
            f"{file}: a JSON {type(hf).__name__}, not an object (valid: a Hugging Face config.json)"
        )
    try:
        return _config_from_hf(hf, param_dtype, file)
    except (HFConfigError, CheckpointError):
        raise
    except (TypeError, ValueError, AttributeError, KeyError) as e:  # a field of an unexpected JSON type
        raise CheckpointError(f"{file}: malformed config.json ({type(e).__name__}: {e})") from None


def _number(file: str, key: str, value: Any, kind: type = int):
    """int / float of a config.json value, or HFConfigError naming the field."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise HFConfigError(file, key, value, f"expected {'an integer' if kind is int else 'a number'}")
    try:
        return kind(value)
    except ValueError:
        raise HFConfigError(
            file, key, value, f"expected {'an integer' if kind is int else 'a number'}"
        ) from None


def _config_from_hf(hf: dict, param_dtype: str, file: str) -> tfm.TransformerConfig:
    mt = hf.get("model_type")
    if mt not in FAMILIES:
        raise HFConfigError(
            file,
            "model_type",
            mt,
            f"valid: {', '.join(FAMILIES)} (dense decoders; MoE, "
            "sliding-window and other families are not representable)",
        )
    d = _DEFAULTS[mt]

    def get(k):
        return hf.get(k, d.get(k))

    def num(k, kind=int):
        return _number(file, k, get(k), kind)

    if hf.get("quantization_config"):
        raise HFConfigError(
            file,
            "quantization_config",
            hf["quantization_config"].get("quant_method", "?"),
            "quantized weights are not readable; use an unquantized (float) checkpoint",
        )
    for k in _MOE_KEYS:
        if hf.get(k):
            raise HFConfigError(file, k, hf[k], "mixture-of-experts MLPs are not representable (dense only)")
    act = get("hidden_act")
    if act not in ("silu", "swish"):
        raise HFConfigError(file, "hidden_act", act, "valid: 'silu' (the SwiGLU MLP)")
    if mt == "llama" and get("mlp_bias"):
        raise HFConfigError(
            file, "mlp_bias", hf["mlp_bias"], "MLP biases are not representable; valid: false"
        )
    n_layers = num("num_hidden_layers")
    layer_types = hf.get("layer_types")
    if mt in ("qwen2", "qwen3"):
        # Qwen2Config / Qwen3Config.__post_init__: the window is used only with use_sliding_window, on the
        # layers i >= max_window_layers unless layer_types says otherwise
        window = get("sliding_window") if get("use_sliding_window") else None
        if layer_types is None:
            mwl = get("max_window_layers")
            layer_types = [
                "sliding_attention" if window is not None and i >= mwl else "full_attention"
                for i in range(n_layers)
            ]
        if "sliding_attention" in layer_types and window is not None:
            raise HFConfigError(
                file,
                "use_sliding_window",
                hf.get("use_sliding_window"),
                f"sliding-window attention (sliding_window={window}, on layers "
                f"{[i for i, t in enumerate(layer_types) if t != 'full_attention']}) is not "
                "representable; valid: false",
            )
    layer_types = list(layer_types or [])
    odd = sorted({t for t in layer_types if t != "full_attention"})
    if odd:
        raise HFConfigError(file, "layer_types", odd, "valid: 'full_attention' on every layer")
    d_model, n_heads = num("hidden_size"), num("num_attention_heads")
    n_kv = n_heads if get("num_key_value_heads") is None else num("num_key_value_heads")
    head_dim = None if get("head_dim") is None else num("head_dim")
    head_dim = None if head_dim is None or head_dim * n_heads == d_model else head_dim
    max_pos = num("max_position_embeddings")
    theta, scaling = _rope(hf, file, max_pos, layer_types)
    if mt == "qwen2":
        qkv_bias, o_bias = True, False
    else:
        qkv_bias = o_bias = bool(get("attention_bias"))
    try:
        return tfm.TransformerConfig(
            vocab_size=num("vocab_size"),
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_ff=num("intermediate_size"),
            head_dim=head_dim,
            rope_theta=theta,
            rms_eps=num("rms_norm_eps", float),
            qkv_bias=qkv_bias,
            tie_embeddings=bool(get("tie_word_embeddings")),
            param_dtype=param_dtype,
            qk_norm=mt == "qwen3",
            o_bias=o_bias,
            rope_scaling=scaling,
            max_position_embeddings=max_pos,
            family=mt,
            init_std=float(hf.get("initializer_range", 0.02)),
        )
    except ValueError as e:
        m = re.match(r"TransformerConfig\.(\w+)=", str(e))
        field = _HF_NAME.get(m.group(1), m.group(1)) if m else "config"
        raise HFConfigError(file, field, hf.get(field), f"not a valid model: {e}") from e


def infer_family(cfg: tfm.TransformerConfig) -> str:
    """cfg.family, else the HF family that represents cfg: qwen3 (q/k norm), qwen2 (q/k/v bias, no o bias),
    llama (no biases, or q/k/v/o biases)."""
    if cfg.family is not None:
        return cfg.family
    if cfg.qk_norm:
        fam = "qwen3"
    elif cfg.qkv_bias and not cfg.o_bias:
        fam = "qwen2"
    else:
        fam = "llama"
    try:
        dataclasses.replace(cfg, family=fam)
    except ValueError as e:
        raise ValueError(f"no Hugging Face family represents this TransformerConfig: {e}") from e
    return fam


def config_to_hf(cfg: tfm.TransformerConfig, *, dtype: str = "float32", tokenizer: Any = None) -> dict:
    """The config.json dict transformers reads back as the same architecture (see `config_from_hf`).

    config_from_hf(config_to_hf(cfg)) == cfg up to the fields config.json does not hold (compute_dtype, remat,
    value_head) and max_position_embeddings=None, written as the family's default.

    RoPE is written both ways: `rope_parameters` (transformers 5.x) and top-level rope_theta / `rope_scaling`
    (4.x and the hub convention). bos/eos/pad ids are the tokenizer's (`bos_id`, `eos_ids`/`eos_id`, `pad_id`)
    or null."""
    fam = infer_family(cfg)
    rp: dict[str, Any] = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    scaling = None
    if cfg.rope_scaling is not None:
        rs = cfg.rope_scaling
        scaling = {
            "rope_type": "llama3",
            "factor": float(rs.factor),
            "low_freq_factor": float(rs.low_freq_factor),
            "high_freq_factor": float(rs.high_freq_factor),
            "original_max_position_embeddings": int(rs.original_max_position_embeddings),
        }
        rp = {**scaling, "rope_theta": float(cfg.rope_theta)}
    eos = getattr(tokenizer, "eos_ids", None) or getattr(tokenizer, "eos_id", None)
    if isinstance(eos, (tuple, list)):
        eos = int(eos[0]) if len(eos) == 1 else [int(e) for e in eos]
    bos, pad = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "pad_id", None)
    max_pos = cfg.max_position_embeddings or _DEFAULTS[fam]["max_position_embeddings"]
    out: dict[str, Any] = {
        "architectures": [ARCHITECTURES[fam]],
        "model_type": fam,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.dim_head,
        "hidden_act": "silu",
        "max_position_embeddings": int(max_pos),
        "rms_norm_eps": float(cfg.rms_eps),
        "tie_word_embeddings": bool(cfg.tie_embeddings),
        "rope_theta": float(cfg.rope_theta),
        "rope_scaling": scaling,
        "rope_parameters": rp,
        "attention_dropout": 0.0,
        "initializer_range": float(cfg.init_std),
        "use_cache": True,
        "bos_token_id": None if bos is None else int(bos),
        "eos_token_id": eos if eos is None or isinstance(eos, list) else int(eos),
        "pad_token_id": None if pad is None else int(pad),
        "dtype": dtype,
        "torch_dtype": dtype,
    }
    if fam in ("llama", "qwen3"):
        out["attention_bias"] = bool(cfg.qkv_bias)
    if fam == "llama":
        out["mlp_bias"] = False
    else:
        out.update(
            use_sliding_window=False,
            sliding_window=None,
            max_window_layers=cfg.n_layers,
            layer_types=["full_attention"] * cfg.n_layers,
        )
    return out


# ----------------------------------------------------------------------------------------------------------
# tensor names


def _layer_map(cfg: tfm.TransformerConfig) -> list[tuple[str, tuple[str, ...], bool, tuple[int, ...]]]:
    """(HF name template with {i}, grpo_jax leaf path under "layers", transpose, grpo_jax per-layer shape)."""
    d, f, h, k, dh = cfg.d_model, cfg.d_ff, cfg.n_heads, cfg.n_kv_heads, cfg.dim_head
    a, m = "model.layers.{i}.self_attn.", "model.layers.{i}.mlp."
    out = [
        ("model.layers.{i}.input_layernorm.weight", ("attn_norm",), False, (d,)),
        ("model.layers.{i}.post_attention_layernorm.weight", ("mlp_norm",), False, (d,)),
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


def _top_map(cfg: tfm.TransformerConfig) -> list[tuple[str, tuple[str, ...], bool, tuple[int, ...]]]:
    out = [
        ("model.embed_tokens.weight", ("embed",), False, (cfg.vocab_size, cfg.d_model)),
        ("model.norm.weight", ("final_norm",), False, (cfg.d_model,)),
    ]
    if not cfg.tie_embeddings:
        out.append(("lm_head.weight", ("lm_head",), True, (cfg.d_model, cfg.vocab_size)))
    return out


def _get(tree, path):
    for p in path:
        if tree is None:
            return None
        tree = tree.get(p) if isinstance(tree, dict) else getattr(tree, p, None)
    return tree


def _set(tree: dict, path, value):
    for p in path[:-1]:
        tree = tree.setdefault(p, {})
    tree[path[-1]] = value


# ----------------------------------------------------------------------------------------------------------
# load


def _open_tensors(path: str) -> dict[str, np.ndarray]:
    """{name: memmap} over model.safetensors or the shards of model.safetensors.index.json."""
    index = os.path.join(path, "model.safetensors.index.json")
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(index):
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise CheckpointError(f"{index}: no 'weight_map' {{tensor: shard file}}")
        tensors: dict[str, np.ndarray] = {}
        for shard in sorted(set(weight_map.values())):
            sp = os.path.join(path, shard)
            if not os.path.exists(sp):
                raise CheckpointError(f"{index}: shard {shard!r} is missing from {path}")
            part = safetensors_io.read(sp)
            for name, arr in part.items():
                if name in tensors:
                    raise CheckpointError(f"{sp}: tensor {name!r} is also in another shard")
                tensors[name] = arr
            wanted = {n for n, s in weight_map.items() if s == shard}
            lost = sorted(wanted - set(part))
            if lost:
                raise CheckpointError(f"{sp}: tensors {lost[:5]} listed in the index are not in this shard")
        return tensors
    if os.path.exists(single):
        return safetensors_io.read(single)
    found = sorted(os.listdir(path)) if os.path.isdir(path) else "not a directory"
    raise CheckpointError(
        f"{path}: no model.safetensors or model.safetensors.index.json (found: {found}); only safetensors "
        "checkpoints are read (convert pytorch_model.bin with transformers' save_pretrained)"
    )


def _read_json(file: str) -> dict:
    """The JSON object of `file`; CheckpointError naming it when it is not valid JSON or not an object."""
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{file}: a JSON {type(data).__name__}, not an object")
    return data


def _dtype_name(dtype) -> str | None:
    if dtype is None:
        return None
    name = jnp.dtype(dtype).name
    if name not in _DTYPES:
        raise ValueError(f"load_hf/save_hf dtype={dtype!r}: valid: None, {', '.join(_DTYPES)}")
    return name


def load_hf(path: str, dtype=None, *, shardings: Any = None) -> tuple[tfm.TransformerConfig, dict]:
    """(TransformerConfig, params) of a local Hugging Face checkpoint directory (llama / qwen2 / qwen3).

    path: a directory with config.json and model.safetensors or model.safetensors.index.json + shards
    (float32 / bfloat16 / float16 tensors). dtype: the params' dtype; None keeps the file's (float32 when
    the file mixes dtypes), like transformers 5.x `dtype="auto"`. cfg.param_dtype is set to it; compute_dtype
    stays "float32" (use dataclasses.replace for compute_dtype / remat, which do not change the params).
    shardings: optional pytree of jax.sharding.Sharding matching the params (a missing leaf or None: the
    default device); each leaf is placed straight into its sharding.

    Tensors are memory-mapped and each is read once, into its stacked [L, ...] host buffer, then placed."""
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        raise CheckpointError(
            f"{path}: no config.json (valid: a Hugging Face checkpoint directory with config.json and "
            "model.safetensors or model.safetensors.index.json + shards)"
        )
    hf = _read_json(cfg_file)
    tensors = _open_tensors(path)
    target = _dtype_name(dtype)
    if target is None:
        kinds = {a.dtype.name for a in tensors.values()} & set(_DTYPES)
        target = kinds.pop() if len(kinds) == 1 else "float32"
    cfg = config_from_hf(hf, param_dtype=target, file=cfg_file)
    np_dt = jnp.dtype(target)

    def check(name, arr, shape, transpose):
        if arr.dtype.name not in _DTYPES:
            raise CheckpointError(
                f"{path}: tensor {name!r} has dtype {arr.dtype.name} (valid: {', '.join(_DTYPES)})"
            )
        hf_shape = tuple(reversed(shape)) if transpose else tuple(shape)
        if tuple(arr.shape) != hf_shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {tuple(arr.shape)}, config.json implies {hf_shape}"
            )

    def need(name):
        if name not in tensors:
            raise CheckpointError(
                f"{path}: tensor {name!r} is missing (config.json: model_type={cfg.family})"
            )
        return tensors[name]

    def place(leaf_path, host):
        sh = _get(shardings, leaf_path) if shardings is not None else None
        return jax.device_put(host, sh) if sh is not None else jnp.asarray(host)

    used: set[str] = set()
    params: dict = {}
    for name, leaf, transpose, shape in _top_map(cfg):
        arr = need(name)
        check(name, arr, shape, transpose)
        used.add(name)
        host = np.asarray(arr.T if transpose else arr).astype(np_dt)
        _set(params, leaf, place(leaf, host))
    for tmpl, leaf, transpose, shape in _layer_map(cfg):
        host = np.empty((cfg.n_layers, *shape), np_dt)
        for i in range(cfg.n_layers):
            name = tmpl.format(i=i)
            arr = need(name)
            check(name, arr, shape, transpose)
            used.add(name)
            host[i] = arr.T if transpose else arr
        _set(params, ("layers", *leaf), place(("layers", *leaf), host))
        del host
    extra = sorted(
        n
        for n in tensors
        if n not in used
        and not _IGNORED_TENSOR.fullmatch(n)
        and not (cfg.tie_embeddings and n == "lm_head.weight")
    )
    if extra:
        raise CheckpointError(
            f"{path}: unexpected tensors {extra[:5]}{' ...' if len(extra) > 5 else ''} ({len(extra)}) for "
            f"model_type={cfg.family} with this config.json"
        )
    return cfg, params


# ----------------------------------------------------------------------------------------------------------
# save


def fold_merged(params: dict) -> dict:
    """params with LoRA adapters attached by lora.merge (lora_a / lora_b / lora_scale beside a kernel) folded
    into the kernel: W + A B scale (the function lora.merge computes), no adapter leaves left."""
    layers = dict(params["layers"])
    for name, p in layers.items():
        if isinstance(p, dict) and "lora_a" in p:
            w = p["kernel"]
            delta = jnp.einsum("lir,lro->lio", p["lora_a"], p["lora_b"]) * p["lora_scale"][:, None, None]
            rest = {k: v for k, v in p.items() if k not in ("lora_a", "lora_b", "lora_scale")}
            layers[name] = {**rest, "kernel": (w.astype(jnp.float32) + delta).astype(w.dtype)}
    return {**params, "layers": layers}


def save_hf(
    path: str,
    cfg: tfm.TransformerConfig,
    params: dict,
    tokenizer: Any = None,
    *,
    adapters: dict | None = None,
    lora_alpha: float = 16.0,
    dtype=None,
    overwrite: bool = False,
) -> str:
    """Write a Hugging Face checkpoint directory that `AutoModelForCausalLM.from_pretrained(path)` loads with
    the same logits: config.json (`config_to_hf`), model.safetensors (HF names, [out, in] Linear weights) and,
    if `tokenizer` has a `save(path)` method, the tokenizer files it writes.

    adapters: LoRA adapters (lora.init layout) folded into the kernels first (lora.fold, alpha=lora_alpha);
    params already merged with lora.merge are folded too (`fold_merged`). dtype: of the written tensors (None:
    the params' dtype, float32 if they mix dtypes). Written into a temporary sibling directory and renamed,
    so an interrupted save leaves nothing at `path`; an existing `path` is replaced only with overwrite=True.
    Returns path."""
    if cfg.value_head:
        raise ValueError(
            "save_hf: TransformerConfig.value_head=True: a value head has no Hugging Face causal-LM "
            "counterpart; export dataclasses.replace(cfg, value_head=False) with params lacking 'value_head'"
        )
    fam = infer_family(cfg)
    if adapters is not None:
        params = lora.fold(params, adapters, alpha=lora_alpha)
    params = fold_merged(params)
    name = _dtype_name(dtype)
    if name is None:
        kinds = {jnp.dtype(x.dtype).name for x in jax.tree.leaves(params)}
        name = kinds.pop() if len(kinds) == 1 and kinds <= set(_DTYPES) else "float32"
    np_dt = jnp.dtype(name)
    path = os.path.abspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"save_hf: {path} exists; pass overwrite=True to replace it")

    tensors: dict[str, np.ndarray] = {}
    for hf_name, leaf, transpose, shape in _top_map(cfg):
        a = np.asarray(jax.device_get(_get(params, leaf)))
        if tuple(a.shape) != shape:
            raise ValueError(f"save_hf: params{list(leaf)} has shape {a.shape}, cfg implies {shape}")
        tensors[hf_name] = np.ascontiguousarray((a.T if transpose else a).astype(np_dt))
    for tmpl, leaf, transpose, shape in _layer_map(cfg):
        x = _get(params["layers"], leaf)
        if x is None:
            raise ValueError(f"save_hf: params['layers']{list(leaf)} is missing (cfg needs it)")
        a = np.asarray(jax.device_get(x))
        if tuple(a.shape) != (cfg.n_layers, *shape):
            raise ValueError(
                f"save_hf: params['layers']{list(leaf)} has shape {a.shape}, "
                f"cfg implies {(cfg.n_layers, *shape)}"
            )
        for i in range(cfg.n_layers):
            tensors[tmpl.format(i=i)] = np.ascontiguousarray((a[i].T if transpose else a[i]).astype(np_dt))

    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        hf = config_to_hf(dataclasses.replace(cfg, family=fam), dtype=name, tokenizer=tokenizer)
        with open(os.path.join(tmp, "config.json"), "w") as fh:
            json.dump(hf, fh, indent=2, sort_keys=True)
            fh.write("\n")
        safetensors_io.write(os.path.join(tmp, "model.safetensors"), tensors, {"format": "pt"})
        if tokenizer is not None and callable(getattr(tokenizer, "save", None)):
            tokenizer.save(tmp)
        if tokenizer is not None:  # generate() / vLLM stop at every end-of-generation id of the tokenizer
            gen = {"eos_token_id": list(getattr(tokenizer, "eos_ids", None) or [tokenizer.eos_id])}
            for key, attr in (("bos_token_id", "bos_id"), ("pad_token_id", "pad_id")):
                if getattr(tokenizer, attr, None) is not None:
                    gen[key] = int(getattr(tokenizer, attr))
            with open(os.path.join(tmp, "generation_config.json"), "w") as fh:
                json.dump(gen, fh, indent=2, sort_keys=True)
                fh.write("\n")
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _replace_dir(tmp: str, path: str) -> None:
    """Move the finished directory `tmp` to `path` (an existing `path` is moved aside first, then deleted)."""
    if os.path.exists(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.old-", dir=os.path.dirname(path))
        os.rename(path, os.path.join(old, "x"))
        os.rename(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, path)


def save_peft_adapters(
    path: str,
    cfg: tfm.TransformerConfig,
    adapters: dict,
    *,
    lora_alpha: float = 16.0,
    base_model_name_or_path: str | None = None,
    overwrite: bool = False,
) -> str:
    """Write LoRA adapters (lora.init layout: A [L, in, r], B [L, r, out]) in PEFT's format:
    adapter_config.json + adapter_model.safetensors with names
    base_model.model.model.layers.{i}.{self_attn|mlp}.{proj}.lora_{A,B}.weight, A as [r, in] and B as
    [out, r] (torch Linear layout). PEFT's LoRA computes W x + B A x * lora_alpha / r (use_rslora=False),
    the same function as lora.merge(params, adapters, alpha=lora_alpha). Atomic like save_hf."""
    infer_family(cfg)
    targets = list(adapters["layers"])
    bad = [t for t in targets if t not in lora.TARGETS]
    if bad:
        raise ValueError(f"save_peft_adapters: adapters for {bad} are not projections; valid: {lora.TARGETS}")
    rank = int(adapters["layers"][targets[0]]["lora_a"].shape[-1])
    tensors: dict[str, np.ndarray] = {}
    for name in targets:
        a = np.asarray(jax.device_get(adapters["layers"][name]["lora_a"]), np.float32)  # [L, in, r]
        b = np.asarray(jax.device_get(adapters["layers"][name]["lora_b"]), np.float32)  # [L, r, out]
        block = "mlp" if name in ("gate_proj", "up_proj", "down_proj") else "self_attn"
        for i in range(a.shape[0]):
            pre = f"base_model.model.model.layers.{i}.{block}.{name}"
            tensors[pre + ".lora_A.weight"] = np.ascontiguousarray(a[i].T)
            tensors[pre + ".lora_B.weight"] = np.ascontiguousarray(b[i].T)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": float(lora_alpha),
        "lora_dropout": 0.0,
        "target_modules": sorted(targets),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "inference_mode": True,
        "base_model_name_or_path": base_model_name_or_path,
    }
    path = os.path.abspath(path)
    if os.path.exists(path) and not overwrite:
        raise FileExistsError(f"save_peft_adapters: {path} exists; pass overwrite=True to replace it")
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.tmp-", dir=parent)
    try:
        with open(os.path.join(tmp, "adapter_config.json"), "w") as fh:
            json.dump(adapter_config, fh, indent=2, sort_keys=True)
            fh.write("\n")
        safetensors_io.write(os.path.join(tmp, "adapter_model.safetensors"), tensors, {"format": "pt"})
        _replace_dir(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path
