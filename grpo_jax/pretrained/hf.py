"""Hugging Face checkpoints in and out of grpo_jax's transformer (the families of
grpo_jax.policies.families: llama, qwen2, qwen3, mistral, smollm3, gemma2, gemma3_text).

    cfg, params = load_hf("path/to/Qwen2.5-0.5B")          # config.json + model.safetensors (or sharded)
    logits, _ = transformer.forward(params, cfg, tokens, mask)
    save_hf("out/", cfg, params, tokenizer)                 # AutoModelForCausalLM.from_pretrained("out/")

Every architectural fact comes from config.json, read exactly as transformers 5.x reads it: the shape fields
here, the rest by the family module of its `model_type` (its configuration class's defaults for omitted keys,
its RoPE, biases, attention and MLP kinds). What the model cannot represent is refused with one
`HFConfigError` (a grpo_jax.errors.ConfigError, so a ValueError) naming the config.json field and its value:
e.g. Qwen's sliding window in use, MLP biases, RoPE types other than default / llama3, partial rotary,
activations the family's MLP does not have, MoE, quantized weights, other model_types. A missing, unexpected
or mis-shaped tensor, or one of a non-float dtype, is a `CheckpointError` naming the tensor; a config.json or
index that is not a JSON object, or a field of the wrong JSON type, names the file (and the field).

Family differences: the module docstrings of grpo_jax/policies/families/*.py and docs/MODEL_FAMILIES.md.

Weights: HF Linear stores [out, in]; grpo_jax stores kernels [in, out] stacked over layers on axis 0. The
tensor names are the family's (Family.layer_tensors / top_tensors).
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

from grpo_jax.policies import families, lora
from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.families.base import (
    CheckpointError,
    ConfigReader,
    HFConfigError,
    TensorSpec,
    rope_to_hf,
)
from grpo_jax.pretrained import safetensors_io

FAMILIES = families.FAMILIES

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
    "sliding_window": "sliding_window",
    "layer_types": "layer_types",
    "no_rope_layers": "no_rope_layers",
    "rope_local_theta": "rope_local_base_freq",
    "query_pre_attn_scalar": "query_pre_attn_scalar",
    "attn_softcap": "attn_logit_softcapping",
    "final_softcap": "final_logit_softcapping",
}


# ----------------------------------------------------------------------------------------------------------
# config.json <-> TransformerConfig


def config_from_hf(
    hf: dict, *, param_dtype: str = "float32", file: str = "config.json"
) -> tfm.TransformerConfig:
    """The TransformerConfig of a Hugging Face config.json dict (a model_type of FAMILIES), or HFConfigError
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


def _config_from_hf(hf: dict, param_dtype: str, file: str) -> tfm.TransformerConfig:
    mt = hf.get("model_type")
    fam = families.find(mt)
    if fam is None:
        raise HFConfigError(
            file,
            "model_type",
            mt,
            f"valid: {', '.join(FAMILIES)} (dense decoders; MoE and other families are not representable)",
        )
    r = ConfigReader(hf, fam, file)
    if hf.get("quantization_config"):
        r.refuse(
            "quantization_config",
            hf["quantization_config"].get("quant_method", "?"),
            "quantized weights are not readable; use an unquantized (float) checkpoint",
        )
    for k in _MOE_KEYS:
        if hf.get(k):
            r.refuse(k, hf[k], "mixture-of-experts MLPs are not representable (dense only)")
    n_layers, max_pos = r.num("num_hidden_layers"), r.num("max_position_embeddings")
    extra = fam.read(r, n_layers=n_layers, max_pos=max_pos)
    d_model, n_heads = r.num("hidden_size"), r.num("num_attention_heads")
    n_kv = n_heads if r.get("num_key_value_heads") is None else r.num("num_key_value_heads")
    head_dim = None if r.get("head_dim") is None else r.num("head_dim")
    head_dim = None if head_dim is None or head_dim * n_heads == d_model else head_dim
    try:
        return tfm.TransformerConfig(
            vocab_size=r.num("vocab_size"),
            d_model=d_model,
            n_layers=n_layers,
            n_heads=n_heads,
            n_kv_heads=n_kv,
            d_ff=r.num("intermediate_size"),
            head_dim=head_dim,
            rms_eps=r.num("rms_norm_eps", float),
            tie_embeddings=bool(r.get("tie_word_embeddings")),
            param_dtype=param_dtype,
            max_position_embeddings=max_pos,
            family=mt,
            init_std=float(hf.get("initializer_range", 0.02)),
            **extra,
        )
    except ValueError as e:
        m = re.match(r"TransformerConfig\.(\w+)=", str(e))
        field = _HF_NAME.get(m.group(1), m.group(1)) if m else "config"
        raise HFConfigError(file, field, hf.get(field), f"not a valid model: {e}") from e


def infer_family(cfg: tfm.TransformerConfig) -> str:
    """cfg.family, else the HF family that represents cfg (families.infer: the first of FAMILIES whose
    check accepts it: qwen3 for a q/k norm, qwen2 for q/k/v biases without an o bias, llama for none or all,
    the later families for their fields); ValueError when none does."""
    return families.infer(cfg).model_type


def config_to_hf(cfg: tfm.TransformerConfig, *, dtype: str = "float32", tokenizer: Any = None) -> dict:
    """The config.json dict transformers reads back as the same architecture (see `config_from_hf`).

    config_from_hf(config_to_hf(cfg)) == cfg up to the fields config.json does not hold (compute_dtype, remat,
    value_head) and max_position_embeddings=None, written as the family's default.

    The common keys are written here, the family's own by its Family.write. RoPE is written both ways:
    `rope_parameters` (transformers 5.x) and top-level rope_theta / `rope_scaling` (4.x and the hub
    convention). bos/eos/pad ids are the tokenizer's (`bos_id`, `eos_ids`/`eos_id`, `pad_id`) or null."""
    fam = families.infer(cfg)
    rp, scaling = rope_to_hf(cfg.rope_theta, cfg.rope_scaling)
    eos = getattr(tokenizer, "eos_ids", None) or getattr(tokenizer, "eos_id", None)
    if isinstance(eos, (tuple, list)):
        eos = int(eos[0]) if len(eos) == 1 else [int(e) for e in eos]
    bos, pad = getattr(tokenizer, "bos_id", None), getattr(tokenizer, "pad_id", None)
    max_pos = cfg.max_position_embeddings or fam.defaults["max_position_embeddings"]
    out: dict[str, Any] = {
        "architectures": [fam.architecture],
        "model_type": fam.model_type,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.d_ff,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.dim_head,
        fam.activation_key: {"silu": "silu", "gelu_tanh": "gelu_pytorch_tanh"}[cfg.mlp_act],
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
    out.update(fam.write(cfg))
    return out


# ----------------------------------------------------------------------------------------------------------
# tensor names


def _layer_map(cfg: tfm.TransformerConfig) -> list[TensorSpec]:
    """(HF name template with {i}, grpo_jax leaf path under "layers", transpose, grpo_jax per-layer shape)."""
    return families.infer(cfg).layer_tensors(cfg)


def _top_map(cfg: tfm.TransformerConfig) -> list[TensorSpec]:
    return families.infer(cfg).top_tensors(cfg)


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
    """(TransformerConfig, params) of a local Hugging Face checkpoint directory (a family of FAMILIES).

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
            gen: dict[str, Any] = {
                "eos_token_id": list(getattr(tokenizer, "eos_ids", None) or [tokenizer.eos_id])
            }
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
