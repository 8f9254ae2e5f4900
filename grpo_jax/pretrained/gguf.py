"""Load a llama.cpp GGUF checkpoint (architectures `llama` and `qwen2`) into grpo_jax's transformer layout.

    cfg, params = load_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")          # float32 (or dtype="bfloat16")
    logits, _ = grpo_jax.policies.transformer.forward(params, cfg, tokens, mask)

Host side, numpy only (the `gguf` package reads and dequantizes); the returned leaves are jax arrays.

Where each rule comes from:

* Metadata keys are llama.cpp's (gguf-py `gguf/constants.py` `Keys.LLM` / `Keys.Attention` / `Keys.Rope`),
  read as transformers' GGUF loader maps them onto a HF config (transformers/integrations/ggml.py
  `GGUF_CONFIG_MAPPING`): `{arch}.block_count` -> n_layers, `.embedding_length` -> d_model,
  `.feed_forward_length` -> d_ff, `.attention.head_count` / `.head_count_kv` -> n_heads / n_kv_heads,
  `.rope.freq_base` -> rope_theta, `.attention.layer_norm_rms_epsilon` -> rms_eps. The head dim is
  `.attention.key_length` when present, else `.rope.dimension_count` (transformers maps that to head_dim for
  llama), else d_model // n_heads. Absent `head_count_kv` means no GQA and absent `rope.freq_base` means
  10000 (llama.cpp `llama_model::load_hparams` defaults).
* Tied embeddings <=> there is no `output.weight` tensor (transformers `load_gguf_checkpoint`:
  `tie_word_embeddings = all(tensor.name != "output.weight" ...)`; llama.cpp falls back to `token_embd`).
* The vocabulary of the MODEL is the embedding's row count (`token_embd.weight`); the token list
  (`tokenizer.ggml.tokens`) may be shorter (padded embeddings) but never longer. The tokenizer keeps its own
  count (grpo_jax.tokenization).
* Tensor layout: GGUF lists dims fastest-first (`ne`), so a [in, out] `ne` is the row-major numpy array
  (out, in), i.e. torch's nn.Linear [out, in]; grpo_jax kernels are [in, out], hence one transpose. The
  embedding stays (V, D). `gguf.quants.dequantize` turns every block format (Q4_0/Q4_1/Q8_0/K-quants/...)
  into float32 of that numpy shape.
* llama.cpp's converter permutes the rows of `attn_q` / `attn_k` (weight and bias) of `llama` models from
  HF's rotate-half RoPE layout to GGML's interleaved one (convert_hf_to_gguf.py `LlamaModel.permute`:
  `w.reshape(n, 2, rows // n // 2, cols).swapaxes(1, 2)`, n = n_heads for q, n_kv_heads for k). We undo it
  exactly as transformers does (modeling_gguf_pytorch_utils.py
  `LlamaTensorProcessor._reverse_permute_weights`):
  `w.reshape(n, rows // n // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)`. `qwen2` models are converted
  by llama.cpp's `Qwen2Model` (no permutation) and transformers registers no processor for them, so their
  rows are taken as stored.
* Anything the transformer cannot express -- another architecture, RoPE scaling (`{arch}.rope.scaling.type`
  other than none/linear-with-factor-1, or a llama3 `rope_freqs.weight` tensor), partial rotary, an unknown
  tensor, an unsupported quantization type -- raises one ValueError naming the file, the field or tensor
  and the valid values, rather than loading a model that computes something else.
"""

from __future__ import annotations

import os
import re
from typing import Any

import numpy as np

from grpo_jax.policies import families
from grpo_jax.policies.transformer import TransformerConfig
from grpo_jax.tokenization.gguf_file import field_value, open_gguf

# general.architecture values read here: the families that declare one (Family.gguf_architecture)
_GGUF_FAMILIES = families.gguf_families()
SUPPORTED_ARCHITECTURES = tuple(_GGUF_FAMILIES)
# architectures whose q/k rows llama.cpp permutes (convert_hf_to_gguf.py: LlamaModel and its subclasses that
# keep `undo_permute`; transformers TENSOR_PROCESSORS["llama"]): Family.gguf_permuted_qk
_PERMUTED_QK = tuple(a for a, f in _GGUF_FAMILIES.items() if f.gguf_permuted_qk)

# GGUF tensor name -> (our layer leaf, kind); kind "w" = weight [out, in] -> kernel [in, out]
_LAYER_TENSORS = {
    "attn_norm.weight": ("attn_norm", "norm"),
    "ffn_norm.weight": ("mlp_norm", "norm"),
    "attn_q.weight": ("q_proj", "kernel"),
    "attn_k.weight": ("k_proj", "kernel"),
    "attn_v.weight": ("v_proj", "kernel"),
    "attn_output.weight": ("o_proj", "kernel"),
    "ffn_gate.weight": ("gate_proj", "kernel"),
    "ffn_up.weight": ("up_proj", "kernel"),
    "ffn_down.weight": ("down_proj", "kernel"),
    "attn_q.bias": ("q_proj", "bias"),
    "attn_k.bias": ("k_proj", "bias"),
    "attn_v.bias": ("v_proj", "bias"),
}
_BLK = re.compile(r"blk\.(\d+)\.(.+)")
_DTYPES = ("float32", "bfloat16")


def _fail(path: str, what: str) -> ValueError:
    return ValueError(f"{path}: {what}")


def _f32(value) -> float:
    """A float32 metadata value as the shortest decimal that rounds to it (1e-05, not 9.999999747378752e-06):
    the value the converter wrote, so configs compare equal to ones read from a HF config.json."""
    return float(str(np.float32(value)))


def _number(path: str, key: str, value: Any, kind: type = int):
    """int / float of a metadata value, or one ValueError naming the file and the field."""
    if isinstance(value, bool) or not isinstance(value, int if kind is int else (int, float)):
        valid = "an integer" if kind is int else "a number"
        raise _fail(path, f"metadata field {key!r}={value!r} (valid: {valid})")
    return kind(value)


def read_config(reader, path: str, dtype: str = "float32") -> TransformerConfig:
    """The TransformerConfig a GGUF describes (see the module docstring for the key mapping); one ValueError
    naming the file and the field for metadata it cannot hold."""
    try:
        return _read_config(reader, path, dtype)
    except ValueError as e:
        if str(e).startswith(f"{path}: "):
            raise
        raise _fail(path, f"the metadata describe no valid model ({e})") from None


def _read_config(reader, path: str, dtype: str) -> TransformerConfig:
    def num(key: str, default: Any = None, kind: type = int):
        value = field_value(reader, key, default)
        if value is None:
            raise _fail(path, f"metadata field {key!r} is missing (required to build the transformer config)")
        return _number(path, key, value, kind)

    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise _fail(
            path,
            f"general.architecture={arch!r} is not supported (valid: {', '.join(SUPPORTED_ARCHITECTURES)})",
        )
    n_layers = num(f"{arch}.block_count")
    d_model = num(f"{arch}.embedding_length")
    d_ff = num(f"{arch}.feed_forward_length")
    n_heads = num(f"{arch}.attention.head_count")
    if n_heads <= 0:
        raise _fail(path, f"metadata field '{arch}.attention.head_count'={n_heads} (valid: an integer > 0)")
    n_kv_heads = num(f"{arch}.attention.head_count_kv", n_heads)
    rms_eps = _f32(num(f"{arch}.attention.layer_norm_rms_epsilon", kind=float))
    rope_theta = _f32(num(f"{arch}.rope.freq_base", 10000.0, float))
    opt = {k: field_value(reader, f"{arch}.{k}") for k in ("attention.key_length", "attention.value_length")}
    opt["rope.dimension_count"] = field_value(reader, f"{arch}.rope.dimension_count")
    key_len, value_len, rot_dim = (
        None if v is None else _number(path, f"{arch}.{k}", v) for k, v in opt.items()
    )
    head_dim = key_len if key_len is not None else rot_dim if rot_dim is not None else d_model // n_heads
    if value_len is not None and int(value_len) != head_dim:
        raise _fail(
            path,
            f"{arch}.attention.value_length={value_len} differs from the key length {head_dim} "
            "(valid: equal key and value head dims)",
        )
    if rot_dim is not None and int(rot_dim) != head_dim:
        raise _fail(
            path,
            f"{arch}.rope.dimension_count={rot_dim} differs from the head dim {head_dim}: partial rotary "
            "embeddings are not supported (valid: rope.dimension_count == head dim)",
        )
    scaling = field_value(reader, f"{arch}.rope.scaling.type")
    factor = num(f"{arch}.rope.scaling.factor", 1.0, float)
    if scaling not in (None, "none") and not (scaling == "linear" and float(factor) == 1.0):
        raise _fail(
            path,
            f"{arch}.rope.scaling.type={scaling!r} (factor {factor}) is not supported "
            "(valid: absent, 'none', or 'linear' with factor 1)",
        )
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise _fail(path, "tensor 'rope_freqs.weight' (llama3-style RoPE frequency scaling) is not supported")
    embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise _fail(path, "tensor 'token_embd.weight' is missing")
    vocab_size = int(embd.shape[1])  # ne = [D, V]
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and len(tokens) > vocab_size:
        raise _fail(
            path,
            f"tokenizer.ggml.tokens has {len(tokens)} tokens but token_embd.weight has only "
            f"{vocab_size} rows "
            "(valid: tokens <= embedding rows)",
        )
    qkv_bias = "blk.0.attn_q.bias" in names
    return TransformerConfig(
        vocab_size=vocab_size,
        d_model=d_model,
        n_layers=n_layers,
        n_heads=n_heads,
        n_kv_heads=n_kv_heads,
        d_ff=d_ff,
        head_dim=head_dim,
        rope_theta=rope_theta,
        rms_eps=rms_eps,
        qkv_bias=qkv_bias,
        tie_embeddings="output.weight" not in names,
        param_dtype=dtype,
    )


def unpermute_qk(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's q/k row permutation (rows = n_heads * head_dim; `w` is [rows] or [rows, cols]).

    llama.cpp stores each head's rows as interleaved pairs (GGML's RoPE rotates adjacent dims); HF's
    rotate-half layout (and ours) pairs dim i with i + head_dim/2."""
    rows = w.shape[0]
    if rows % (2 * n_heads):
        raise ValueError(f"unpermute_qk: {rows} rows are not divisible by 2 * n_heads = {2 * n_heads}")
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _dequantize(t, path: str) -> np.ndarray:
    from gguf import quants

    try:
        return quants.dequantize(t.data, t.tensor_type)
    except NotImplementedError:
        valid = ["F32", "F16"] + sorted(q.name for q in quants._type_traits)
        raise _fail(
            path,
            f"tensor {t.name!r} has type {t.tensor_type.name}, which gguf {_gguf_version()} cannot "
            "dequantize "
            f"(valid: {', '.join(valid)})",
        ) from None


def _gguf_version() -> str:
    from importlib.metadata import version

    try:
        return version("gguf")
    except Exception:  # pragma: no cover - metadata missing in an odd install
        return "?"


def load_gguf(path: str | os.PathLike, dtype: str = "float32") -> tuple[TransformerConfig, dict]:
    """(TransformerConfig, params) of a `llama` / `qwen2` GGUF file, every tensor dequantized to `dtype`.

    dtype: "float32" (default) or "bfloat16"; it becomes cfg.param_dtype (compute_dtype stays float32: set it
    with dataclasses.replace for accelerators). Each tensor is dequantized one at a time and written straight
    into the preallocated stacked [L, ...] arrays, so peak host memory is about one copy of the model plus one
    float32 tensor. Prints nothing."""
    import jax.numpy as jnp

    path = os.fspath(path)
    if dtype not in _DTYPES:
        raise ValueError(f"load_gguf: dtype={dtype!r} is not supported (valid: {', '.join(_DTYPES)})")
    np_dtype = np.dtype(jnp.dtype(dtype))
    reader = open_gguf(path)
    cfg = read_config(reader, path, dtype)
    arch = field_value(reader, "general.architecture")
    n, d, f, dh = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.dim_head
    hq, hk = cfg.n_heads * dh, cfg.n_kv_heads * dh

    # expected numpy shapes of the GGUF tensors ([out, in] for matrices)
    shapes = {
        "attn_norm.weight": (d,),
        "ffn_norm.weight": (d,),
        "attn_q.weight": (hq, d),
        "attn_k.weight": (hk, d),
        "attn_v.weight": (hk, d),
        "attn_output.weight": (d, hq),
        "ffn_gate.weight": (f, d),
        "ffn_up.weight": (f, d),
        "ffn_down.weight": (d, f),
        "attn_q.bias": (hq,),
        "attn_k.bias": (hk,),
        "attn_v.bias": (hk,),
    }
    layers: dict[str, Any] = {"attn_norm": np.empty((n, d), np_dtype), "mlp_norm": np.empty((n, d), np_dtype)}
    for gname, (leaf, kind) in _LAYER_TENSORS.items():
        if kind == "kernel":
            out_dim, in_dim = shapes[gname]
            layers[leaf] = {"kernel": np.empty((n, in_dim, out_dim), np_dtype)}
    if cfg.qkv_bias:
        for leaf, rows in (("q_proj", hq), ("k_proj", hk), ("v_proj", hk)):
            layers[leaf]["bias"] = np.empty((n, rows), np_dtype)
    params: dict[str, Any] = {"layers": layers}
    expected = {f"blk.{i}.{g}" for i in range(n) for g in _LAYER_TENSORS if cfg.qkv_bias or "bias" not in g}
    expected |= {"token_embd.weight", "output_norm.weight"} | (
        set() if cfg.tie_embeddings else {"output.weight"}
    )
    seen: set[str] = set()

    for t in reader.tensors:
        name = t.name
        if name not in expected:
            m = _BLK.fullmatch(name)
            hint = (
                f"valid per-layer tensors: {', '.join(g for g in _LAYER_TENSORS)} for blk.0..blk.{n - 1}"
                if m
                else "valid: token_embd.weight, output_norm.weight, output.weight, blk.N.*"
            )
            raise _fail(path, f"unexpected tensor {name!r} for a {arch} model ({hint})")
        seen.add(name)
        w = _dequantize(t, path)
        want: tuple[int, ...]
        m = _BLK.fullmatch(name)
        if name == "token_embd.weight" or name == "output.weight":
            want = (cfg.vocab_size, d)
        elif name == "output_norm.weight":
            want = (d,)
        elif m is None:  # (the name was checked against the expected tensors above)
            raise _fail(path, f"unexpected tensor {name!r}")
        else:
            want = shapes[m.group(2)]
        if tuple(w.shape) != want:
            raise _fail(
                path, f"tensor {name!r} has shape {tuple(w.shape)}, expected {want} from the metadata"
            )
        if name == "token_embd.weight":
            params["embed"] = w.astype(np_dtype)
        elif name == "output.weight":
            params["lm_head"] = np.ascontiguousarray(w.T, dtype=np_dtype)
        elif name == "output_norm.weight":
            params["final_norm"] = w.astype(np_dtype)
        elif m is not None:
            i, g = int(m.group(1)), m.group(2)
            leaf, kind = _LAYER_TENSORS[g]
            if arch in _PERMUTED_QK and g.startswith(("attn_q.", "attn_k.")):
                w = unpermute_qk(w, cfg.n_heads if g.startswith("attn_q.") else cfg.n_kv_heads)
            if kind == "norm":
                layers[leaf][i] = w
            elif kind == "kernel":
                layers[leaf]["kernel"][i] = w.T
            else:
                layers[leaf]["bias"][i] = w
        del w
    missing = sorted(expected - seen, key=lambda s: (len(s), s))
    if missing:
        more = f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""
        raise _fail(path, f"missing tensors {missing[:5]}{more}")

    import jax

    return cfg, jax.tree.map(jnp.asarray, params)
