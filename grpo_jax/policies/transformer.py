"""Decoder-only transformer LM (Llama / Qwen2 / Qwen3 / Mistral / SmolLM3 / Gemma 2 / Gemma 3), as pure
functions over a parameter pytree.

Architecture (Qwen2 = Llama + q/k/v bias): token embedding -> L x [RMSNorm -> GQA self-attention with RoPE
-> residual -> RMSNorm -> SwiGLU MLP -> residual] -> RMSNorm -> LM head (tied to the embedding or untied),
plus an optional scalar value head on the final hidden state (for PPO). Options for real checkpoints (all off
by default, leaving the default model bit-identical): per-head q/k RMSNorm before RoPE (Qwen3, `qk_norm`),
an o_proj bias (Llama `attention_bias=True` biases q, k, v AND o: `qkv_bias` + `o_bias`), Llama 3.1 RoPE
frequency scaling (`rope_scaling=RopeScaling(...)`), and the options of the later families (each a Python
branch on a static config field, so a config without them traces the very same program):

* sliding-window attention on the layers `layer_types` marks "sliding_attention" (Mistral: every layer;
  Gemma: interleaved with global layers), window `sliding_window`: a query at position p attends to keys at
  positions p - window < p' <= p, positions counted over real tokens (a left-padded row's pads do not count);
* per-layer RoPE: `rope_local_theta` (Gemma 3's base for its sliding layers), `no_rope_layers` (SmolLM3's
  layers without RoPE);
* Gemma's (1 + w) RMSNorm (`norm_offset=1.0`), GeGLU MLP (`mlp_act="gelu_tanh"`), embeddings scaled by
  sqrt(d_model) (`embed_scale`), attention scale query_pre_attn_scalar^-0.5, post-attention / post-MLP norms
  (`post_norms`), tanh soft-capping of the attention scores (`attn_softcap`, Gemma 2) and of the logits
  (`final_softcap`).

Layers that differ (sliding / global, RoPE base, RoPE or none) stay ONE stacked `lax.scan`: each distinct
kind of layer is an attention "variant" (`attention_variants`), whose RoPE tables and mask are computed once
per forward; the scan picks its layer's by index. grpo_jax.pretrained.hf loads / saves Hugging Face
checkpoints of the families in grpo_jax.policies.families.

Parameters are a plain nested dict; per-layer leaves are STACKED with a leading axis L, so the training
forward is one `lax.scan` over layers (compile time independent of depth) and the pool (grpo_jax.pool) can
stack whole policies along another leading axis. Names follow the Hugging Face Qwen2 checkpoint layout
(`q_proj`, `gate_proj`, ...; kernels are stored [in, out], i.e. transposed w.r.t. torch) so real checkpoints
map onto it leaf by leaf.

Three entry points, all pure and jit/vmap-safe:

* `forward(params, cfg, tokens, mask)`: plain causal forward over left-padded sequences [N, S]. The
  reference implementation every other path is tested against.
* `forward_grouped(params, cfg, prompt, prompt_mask, completions)`: the GRPO training forward. The G
  completions of a prompt share that prompt, so the prompt is encoded ONCE per prompt ([B, P] tokens, not
  [B*G, P]) and completion queries attend to the shared prompt keys plus their own causal completion keys.
  Returns logits for every completion token. Identical (to float rounding) to `forward` on the
  concatenated sequences, at (P + G*T)/(G*(P+T)) of the token work.
* `prefill` / `decode_step`: the KV-cache path used by `grpo_jax.policies.sampling`; the prompt cache is
  shared by the G samples of a prompt in the same way.

Shapes: B prompts, G completions per prompt, P prompt tokens (left-padded), T completion tokens, V vocab,
L layers, H query heads, K kv heads (H % K == 0), Dh head dim, D model width, F MLP width.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from grpo_jax.policies import families

Params = dict[str, Any]

_NEG_INF = -1e30  # large finite negative: keeps fully-masked rows finite (they are masked out later)


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling of type "llama3" (Llama 3.1 / 3.2): hashable, static under jit.

    Formula: transformers `modeling_rope_utils._compute_llama3_parameters` (see `rope_inv_freq`); the field
    names are those of the HF `rope_parameters` / `rope_scaling` dict. Only rope_type "llama3" exists here."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int
    rope_type: str = "llama3"

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"RopeScaling.{field}={getattr(self, field)!r}: {why}")

        if self.rope_type != "llama3":
            bad("rope_type", 'valid: "llama3" (other RoPE scalings are not implemented)')
        if not self.factor > 0:
            bad("factor", "must be > 0")
        if not self.low_freq_factor > 0:
            bad("low_freq_factor", "must be > 0")
        if not self.high_freq_factor > self.low_freq_factor:
            bad("high_freq_factor", f"must be > low_freq_factor={self.low_freq_factor}")
        if int(self.original_max_position_embeddings) < 1:
            bad("original_max_position_embeddings", "must be a positive integer")


# Hugging Face model_type values a config can be exported as: the family registry's (its modules, which
# import this one, load on first use)
FAMILIES = families.FAMILIES
ATTENTION_TYPES = ("full_attention", "sliding_attention")  # layer_types values (Hugging Face's names)
MLP_ACTIVATIONS = ("silu", "gelu_tanh")  # SwiGLU (Llama, Qwen, Mistral, SmolLM3); GeGLU (Gemma)
# RoPE of a layer: the model's (rope_theta, rope_scaling), Gemma 3's local base (rope_local_theta), none
ROPE_MAIN, ROPE_LOCAL, ROPE_NONE = "main", "local", "none"


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    d_ff: int
    head_dim: int | None = None  # default d_model // n_heads
    rope_theta: float = 10000.0
    rms_eps: float = 1e-6
    qkv_bias: bool = False  # Qwen2: True; Llama: False
    tie_embeddings: bool = True
    value_head: bool = False
    compute_dtype: str = "float32"  # "bfloat16" for accelerators; logits and softmax stay float32
    param_dtype: str = "float32"
    # per-layer rematerialisation policy, one of REMAT_POLICIES (memory for compute); the main job's default
    remat: str = "dots_no_batch"
    # the train step's LM head: token log-probs and entropies in chunks of this many positions (policies.logp;
    # never the [B, G, T, V] logits), 0 = full logits (the main job's default; 512 for a real vocabulary)
    logp_chunk: int = 0
    init_std: float = 0.02
    # --- real-checkpoint options (grpo_jax.pretrained.hf); the defaults are today's model, bit for bit ---
    qk_norm: bool = False  # Qwen3: RMSNorm over Dh of each q / k head (weights "q_norm"/"k_norm" [L, Dh])
    o_bias: bool = False  # bias on o_proj (Llama attention_bias=True; with qkv_bias=True)
    rope_scaling: RopeScaling | None = None  # Llama 3.1 "llama3" frequency scaling; None = plain RoPE
    max_position_embeddings: int | None = None  # informative (config.json export); not enforced
    family: str | None = None  # HF model_type to export as (None: inferred by grpo_jax.pretrained.hf.save_hf)
    # --- later families (Mistral, SmolLM3, Gemma 2 / 3); the defaults are the model above, bit for bit ---
    sliding_window: int | None = None  # window of the "sliding_attention" layers (None: no such layer)
    layer_types: tuple[str, ...] | None = None  # ATTENTION_TYPES per layer; None: every layer full attention
    # (normalised: a tuple without "sliding_attention" becomes None, as an all-ones no_rope_layers does)
    rope_local_theta: float | None = None  # Gemma 3: RoPE base of the sliding layers (no rope_scaling there)
    no_rope_layers: tuple[int, ...] | None = None  # SmolLM3: per layer 1 = RoPE, 0 = no position encoding
    norm_offset: float = 0.0  # RMSNorm scales by (norm_offset + w): Gemma's (1 + w) is 1.0
    mlp_act: str = "silu"  # MLP_ACTIVATIONS: act(gate) * up with SiLU (SwiGLU) or tanh-GELU (GeGLU)
    post_norms: bool = False  # Gemma 2 / 3: RMSNorm of the attention / MLP output before each residual add
    embed_scale: bool = False  # Gemma: embeddings x sqrt(d_model), rounded to the embedding's dtype
    query_pre_attn_scalar: float | None = None  # attention scale query_pre_attn_scalar^-0.5 (None: Dh^-0.5)
    attn_softcap: float | None = None  # Gemma 2: scores -> cap * tanh(scores / cap) before the softmax
    final_softcap: float | None = None  # Gemma 2 / 3: logits -> cap * tanh(logits / cap)

    def __post_init__(self):
        def bad(field, why):
            raise ValueError(f"TransformerConfig.{field}={getattr(self, field)!r}: {why}")

        for f in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"):
            if int(getattr(self, f)) < 1:
                bad(f, "must be a positive integer")
        if self.n_heads % self.n_kv_heads:
            bad("n_kv_heads", f"must divide n_heads={self.n_heads} (grouped-query attention)")
        if self.head_dim is None and self.d_model % self.n_heads:
            bad("n_heads", f"must divide d_model={self.d_model} unless head_dim is given")
        if self.dim_head % 2:
            bad("head_dim", "must be even (RoPE rotates pairs)")
        if int(self.logp_chunk) < 0:
            bad("logp_chunk", "must be >= 0 (0 = full logits)")
        for f in ("compute_dtype", "param_dtype"):
            if getattr(self, f) not in ("float32", "bfloat16", "float16"):
                bad(f, "valid: float32, bfloat16, float16")
        if isinstance(self.rope_scaling, dict):  # e.g. rebuilt from dataclasses.asdict / JSON
            object.__setattr__(self, "rope_scaling", RopeScaling(**self.rope_scaling))
        if self.rope_scaling is not None and not isinstance(self.rope_scaling, RopeScaling):
            bad("rope_scaling", "must be None or a RopeScaling (rope_type 'llama3')")
        if self.max_position_embeddings is not None and int(self.max_position_embeddings) < 1:
            bad("max_position_embeddings", "must be None or a positive integer")
        self._check_layers(bad)
        if self.family is not None:
            if self.family not in families.FAMILIES:
                bad("family", f"valid: None, {', '.join(families.FAMILIES)}")
            why = families.get(self.family).check(self)
            if why:
                bad("family", why)

    def _check_layers(self, bad) -> None:
        """The later families' fields. Lists (from JSON) become the hashable tuples a static config needs, and
        per-layer tuples that change nothing (every layer full attention, every layer with RoPE) become None:
        one config per model, so a config read back from its export compares equal."""
        for f in ("layer_types", "no_rope_layers"):
            if isinstance(getattr(self, f), list):
                object.__setattr__(self, f, tuple(getattr(self, f)))
        if self.layer_types is not None and set(self.layer_types) == {"full_attention"}:
            object.__setattr__(self, "layer_types", None)
        if self.no_rope_layers is not None and all(v == 1 for v in self.no_rope_layers):
            object.__setattr__(self, "no_rope_layers", None)
        n = int(self.n_layers)
        if self.layer_types is not None:
            if len(self.layer_types) != n or any(t not in ATTENTION_TYPES for t in self.layer_types):
                bad("layer_types", f"must be None or {n} (n_layers) of {', '.join(ATTENTION_TYPES)}")
        sliding = self.layer_types is not None and "sliding_attention" in self.layer_types
        if sliding and (self.sliding_window is None or int(self.sliding_window) < 1):
            bad("sliding_window", "must be a positive integer: layer_types has sliding_attention layers")
        if self.sliding_window is not None and not sliding:
            bad("sliding_window", "must be None unless layer_types has sliding_attention layers")
        if self.rope_local_theta is not None and not (sliding and float(self.rope_local_theta) > 0):
            bad("rope_local_theta", "must be None, or > 0 with sliding_attention layers (their RoPE base)")
        if self.no_rope_layers is not None and (
            len(self.no_rope_layers) != n or any(v not in (0, 1) for v in self.no_rope_layers)
        ):
            bad("no_rope_layers", f"must be None or {n} (n_layers) flags, 1 = RoPE, 0 = none")
        if self.mlp_act not in MLP_ACTIVATIONS:
            bad("mlp_act", f"valid: {', '.join(MLP_ACTIVATIONS)}")
        for f in ("query_pre_attn_scalar", "attn_softcap", "final_softcap"):
            if getattr(self, f) is not None and not float(getattr(self, f)) > 0:
                bad(f, "must be None or > 0")

    @property
    def dim_head(self) -> int:
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def attn_scale(self) -> float:
        """The attention scores' scale: 1 / sqrt(Dh), or query_pre_attn_scalar^-0.5 (Gemma's, as HF computes
        it)."""
        if self.query_pre_attn_scalar is not None:
            return float(self.query_pre_attn_scalar) ** -0.5
        return 1.0 / math.sqrt(self.dim_head)

    def layer_attention(self, i: int) -> tuple[int | None, str]:
        """Layer i's attention kind: (its sliding window or None, its RoPE: ROPE_MAIN, ROPE_LOCAL or
        ROPE_NONE)."""
        sliding = self.layer_types is not None and self.layer_types[i] == "sliding_attention"
        if self.no_rope_layers is not None and not self.no_rope_layers[i]:
            rope = ROPE_NONE
        elif sliding and self.rope_local_theta is not None:
            rope = ROPE_LOCAL
        else:
            rope = ROPE_MAIN
        if not sliding:
            return (None, rope)
        if self.sliding_window is None:  # __post_init__ refuses such a config
            raise ValueError("TransformerConfig: sliding_attention layers need a sliding_window")
        return (int(self.sliding_window), rope)

    @functools.cached_property  # (read per layer while tracing the unrolled decode loops)
    def attention_variants(self) -> tuple[tuple[int | None, str], ...]:
        """The distinct `layer_attention` kinds, in order of first use: ((None, ROPE_MAIN),) for a model whose
        layers all attend alike (Llama, Qwen: the one-variant paths, unchanged)."""
        return tuple(dict.fromkeys(self.layer_attention(i) for i in range(self.n_layers)))

    @functools.cached_property
    def layer_variant(self) -> tuple[int, ...]:
        """Each layer's index into `attention_variants`."""
        index = {v: j for j, v in enumerate(self.attention_variants)}
        return tuple(index[self.layer_attention(i)] for i in range(self.n_layers))

    @property
    def group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def num_params(self) -> int:
        d, f, v, h, k, dh, n = (
            self.d_model,
            self.d_ff,
            self.vocab_size,
            self.n_heads,
            self.n_kv_heads,
            self.dim_head,
            self.n_layers,
        )
        attn = d * h * dh * 2 + d * k * dh * 2 + (h * dh + 2 * k * dh if self.qkv_bias else 0)
        attn += (d if self.o_bias else 0) + (2 * dh if self.qk_norm else 0)
        layer = attn + 3 * d * f + (4 * d if self.post_norms else 2 * d)
        head = 0 if self.tie_embeddings else d * v
        return n * layer + v * d + d + head + (d + 1 if self.value_head else 0)

    def matmul_flops_per_token(self, context: int) -> int:
        """Forward FLOPs per token (2 per multiply-add): weight matmuls + attention over `context` keys."""
        d, f, v, h, k, dh = (
            self.d_model,
            self.d_ff,
            self.vocab_size,
            self.n_heads,
            self.n_kv_heads,
            self.dim_head,
        )
        proj = 2 * (d * h * dh * 2 + d * k * dh * 2 + 3 * d * f)
        attn = 2 * 2 * h * dh * context
        return self.n_layers * (proj + attn) + 2 * d * v


# Sizes used by the benchmark and tests (Qwen2 style: q/k/v bias, untied head).
TINY = TransformerConfig(
    vocab_size=512,
    d_model=256,
    n_layers=4,
    n_heads=4,
    n_kv_heads=4,
    d_ff=1024,
    qkv_bias=True,
    tie_embeddings=False,
)
SMALL = TransformerConfig(
    vocab_size=512,
    d_model=512,
    n_layers=8,
    n_heads=8,
    n_kv_heads=8,
    d_ff=2048,
    qkv_bias=True,
    tie_embeddings=False,
)


def _dt(name: str):
    return jnp.dtype(name)


def init_params(cfg: TransformerConfig, key: jax.Array) -> Params:
    """Random init: N(0, init_std) weights, zero biases, unit norms (q/k norms too); output projections
    x 1/sqrt(2L)."""
    pd = _dt(cfg.param_dtype)
    d, f, h, k, dh, n, v = (
        cfg.d_model,
        cfg.d_ff,
        cfg.n_heads,
        cfg.n_kv_heads,
        cfg.dim_head,
        cfg.n_layers,
        cfg.vocab_size,
    )
    keys = iter(jax.random.split(key, 16))
    std = cfg.init_std
    out_std = std / math.sqrt(2 * n)

    def normal(shape, s):
        return (s * jax.random.normal(next(keys), shape, jnp.float32)).astype(pd)

    def dense(din, dout, s, bias):
        p = {"kernel": normal((n, din, dout), s)}
        if bias:
            p["bias"] = jnp.zeros((n, dout), pd)
        return p

    layers = {
        "attn_norm": jnp.ones((n, d), pd),
        "q_proj": dense(d, h * dh, std, cfg.qkv_bias),
        "k_proj": dense(d, k * dh, std, cfg.qkv_bias),
        "v_proj": dense(d, k * dh, std, cfg.qkv_bias),
        "o_proj": dense(h * dh, d, out_std, cfg.o_bias),
        "mlp_norm": jnp.ones((n, d), pd),
        "gate_proj": dense(d, f, std, False),
        "up_proj": dense(d, f, std, False),
        "down_proj": dense(f, d, out_std, False),
    }
    if cfg.qk_norm:
        layers["q_norm"] = jnp.ones((n, dh), pd)
        layers["k_norm"] = jnp.ones((n, dh), pd)
    if cfg.post_norms:
        layers["attn_post_norm"] = jnp.ones((n, d), pd)
        layers["mlp_post_norm"] = jnp.ones((n, d), pd)
    if cfg.norm_offset:  # unit norms: the stored weight is 1 - offset (Gemma's (1 + w) RMSNorm stores 0)
        layers = {k: (v - cfg.norm_offset if k.endswith("norm") else v) for k, v in layers.items()}
    final_norm = jnp.full((d,), 1.0 - cfg.norm_offset, pd) if cfg.norm_offset else jnp.ones((d,), pd)
    params: Params = {"embed": normal((v, d), std), "layers": layers, "final_norm": final_norm}
    if not cfg.tie_embeddings:
        params["lm_head"] = normal((d, v), std)
    if cfg.value_head:
        params["value_head"] = {"kernel": jnp.zeros((d, 1), pd), "bias": jnp.zeros((1,), pd)}
    return params


# ----------------------------------------------------------------------------------------------------------
# building blocks


def rms_norm(x: jax.Array, w: jax.Array, eps: float, offset: float = 0.0) -> jax.Array:
    """y = x / sqrt(mean(x^2) + eps) * (offset + w), computed in float32 (Zhang & Sennrich 2019; Llama/Qwen2;
    Gemma's RMSNorm is offset 1: `output * (1.0 + self.weight.float())`, modeling_gemma3.py Gemma3RMSNorm)."""
    xf = x.astype(jnp.float32)
    y = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    wf = w.astype(jnp.float32)
    if offset:
        wf = offset + wf
    return (y * wf).astype(x.dtype)


def norm(cfg: TransformerConfig, x: jax.Array, w: jax.Array) -> jax.Array:
    """The model's RMSNorm of x with weight w (eps and the (offset + w) convention from cfg)."""
    return rms_norm(x, w, cfg.rms_eps, cfg.norm_offset)


def embed_tokens(cfg: TransformerConfig, params: Params, tokens: jax.Array, dtype) -> jax.Array:
    """The embedded tokens in the compute dtype. With cfg.embed_scale (Gemma) they are multiplied by
    sqrt(d_model) first, in the embedding table's dtype with the scale rounded to it, as transformers does
    (`Gemma3TextScaledWordEmbedding`: `embed(ids) * embed_scale.to(weight.dtype)`, the scale a float32
    tensor of hidden_size**0.5)."""
    x = params["embed"][tokens]
    if cfg.embed_scale:
        x = x * jnp.asarray(np.float32(cfg.d_model**0.5)).astype(x.dtype)
    return x.astype(dtype)


def softcap(x: jax.Array, cap: float) -> jax.Array:
    """cap * tanh(x / cap): Gemma 2's soft-capping of attention scores and logits (float32)."""
    return jnp.tanh(x / cap) * cap


def _scores(cfg: TransformerConfig, s: jax.Array) -> jax.Array:
    """Attention scores (already scaled, float32) after the optional soft-capping (cfg.attn_softcap)."""
    return s if cfg.attn_softcap is None else softcap(s, cfg.attn_softcap)


def _transposed(x: jax.Array) -> jax.Array:
    """x.T [M, N] of a 2-D x [N, M] as a physically transposed row-major array. XLA folds a plain transpose
    into the dot that consumes it; a bf16 dot contracting the lhs's major dimension (db = aᵀ·g) is upcast to
    float32 by XLA:CPU (~3x slower here: 22 vs 7 ms for [4352, 256]ᵀ x [4352, 1024]). One contracting the
    rhs's minor dimension (da = g·bᵀ, `rows_matmul`) runs on the fast bf16 kernels (YNNPACK) in this XLA,
    within noise of the copy for the training shapes, which keep it. The barrier on the transpose with a
    leading unit axis makes XLA write it out in row-major order (a barrier on the 2-D transpose alone lets the
    layout pass fold it again). Flattening it would do the same on one device, but on a mesh a flattened
    row-sharded array cannot stay sharded: XLA all-gathered every weight and activation transposed here
    (a 2-device data-parallel tiny bf16 step 0.65 -> 0.54 s without, WORKSPACE §6)."""
    return jax.lax.optimization_barrier(x.T[None])[0]


@jax.custom_vjp
def _lowp_matmul(a: jax.Array, b: jax.Array) -> jax.Array:
    """a @ b for a low-precision `a` [N, K] and a weight `b` [K, M] of any float dtype (a float32 master
    weight): b is cast to a's dtype, the product accumulates in float32 and is rounded once to a's dtype.
    The backward runs the same kind of product (low-precision operands, float32 accumulation, operands
    transposed in memory, `_transposed`): da is rounded to a's dtype, db = aᵀ·g stays float32 until it is
    cast to b's dtype. JAX's own transpose rule would multiply a float32 cotangent by the bf16 operand, and
    XLA:CPU would run it at the float32 rate."""
    return jnp.matmul(a, b.astype(a.dtype), preferred_element_type=jnp.float32).astype(a.dtype)


def _lowp_matmul_fwd(a, b):
    return _lowp_matmul(a, b), (a, b)


def _lowp_matmul_bwd(res, g):
    a, b = res
    g = g.astype(a.dtype)
    da = jnp.matmul(g, _transposed(b.astype(a.dtype)), preferred_element_type=jnp.float32).astype(a.dtype)
    db = jnp.matmul(_transposed(a), g, preferred_element_type=jnp.float32).astype(b.dtype)
    return da, db


_lowp_matmul.defvjp(_lowp_matmul_fwd, _lowp_matmul_bwd)


@jax.custom_vjp
def _add_bias_lowp(y: jax.Array, bias: jax.Array) -> jax.Array:
    """y [N, M] (low precision) + bias [M] (any float dtype, cast to y's). The bias gradient is the column
    sum of the cotangent accumulated in float32 and cast to the bias's dtype (as the weight gradient aᵀ·g of
    `_lowp_matmul`): JAX's own rule sums the bf16 cotangent in bf16, where small rows vanish against a large
    partial sum (1 + 4095 · 2^-9 over 4 096 rows came out 8.9375 instead of 8.998; three rows of 2^-8 after a
    1 left it at 1). Same speed on XLA:CPU (a product with a row of ones instead is rewritten to an upcast
    float32 dot)."""
    return y + bias.astype(y.dtype)


def _add_bias_lowp_fwd(y, bias):
    return _add_bias_lowp(y, bias), bias


def _add_bias_lowp_bwd(bias, g):
    return g, jnp.sum(g, axis=0, dtype=jnp.float32).astype(bias.dtype)


_add_bias_lowp.defvjp(_add_bias_lowp_fwd, _add_bias_lowp_bwd)


def matmul(a: jax.Array, b: jax.Array, dtype) -> jax.Array:
    """a [N, K] @ b [K, M] in the compute dtype (b: a weight in its param dtype). float32: the plain product.
    Below float32 (`_lowp_matmul`): low-precision operands, float32 accumulation, one rounding to `dtype`,
    forward and backward. XLA:CPU runs a bf16 x bf16 -> bf16 dot ~5x slower than the float32 one, and a
    bf16 x bf16 -> float32 dot ~5x faster (WORKSPACE.md §6, "Mixed precision and bf16 rollouts")."""
    if jnp.dtype(dtype) == jnp.float32:
        return a @ b.astype(dtype)
    return _lowp_matmul(a.astype(dtype), b)


def rows_matmul(a: jax.Array, w_rows: jax.Array) -> jax.Array:
    """a [..., K] @ w_rows.T for a weight stored as rows [M, K] ([out, in], torch's Linear layout), in a's
    dtype with float32 accumulation and a float32 result. The bf16 sampler's weight copy is stored this way
    (sampling.rollout_weights): XLA:CPU reads it faster in the few-row products of a decode step (SmolLM2's
    [32, 1536] x [1536, 576] down projection: ~300 -> ~130 us per product, WORKSPACE.md §6) and computes
    the same float32 sums, so the sampled tokens and log-probs are unchanged."""
    dims = (((a.ndim - 1,), (1,)), ((), ()))
    return jax.lax.dot_general(a, w_rows.astype(a.dtype), dims, preferred_element_type=jnp.float32)


def dense(x: jax.Array, p: dict, dtype) -> jax.Array:
    """x @ kernel (+ bias) (+ LoRA: x @ lora_a @ lora_b * lora_scale when adapters are merged into `p`).
    A sampler's weight copy holds kernel_t = kernel.T instead (`rows_matmul`).

    Stacked adapters of M members (`lora.merge_members`: lora_a [M, in, r], lora_b [M, r, out] in a layer)
    are applied per member to member-major rows: the rows are split into M equal blocks and block i gets
    member i's delta, while the base matmul runs once over all rows.

    The leading axes are flattened to one: XLA:CPU's backward of a dot with a 4-D left operand is ~2x slower
    than the same dot in 2-D (measured: the tiny GRPO step's policy backward went from 2.26 s to 1.38 s)."""
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if "kernel_t" in p:  # a sampler's low-precision copy, stored [out, in] (sampling.rollout_weights)
        y = rows_matmul(x2.astype(dtype), p["kernel_t"]).astype(dtype)
    else:
        y = matmul(x2, p["kernel"], dtype)
    if "bias" in p:
        lowp = jnp.dtype(dtype) != jnp.float32
        y = _add_bias_lowp(y, p["bias"]) if lowp else y + p["bias"].astype(dtype)
    if "lora_a" in p:
        scale = p["lora_scale"].astype(dtype)
        if p["lora_a"].ndim == 2:
            y = y + matmul(matmul(x2, p["lora_a"], dtype), p["lora_b"], dtype) * scale
        else:  # M members: rows member-major
            a, b = p["lora_a"].astype(dtype), p["lora_b"].astype(dtype)
            xm = x2.reshape(a.shape[0], -1, x2.shape[-1])  # [M, N/M, in]
            delta = jnp.einsum("mnr,mro->mno", jnp.einsum("mni,mir->mnr", xm, a), b)
            y = y + delta.reshape(y.shape) * scale
    return y.reshape(*lead, y.shape[-1])


def rope_inv_freq(dh: int, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """RoPE inverse frequencies [Dh/2] (float32): theta^(-2i/Dh) (Su et al. 2021), optionally rescaled.

    "llama3" scaling, exactly transformers' `_compute_llama3_parameters` (modeling_rope_utils.py; Meta's
    Llama 3.1 `apply_scaling`): with wavelen = 2 pi / inv_freq and L0 = original_max_position_embeddings,
    wavelen < L0 / high_freq_factor keeps inv_freq; wavelen > L0 / low_freq_factor divides it by factor;
    in between, inv_freq * ((1 - s) / factor + s) with s = (L0 / wavelen - low) / (high - low)."""
    inv = 1.0 / (theta ** (jnp.arange(0, dh, 2, dtype=jnp.float32) / dh))  # [Dh/2]
    if scaling is None:
        return inv
    factor, low, high = scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor
    old = scaling.original_max_position_embeddings
    wavelen = 2 * math.pi / inv
    inv_l = jnp.where(wavelen > old / low, inv / factor, inv)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
    medium = ~(wavelen < old / high) & ~(wavelen > old / low)
    return jnp.where(medium, smoothed, inv_l)


class RopeTables(NamedTuple):
    """cos and sin of the rotary angles, [..., S, 1, Dh/2] float32 (broadcast over the heads)."""

    cos: jax.Array
    sin: jax.Array


def rope_tables(
    positions: jax.Array, dh: int, theta: float, scaling: RopeScaling | None = None
) -> RopeTables:
    """The rotary angles' cos and sin for integer positions [..., S]. Computed once per forward, outside
    the layer loop: inside it XLA:CPU fused them into every layer's q and k rotation and evaluated them
    per head and per half of Dh, in the forward, the rematerialised forward and the backward alike."""
    inv = rope_inv_freq(dh, theta, scaling)  # [Dh/2]
    ang = positions.astype(jnp.float32)[..., None] * inv  # [..., S, Dh/2]
    # the barrier keeps XLA from fusing cos and sin back into each consumer, which evaluates them per element
    # (in the sampler's decode step: once per head, layer and cache write)
    return RopeTables(*jax.lax.optimization_barrier((jnp.cos(ang)[..., None, :], jnp.sin(ang)[..., None, :])))


def apply_rope(x: jax.Array, tables: RopeTables) -> jax.Array:
    """x [..., S, heads, Dh] rotated by `tables` (rope_tables of its positions), in float32, rounded once
    to x's dtype. Below float32 the rotated half comes from a product with the signed permutation
    `_rotate_half_matrix` (exact: one nonzero term per output) instead of slices and a concatenation along
    Dh: XLA:CPU fused the concatenation with the head transpose that follows into one loop, 2.7 ms against
    1.5 ms for this form on the tiny model's [8, 8, 64, 4, 64] q (microbenchmark; end to end within this
    host's run-to-run noise, WORKSPACE.md §6). The bf16 samplers draw the same tokens and log-probs as
    before; float32 keeps the slices and its bits."""
    dh = x.shape[-1]
    cos, sin = tables
    xf = x.astype(jnp.float32)
    if x.dtype != jnp.float32:
        # a batch axis of size 1, so that the remat policy `dots_no_batch` recomputes this product rather
        # than keeping its float32 output for the backward; no reshape, so a sharded heads axis stays put
        dims = (((xf.ndim,), (1,)), ((0,), (0,)))
        r = jax.lax.dot_general(xf[None], _rotate_half_matrix(dh)[None], dims)[0]
        c2 = jnp.concatenate([cos, cos], axis=-1)
        s2 = jnp.concatenate([sin, sin], axis=-1)
        return (xf * c2 + r * s2).astype(x.dtype)
    x1, x2 = xf[..., : dh // 2], xf[..., dh // 2 :]
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x.dtype)


def _rotate_half_matrix(dh: int) -> jax.Array:
    """R [Dh, Dh] with x @ R = concat(-x[Dh/2:], x[:Dh/2]) (transformers' `rotate_half`)."""
    m = np.zeros((dh, dh), np.float32)
    h = dh // 2
    m[np.arange(h) + h, np.arange(h)] = -1.0
    m[np.arange(h), np.arange(h) + h] = 1.0
    return jnp.asarray(m)


def rope(x: jax.Array, positions: jax.Array, theta: float, scaling: RopeScaling | None = None) -> jax.Array:
    """Rotary position embedding (Su et al. 2021), rotate-half convention of Llama/Qwen2 checkpoints
    (transformers `rotate_half` / `apply_rotary_pos_emb`: dim i pairs with dim i + Dh/2).

    x: [..., S, heads, Dh]; positions: [..., S] (integer); scaling: see `rope_inv_freq`."""
    return apply_rope(x, rope_tables(positions, x.shape[-1], theta, scaling))


def _rot(cfg: TransformerConfig, positions: jax.Array) -> RopeTables:
    return rope_tables(positions, cfg.dim_head, cfg.rope_theta, cfg.rope_scaling)


def rope_of(
    cfg: TransformerConfig, kind: str, positions: jax.Array, identity: bool = False
) -> RopeTables | None:
    """The RoPE tables of integer positions [..., S] for a layer whose RoPE is `kind` (cfg.layer_attention):
    ROPE_MAIN the model's (rope_theta, rope_scaling), ROPE_LOCAL Gemma 3's sliding layers' base
    rope_local_theta without scaling (transformers: rope_parameters["sliding_attention"]), ROPE_NONE none
    (SmolLM3's no_rope_layers): None, or with `identity` tables cos 1, sin 0, which rotate by exactly nothing
    (for a layer scan whose layers pick their tables by index, so all variants need arrays)."""
    if kind == ROPE_MAIN:
        return _rot(cfg, positions)
    if kind == ROPE_LOCAL:
        if cfg.rope_local_theta is None:  # layer_attention gives ROPE_LOCAL only with a rope_local_theta
            raise ValueError("TransformerConfig: ROPE_LOCAL layers need a rope_local_theta")
        return rope_tables(positions, cfg.dim_head, cfg.rope_local_theta)
    if not identity:
        return None
    shape = (*positions.shape, 1, cfg.dim_head // 2)
    return RopeTables(jnp.ones(shape, jnp.float32), jnp.zeros(shape, jnp.float32))


def within_window(q_pos: jax.Array, k_pos: jax.Array, window: int | None) -> jax.Array | bool:
    """Whether a query at position q_pos may see a key at k_pos under a sliding window (broadcast): the
    last `window` positions, q_pos - window < k_pos (transformers masking_utils `sliding_window_overlay`:
    kv_idx > q_idx - sliding_window; causality is the caller's mask). True without a window. Positions count
    real tokens, so a left-padded row's pads never take a place in the window."""
    if window is None:
        return True
    return (q_pos - k_pos) < window


def _qkv(cfg: TransformerConfig, lp: dict, h: jax.Array, positions: jax.Array | RopeTables | None, dtype):
    """h: [..., S, D] normalised input -> q [..., S, K, group, Dh], k/v [..., S, K, Dh] (q, k rotated by
    the RopeTables of their positions, or by integer positions [..., S]; None: a layer without RoPE).

    With cfg.qk_norm (Qwen3, transformers Qwen3Attention; Gemma 3 with its (1 + w) norm): q and k are
    RMS-normalised over Dh per head (weights lp["q_norm"] / lp["k_norm"] [Dh], eps = rms_eps) after the head
    reshape and before RoPE."""
    lead = h.shape[:-1]
    q = dense(h, lp["q_proj"], dtype).reshape(*lead, cfg.n_kv_heads, cfg.group, cfg.dim_head)
    k = dense(h, lp["k_proj"], dtype).reshape(*lead, cfg.n_kv_heads, cfg.dim_head)
    v = dense(h, lp["v_proj"], dtype).reshape(*lead, cfg.n_kv_heads, cfg.dim_head)
    if cfg.qk_norm:
        q = norm(cfg, q, lp["q_norm"])
        k = norm(cfg, k, lp["k_norm"])
    if positions is None:
        return q, k, v
    rot = positions if isinstance(positions, RopeTables) else _rot(cfg, positions)
    q = apply_rope(q.reshape(*lead, cfg.n_heads, cfg.dim_head), rot).reshape(q.shape)
    k = apply_rope(k, rot)
    return q, k, v


def _mlp(cfg: TransformerConfig, lp: dict, x: jax.Array, dtype) -> jax.Array:
    """x + MLP(norm(x)): down(act(gate(h)) * up(h)); Gemma's post-MLP norm (cfg.post_norms) before the add."""
    h = norm(cfg, x, lp["mlp_norm"])
    g = dense(h, lp["gate_proj"], dtype)
    u = dense(h, lp["up_proj"], dtype)
    y = dense(swiglu(g, u) if cfg.mlp_act == "silu" else geglu(g, u), lp["down_proj"], dtype)
    if cfg.post_norms:
        y = norm(cfg, y, lp["mlp_post_norm"])
    return x + y


def swiglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """SiLU(g) * u in the projections' dtype. Below float32 it is computed in float32 and rounded once:
    XLA:CPU evaluates a bf16 chain op by op with a rounding after each, ~2x slower here."""
    if g.dtype == jnp.float32:
        return jax.nn.silu(g) * u
    return (jax.nn.silu(g.astype(jnp.float32)) * u.astype(jnp.float32)).astype(g.dtype)


def geglu(g: jax.Array, u: jax.Array) -> jax.Array:
    """GELU(g) * u with the tanh approximation (Gemma's hidden_activation "gelu_pytorch_tanh" =
    torch.nn.functional.gelu(approximate="tanh")), in float32 and rounded once as `swiglu`."""
    gf, uf = g.astype(jnp.float32), u.astype(jnp.float32)
    return (jax.nn.gelu(gf, approximate=True) * uf).astype(g.dtype)


def _softmax_attend(scores: list[jax.Array], masks: list[jax.Array]):
    """Joint softmax over several key blocks. scores[i]: [..., Si] float32; masks broadcastable to them."""
    s = [jnp.where(m, sc, _NEG_INF) for sc, m in zip(scores, masks, strict=True)]
    mx = jnp.max(jnp.concatenate([jnp.max(x, axis=-1, keepdims=True) for x in s], axis=-1), -1, keepdims=True)
    e = [jnp.exp(x - mx) * m for x, m in zip(s, masks, strict=True)]
    den = sum(jnp.sum(x, axis=-1, keepdims=True) for x in e)
    den = jnp.maximum(den, 1e-30)
    return [x / den for x in e]


@jax.custom_vjp
def _softmax_attend_vjp(scores: tuple, masks: tuple) -> tuple:
    """_softmax_attend with the textbook backward, dS_i = W_i (dW_i - sum_j sum(W_j dW_j)) over all blocks,
    one fused pass per block; JAX's derivative of the max, exp, sum and divide chain ran as several passes
    (the largest single item of the tiny model's bf16 backward). The two differ by float rounding only, so
    it is used below float32 (`_attend_weights`) and the float32 path keeps its bits."""
    return tuple(_softmax_attend(list(scores), list(masks)))


def _softmax_attend_fwd(scores, masks):
    w = _softmax_attend_vjp(scores, masks)
    return w, w


def _softmax_attend_bwd(w, g):
    c = sum(jnp.sum(wi * gi, axis=-1, keepdims=True) for wi, gi in zip(w, g, strict=True))
    return tuple(wi * (gi - c) for wi, gi in zip(w, g, strict=True)), None


_softmax_attend_vjp.defvjp(_softmax_attend_fwd, _softmax_attend_bwd)


def _attend_weights(scores: list[jax.Array], masks: list[jax.Array], dtype) -> list[jax.Array]:
    """The joint softmax of the training forwards and the prefill: _softmax_attend, with its fused backward
    below float32. Below float32 the axes of size 1 in every block (the group axis without grouped-query
    sharing) are dropped first and the weights given back in the scores' shapes: XLA:CPU's library fusion
    of the backward's multiply-and-reduce ran ~8x slower with a size-1 axis (the tiny model's bf16 train
    step: 0.69 -> 0.63 s, WORKSPACE.md §6). float32 keeps its shapes and bits."""
    if jnp.dtype(dtype) == jnp.float32:
        return _softmax_attend(scores, masks)
    nd = scores[0].ndim
    keep = [i for i, n in enumerate(scores[0].shape[:-1]) if n != 1] + [nd - 1]
    squeeze = lambda x: x.reshape([((1,) * (nd - x.ndim) + x.shape)[i] for i in keep])
    w = _softmax_attend_vjp(tuple(map(squeeze, scores)), tuple(map(squeeze, masks)))
    return [wi.reshape(s.shape) for wi, s in zip(w, scores, strict=True)]


def _out_proj(cfg: TransformerConfig, lp: dict, x: jax.Array, o: jax.Array, dtype) -> jax.Array:
    """o: [..., S, K, group, Dh] attention output -> residual add (Gemma: normed first, cfg.post_norms)."""
    o = o.reshape(*o.shape[:-3], cfg.n_heads * cfg.dim_head).astype(dtype)
    y = dense(o, lp["o_proj"], dtype)
    if cfg.post_norms:
        y = norm(cfg, y, lp["attn_post_norm"])
    return x + y


# jax.checkpoint policies per layer: what the backward pass keeps from the forward ("none": everything, no
# recomputation; "full": only the layer inputs, the whole layer is recomputed; "dots": the matmul outputs, the
# elementwise ops are recomputed; "dots_no_batch": matmul outputs without batch dimensions, i.e. the
# projections but not the attention scores)
REMAT_POLICIES = ("none", "full", "dots", "dots_no_batch")


def remat_layer(fn, policy: str):
    """fn wrapped in jax.checkpoint under a REMAT_POLICIES policy ("none": fn itself)."""
    if policy == "none":
        return fn
    if policy == "full":
        return jax.checkpoint(fn)
    if policy == "dots":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.checkpoint_dots)
    if policy == "dots_no_batch":
        return jax.checkpoint(fn, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    raise ValueError(f"remat policy {policy!r}: valid policies are {', '.join(REMAT_POLICIES)}")


def _scan_layers(cfg: TransformerConfig, layers: dict, fn, carry):
    """carry = fn(carry, layer_params) over the stacked layers (lax.scan; remat policy cfg.remat)."""
    body = remat_layer(fn, cfg.remat)

    def step(c, lp):
        return body(c, lp), None

    carry, _ = jax.lax.scan(step, carry, layers)
    return carry


def attention_contexts(cfg: TransformerConfig, make, stacked: bool = True) -> list:
    """[make(window, rope_kind, identity) for each of cfg.attention_variants]: what a layer of each variant
    attends with (its RoPE tables and masks). `identity` is True when a layer scan stacks and indexes several
    variants' contexts (`stacked` and more than one variant, `scan_variant_layers`): a layer without RoPE
    then needs identity tables (rope_of) rather than None. Unrolled layer loops pick theirs by
    cfg.layer_variant[i] (stacked=False)."""
    identity = stacked and len(cfg.attention_variants) > 1
    return [make(window, rope, identity) for window, rope in cfg.attention_variants]


def _stack_contexts(contexts: list):
    """The variant contexts (pytrees of one structure) stacked on a new leading axis, each leaf broadcast to
    the shape shared by all variants (a sliding mask may be [N, 1, 1, S, S] where the full one broadcasts)."""

    def stack(*xs):
        shape = jnp.broadcast_shapes(*(jnp.shape(x) for x in xs))
        return jnp.stack([jnp.broadcast_to(x, shape) for x in xs])

    return jax.tree.map(stack, *contexts)


def scan_variant_layers(cfg: TransformerConfig, layers: dict, fn, carry, contexts: list):
    """carry = fn(carry, layer_params, context) over the stacked layers, each layer with the context of its
    attention variant (`attention_contexts`). One variant (every Llama / Qwen model): exactly `_scan_layers`
    with that context. Several (Gemma's sliding / global layers, SmolLM3's layers without RoPE): one scan
    all the same; the contexts are stacked once and each layer takes its own by index (cfg.layer_variant),
    so compile time stays independent of depth and of the layer pattern."""
    if len(contexts) == 1:
        ctx = contexts[0]
        return _scan_layers(cfg, layers, lambda c, lp: fn(c, lp, ctx), carry)
    stacked = _stack_contexts(contexts)
    body = remat_layer(lambda c, xs: fn(c, xs[0], jax.tree.map(lambda a: a[xs[1]], stacked)), cfg.remat)

    def step(c, xs):
        return body(c, xs), None

    carry, _ = jax.lax.scan(step, carry, (layers, jnp.asarray(cfg.layer_variant, jnp.int32)))
    return carry


def head_weight(params: Params, cfg: TransformerConfig) -> jax.Array:
    """The LM-head matrix [D, V] (param dtype): embed.T when the embeddings are tied, else lm_head."""
    return params["embed"].T if cfg.tie_embeddings else params["lm_head"]


def _head(cfg: TransformerConfig, params: Params, x: jax.Array, return_hidden: bool = False):
    """Final norm + LM head (float32 logits, soft-capped with cfg.final_softcap) + optional value head; with
    return_hidden, the final-norm output h (compute dtype) in place of the logits (for a chunked head:
    grpo_jax.policies.logp, which applies the soft-cap itself).

    The head matmul takes compute-dtype inputs but accumulates and returns float32
    (preferred_element_type): with bf16 compute, a bf16 result cast afterwards would round every logit
    to 8 mantissa bits (|error| up to ~|logit|/256) before the float32 log-softmax."""
    h = norm(cfg, x, params["final_norm"])
    if return_hidden:
        logits = h
    elif "lm_head_t" in params:  # a sampler's copy, [V, D] (sampling.rollout_weights)
        logits = rows_matmul(h, params["lm_head_t"])
    else:
        w = head_weight(params, cfg)
        logits = jnp.matmul(h, w.astype(h.dtype), preferred_element_type=jnp.float32)
    if cfg.final_softcap is not None and not return_hidden:
        logits = softcap(logits, cfg.final_softcap)
    values = None
    if cfg.value_head:
        vh = params["value_head"]
        values = (h.astype(jnp.float32) @ vh["kernel"].astype(jnp.float32) + vh["bias"].astype(jnp.float32))[
            ..., 0
        ]
    return logits, values


def prompt_positions(mask: jax.Array) -> jax.Array:
    """RoPE positions of left-padded tokens: 0 at the first real token (pads get 0 and are masked)."""
    return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


# ----------------------------------------------------------------------------------------------------------
# plain forward (reference path)


def forward(params: Params, cfg: TransformerConfig, tokens: jax.Array, mask: jax.Array):
    """Causal forward over left-padded sequences.

    tokens, mask: [N, S] (mask 1 for real tokens). Returns (logits [N, S, V] float32, values [N, S] | None);
    position s predicts token s+1."""
    mask = mask.astype(bool)
    s = tokens.shape[-1]
    causal = jnp.tril(jnp.ones((s, s), bool))
    allowed = causal[None, None, None] & mask[:, None, None, None, :]  # [N,1,1,S,S]
    return forward_masked(params, cfg, tokens, prompt_positions(mask), allowed)


def forward_masked(
    params: Params,
    cfg: TransformerConfig,
    tokens: jax.Array,
    positions: jax.Array,
    allowed: jax.Array,
    return_hidden: bool = False,
):
    """The forward over token rows [N, S] with explicit RoPE positions [N, S] and attention mask `allowed`
    (broadcastable to [N, K, group, S, S]: query s may attend key s'), e.g. `forward`'s causal, left-padded
    mask. Returns (logits [N, S, V] float32, or with return_hidden the final-norm output [N, S, D] in the
    compute dtype; values | None)."""
    dtype = _dt(cfg.compute_dtype)

    def context(window, rope, identity):  # (RoPE tables, mask) of a layer variant
        if window is not None:
            near = within_window(positions[:, None, None, :, None], positions[:, None, None, None, :], window)
            return rope_of(cfg, rope, positions, identity), allowed & near
        return rope_of(cfg, rope, positions, identity), allowed

    contexts = attention_contexts(cfg, context)
    x = embed_tokens(cfg, params, tokens, dtype)
    scale = cfg.attn_scale

    def layer(x, lp, ctx):
        pos, allowed = ctx
        h = norm(cfg, x, lp["attn_norm"])
        q, k, v = _qkv(cfg, lp, h, pos, dtype)  # q [N,S,K,g,Dh]
        sc = _scores(cfg, jnp.einsum("nskgd,ntkd->nkgst", q, k, preferred_element_type=jnp.float32) * scale)
        (w,) = _attend_weights([sc], [allowed], dtype)
        o = jnp.einsum("nkgst,ntkd->nskgd", w.astype(dtype), v)
        x = _out_proj(cfg, lp, x, o, dtype)
        return _mlp(cfg, lp, x, dtype)

    x = scan_variant_layers(cfg, params["layers"], layer, x, contexts)
    return _head(cfg, params, x, return_hidden)


# ----------------------------------------------------------------------------------------------------------
# grouped (shared-prompt) forward for training


def forward_grouped(
    params: Params,
    cfg: TransformerConfig,
    prompt: jax.Array,
    prompt_mask: jax.Array,
    completions: jax.Array,
    return_hidden: bool = False,
):
    """Logits of every completion token, with the prompt encoded once per group.

    prompt, prompt_mask: [B, P] left-padded; completions: [B, G, T]. Returns (logits [B, G, T, V] float32,
    values [B, G, T] | None), where logits[b, g, t] is the distribution of completions[b, g, t] (it is read
    from the last prompt position for t = 0 and from completion token t-1 otherwise). Completion tokens after
    EOS are whatever the batch holds; they never influence earlier positions (causality); callers mask them.
    return_hidden=True returns (hidden [B, G, T, D] after the final RMSNorm, in the compute dtype, values)
    instead: logits = hidden @ head_weight(params, cfg), for a head that never materialises them all.
    """
    pmask = prompt_mask.astype(bool)
    plen = jnp.sum(pmask, axis=-1).astype(jnp.int32)  # [B]
    b, g, t = completions.shape
    cpos = plen[:, None, None] + jnp.arange(t, dtype=jnp.int32)  # [B,1,T]: as every sample
    c_to_p = pmask[:, None, None, None, None, :]  # [B,1,1,1,1,P]  (completion -> prompt keys)
    c_causal = jnp.tril(jnp.ones((t, t), bool))[None, None, None, None]  # [1,1,1,1,T,T]
    xp, xc = shared_prompt_layers(params, cfg, prompt, pmask, completions, cpos, c_to_p, c_causal)
    # hidden state that predicts completion token t: last prompt position (t=0), else completion t-1
    last = jnp.broadcast_to(xp[:, None, -1:, :], (b, g, 1, xp.shape[-1]))
    hid = jnp.concatenate([last, xc[:, :, :-1]], axis=2)  # [B,G,T,D]
    return _head(cfg, params, hid, return_hidden)


def shared_prompt_layers(
    params: Params,
    cfg: TransformerConfig,
    prompt: jax.Array,
    pmask: jax.Array,
    completions: jax.Array,
    cpos: jax.Array,
    c_to_p: jax.Array,
    c_self: jax.Array,
    kv_index: jax.Array | None = None,
):
    """The layers of a forward whose completions attend to shared prompt encodings: the prompts [B, P]
    (left-padded, `pmask` bool) are encoded once, and every completion row [C, H, T] (`completions`, RoPE
    positions `cpos` broadcastable to it) attends, in one joint softmax, to the keys of its prompt
    (`c_to_p`, broadcastable to [C, H, K, group, T, P]) and to its own row's keys (`c_self`, to
    [C, H, K, group, T, T]). Completion row c reads prompt kv_index[c] (None: prompt c, C = B): the packed
    update's rows (grpo_jax.policies.packed) gather their group's prompt this way. Returns the residual
    streams after the last layer (xp [B, P, D], xc [C, H, T, D]; no final norm)."""
    dtype = _dt(cfg.compute_dtype)
    p = prompt.shape[-1]
    ppos = prompt_positions(pmask)  # [B,P]
    xp = embed_tokens(cfg, params, prompt, dtype)  # [B,P,D]
    xc = embed_tokens(cfg, params, completions, dtype)  # [C,H,T,D]
    pcausal = jnp.tril(jnp.ones((p, p), bool))
    p_allowed = pcausal[None, None, None] & pmask[:, None, None, None, :]  # [B,1,1,P,P]
    scale = cfg.attn_scale

    def context(window, rope, identity):  # (prompt RoPE, completion RoPE, masks) of a layer variant
        if window is None:
            masks = (p_allowed, c_to_p, c_self)
        else:  # query and key positions laid out as the masks: [.., T(queries), S(keys)]
            cq = jnp.reshape(cpos, (1,) * (3 - jnp.ndim(cpos)) + jnp.shape(cpos))[:, :, None, None, :, None]
            kpp = ppos if kv_index is None else ppos[kv_index]
            masks = (
                p_allowed & within_window(ppos[:, None, None, :, None], ppos[:, None, None, None, :], window),
                c_to_p & within_window(cq, kpp[:, None, None, None, None, :], window),
                c_self & within_window(cq, jnp.swapaxes(cq, -1, -2), window),
            )
        return rope_of(cfg, rope, ppos, identity), rope_of(cfg, rope, cpos, identity), masks

    contexts = attention_contexts(cfg, context)

    def layer(carry, lp, ctx):
        prot, crot, (p_allowed, c_to_p, c_self) = ctx
        xp, xc = carry
        hp = norm(cfg, xp, lp["attn_norm"])
        hc = norm(cfg, xc, lp["attn_norm"])
        qp, kp, vp = _qkv(cfg, lp, hp, prot, dtype)  # qp [B,P,K,g,Dh], kp [B,P,K,Dh]
        qc, kc, vc = _qkv(cfg, lp, hc, crot, dtype)  # qc [C,H,T,K,g,Dh], kc [C,H,T,K,Dh]
        # prompt self-attention
        sp = _scores(cfg, jnp.einsum("bskgd,btkd->bkgst", qp, kp, preferred_element_type=jnp.float32) * scale)
        (wp,) = _attend_weights([sp], [p_allowed], dtype)
        op = jnp.einsum("bkgst,btkd->bskgd", wp.astype(dtype), vp)
        # completion attention: shared prompt keys + own completion keys (joint softmax)
        kq, vq = (kp, vp) if kv_index is None else (kp[kv_index], vp[kv_index])
        s1 = jnp.einsum("bhtkgd,bskd->bhkgts", qc, kq, preferred_element_type=jnp.float32) * scale
        s2 = jnp.einsum("bhtkgd,bhskd->bhkgts", qc, kc, preferred_element_type=jnp.float32) * scale
        w1, w2 = _attend_weights([_scores(cfg, s1), _scores(cfg, s2)], [c_to_p, c_self], dtype)
        oc = jnp.einsum("bhkgts,bskd->bhtkgd", w1.astype(dtype), vq) + jnp.einsum(
            "bhkgts,bhskd->bhtkgd", w2.astype(dtype), vc
        )
        xp = _mlp(cfg, lp, _out_proj(cfg, lp, xp, op, dtype), dtype)
        xc = _mlp(cfg, lp, _out_proj(cfg, lp, xc, oc, dtype), dtype)
        return xp, xc

    return scan_variant_layers(cfg, params["layers"], layer, (xp, xc), contexts)


# ----------------------------------------------------------------------------------------------------------
# KV-cache path for sampling


class KVCache(NamedTuple):
    """Prompt cache shared by a group + per-sample completion cache.

    prompt_k/v: [L, B, K, P, Dh] (read-only during decoding); comp_k/v: tuples of L arrays [B, G, K, T, Dh]
    (one buffer per layer, so each decode step updates them in place); prompt_mask [B, P]; prompt_len [B].
    Below float32 (the bf16 sampler) the decode loop keeps comp_k as [B, G, K, Dh, T] (`keys_positions_last`):
    its multiply-and-reduce over Dh then runs along rows of T contiguous scores instead of reducing each
    [Dh] row to one number (measured in alternating runs: the tiny model's bf16 rollout 0.36-0.39 ->
    0.31-0.33 s, SmolLM2's 4.81-4.83 -> 4.51-4.58 s; the same sampled tokens and log-probs);
    `canonical_cache` gives the layout above back (a sampler's `with_cache` result).
    Heads come before positions so that the attention dots read the caches in place: with positions first,
    XLA:CPU transposed every layer's whole completion cache on every decode step (measured: ~20% of the
    tiny model's decode time). The completion cache is float32 with any compute dtype (a bf16 sampler's
    attention runs in float32): XLA:CPU writes a token into a bf16 buffer by converting the whole buffer
    (measured: a bf16 completion cache made the SmolLM2 decode step slower). The prompt cache, written once,
    is in the compute dtype: k and v are computed in it, so it holds the same values in half the bytes below
    float32 (the one-token attention reads it into its float32 multiply-and-reduce; the same sampled tokens
    and log-probs, half its memory and reads)."""

    prompt_k: jax.Array
    prompt_v: jax.Array
    comp_k: tuple[jax.Array, ...]
    comp_v: tuple[jax.Array, ...]
    prompt_mask: jax.Array
    prompt_len: jax.Array


def keys_positions_last(cfg: TransformerConfig) -> bool:
    """Whether prefill / decode_step keep the completion keys as [B, G, K, Dh, T] (KVCache): below float32,
    where the one-token attention is a multiply-and-reduce. Float32 keeps its batched dots and layout."""
    return jnp.dtype(_dt(cfg.compute_dtype)) != jnp.float32


def canonical_cache(cache: KVCache, cfg: TransformerConfig) -> KVCache:
    """`cache` with comp_k as [B, G, K, T, Dh] whatever layout the decode loop kept (keys_positions_last)."""
    if not keys_positions_last(cfg):
        return cache
    return cache._replace(comp_k=tuple(jnp.swapaxes(k, -1, -2) for k in cache.comp_k))


def grow_cache(cache: KVCache, cfg: TransformerConfig, max_new: int) -> KVCache:
    """`cache` with room for `max_new` completion tokens: its completion buffers zero-padded along the
    positions (in the layout the decode loop keeps, keys_positions_last)."""

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, max_new - x.shape[axis])
        return jnp.pad(x, widths)

    kaxis = -1 if keys_positions_last(cfg) else 3
    return cache._replace(
        comp_k=tuple(pad(k, kaxis) for k in cache.comp_k), comp_v=tuple(pad(v, 3) for v in cache.comp_v)
    )


def split_layers(params: Params) -> list[dict]:
    """The stacked layer parameters as a list of per-layer pytrees (for the unrolled decode loop); params
    whose "layers" is already such a list (a sampler's cast weights, sampling.rollout_weights) give it as is.

    Inside a jitted sampler XLA:CPU materialises each slice of a stacked argument once (the decode loop reads
    them in place); weights produced per layer by a separate call skip that copy."""
    if isinstance(params["layers"], (list, tuple)):
        return list(params["layers"])
    n = jax.tree.leaves(params["layers"])[0].shape[0]
    return [jax.tree.map(lambda a, i=i: a[i], params["layers"]) for i in range(n)]


def prefill(
    params: Params,
    cfg: TransformerConfig,
    prompt: jax.Array,
    prompt_mask: jax.Array,
    group: int,
    max_new: int,
    layers: Sequence[dict] | None = None,
):
    """Encode the prompts once; return (cache with empty completion part, logits [B, V] of the next token).

    The layers run in a `lax.scan` over the stacked parameters, or unrolled over `layers` (split_layers of
    them) when given: the bf16 sampler passes them, because XLA:CPU slices a stacked bf16 operand inside a
    loop by converting the whole stack to float32 first (~0.2 s per SmolLM2 rollout)."""
    dtype = _dt(cfg.compute_dtype)
    pmask = prompt_mask.astype(bool)
    positions = prompt_positions(pmask)
    b, p = prompt.shape
    allowed = jnp.tril(jnp.ones((p, p), bool))[None, None, None] & pmask[:, None, None, None, :]

    if layers is None and isinstance(params["layers"], (list, tuple)):
        layers = params["layers"]  # weights given per layer (split_layers)

    def context(window, rope, identity):  # (RoPE tables, mask) of a layer variant
        if window is not None:
            near = within_window(positions[:, None, None, :, None], positions[:, None, None, None, :], window)
            return rope_of(cfg, rope, positions, identity), allowed & near
        return rope_of(cfg, rope, positions, identity), allowed

    contexts = attention_contexts(cfg, context, stacked=layers is None)
    x = embed_tokens(cfg, params, prompt, dtype)
    scale = cfg.attn_scale

    def layer(x, lp, ctx):
        ppos, allowed = ctx
        h = norm(cfg, x, lp["attn_norm"])
        q, k, v = _qkv(cfg, lp, h, ppos, dtype)
        sc = _scores(cfg, jnp.einsum("bskgd,btkd->bkgst", q, k, preferred_element_type=jnp.float32) * scale)
        (w,) = _attend_weights([sc], [allowed], dtype)
        o = jnp.einsum("bkgst,btkd->bskgd", w.astype(dtype), v)
        x = _mlp(cfg, lp, _out_proj(cfg, lp, x, o, dtype), dtype)
        return x, (jnp.swapaxes(k, 1, 2), jnp.swapaxes(v, 1, 2))  # [B,K,P,Dh]

    if layers is None and len(contexts) == 1:
        # ks [L,B,K,P,Dh]
        x, (ks, vs) = jax.lax.scan(lambda x, lp: layer(x, lp, contexts[0]), x, params["layers"])
    elif layers is None:  # several attention variants: each layer picks its context by index
        stacked = _stack_contexts(contexts)
        idx = jnp.asarray(cfg.layer_variant, jnp.int32)

        def pick(x, xs):
            return layer(x, xs[0], jax.tree.map(lambda a: a[xs[1]], stacked))

        x, (ks, vs) = jax.lax.scan(pick, x, (params["layers"], idx))
    else:
        kv = []
        for lp, vi in zip(layers, cfg.layer_variant, strict=True):
            x, lkv = layer(x, lp, contexts[vi])
            kv.append(lkv)
        ks, vs = (jnp.stack([a[i] for a in kv]) for i in (0, 1))
    logits, _ = _head(cfg, params, x[:, -1])
    shape = (b, group, cfg.n_kv_heads, max_new, cfg.dim_head)
    kshape = (*shape[:3], cfg.dim_head, max_new) if keys_positions_last(cfg) else shape
    f32 = jnp.float32  # the completion cache is float32 whatever the compute dtype (KVCache)
    cache = KVCache(
        prompt_k=ks.astype(dtype),  # k, v are computed in `dtype`: storing them so loses nothing
        prompt_v=vs.astype(dtype),
        comp_k=tuple(jnp.zeros(kshape, f32) for _ in range(cfg.n_layers)),
        comp_v=tuple(jnp.zeros(shape, f32) for _ in range(cfg.n_layers)),
        prompt_mask=pmask,
        prompt_len=jnp.sum(pmask, axis=-1).astype(jnp.int32),
    )
    return cache, logits


def _attend_one(q, pk, pv, ck, cv, pmask, cmask, scale, cap=None):
    """The attention of one new token as multiply-and-reduce (float32): q [B,G,K,g,Dh], prompt cache pk/pv
    [B,K,P,Dh], completion cache ck [B,G,K,Dh,T] (keys_positions_last), cv [B,G,K,T,Dh]; returns
    [B,G,K,g,Dh]; `cap`: the scores' soft-cap (cfg.attn_softcap). With g = 1 (no grouped-query sharing) the
    group axis is dropped first: XLA:CPU's library fusions of a reduce over operands broadcast along size-1
    axes ran ~20x slower (measured on the tiny model's bf16 rollout)."""
    g1 = q.shape[3] == 1
    qq = q[:, :, :, 0] if g1 else q  # [B,G,K,(g,)Dh]

    def per_query(x, shared):  # a cache [B,K,S,Dh] (shared by the group) or [B,G,K,S,Dh], aligned to qq
        x = x[:, None] if shared else x
        return x if g1 else x[:, :, :, None]

    blocks = ((pk, pv, True), (ck, cv, False))
    scores = [  # prompt keys [.., P, Dh] reduced over the last axis, completion keys [.., Dh, T] over -2
        jnp.sum(qq[..., None, :] * per_query(pk, True), axis=-1) * scale,
        jnp.sum(qq[..., :, None] * per_query(ck, False), axis=-2) * scale,
    ]
    if cap is not None:
        scores = [softcap(x, cap) for x in scores]
    weights = _softmax_attend([s.reshape(*q.shape[:4], 1, s.shape[-1]) for s in scores], [pmask, cmask])
    o = sum(
        jnp.sum(w.reshape(*qq.shape[:-1], w.shape[-1])[..., None] * per_query(v, sh), axis=-2)
        for w, (_, v, sh) in zip(weights, blocks, strict=True)
    )
    return o.reshape(q.shape)


def decode_step(
    params: Params,
    cfg: TransformerConfig,
    cache: KVCache,
    tokens: jax.Array,
    t: jax.Array,
    layers: list[dict] | None = None,
):
    """Feed completion token t ([B, G]) at index t; return (cache, logits [B, G, V] for token t+1).

    The layer loop is unrolled (Python) over per-layer cache buffers, so inside the sampler's while loop every
    cache write is an in-place dynamic_update_slice. `layers` = split_layers(params), precomputed once by the
    caller outside its loop (computed here if None)."""
    dtype = _dt(cfg.compute_dtype)
    layers = split_layers(params) if layers is None else layers
    tmax = cache.comp_v[0].shape[3]
    qpos = (cache.prompt_len[:, None] + t).astype(jnp.int32)[..., None]  # [B,1,1]: the new token's position
    pmask = cache.prompt_mask[:, None, None, None, None, :]  # [B,1,1,1,1,P]
    cmask = (jnp.arange(tmax) <= t)[None, None, None, None, None, :]  # [1,1,1,1,1,T]

    def context(window, rope, identity):  # (RoPE tables, prompt mask, completion mask) of a layer variant
        rot = rope_of(cfg, rope, qpos, identity)
        if window is None:
            return rot, pmask, cmask
        # a sliding layer sees the last `window` positions: completion keys j > t - window, prompt keys at
        # positions > prompt_len + t - window (a left-padded row's positions count its real tokens only)
        ppos = prompt_positions(cache.prompt_mask)  # [B,P]
        near_p = within_window(cache.prompt_len[:, None] + t, ppos, window)[:, None, None, None, None, :]
        near_c = within_window(t, jnp.arange(tmax), window)[None, None, None, None, None, :]
        return rot, pmask & near_p, cmask & near_c

    contexts = attention_contexts(cfg, context, stacked=False)
    x = embed_tokens(cfg, params, tokens, dtype)[:, :, None, :]  # [B,G,1,D]
    scale = cfg.attn_scale
    # below float32 (the bf16 rollout sampler): the attention of the single new token as multiply-and-reduce
    # over the float32 cache, fused loops instead of XLA:CPU's batched dots on [Dh]-sized per-head matrices
    # with operands converted every step (measured: the SmolLM2 bf16 rollout 15 % faster). float32 keeps the
    # batched dots (the same rewrite measured within noise there, and its sampled tokens stay bit-identical)
    reduce_attn = keys_positions_last(cfg)  # below float32; its completion keys are [B,G,K,Dh,T]
    comp_k, comp_v = list(cache.comp_k), list(cache.comp_v)
    for li, lp in enumerate(layers):
        pos, pm, cm = contexts[cfg.layer_variant[li]]
        h = norm(cfg, x, lp["attn_norm"])
        q, k, v = _qkv(cfg, lp, h, pos, dtype)  # q [B,G,1,K,g,Dh], k [B,G,1,K,Dh]
        # k [B,G,1,K,Dh] -> [B,G,K,Dh,1] at column t (keys_positions_last), else [B,G,K,1,Dh] at row t
        kt, at = (
            (jnp.moveaxis(k, 2, 4), (0, 0, 0, 0, t))
            if reduce_attn
            else (jnp.swapaxes(k, 2, 3), (0, 0, 0, t, 0))
        )
        ck = comp_k[li] = jax.lax.dynamic_update_slice(comp_k[li], kt.astype(comp_k[li].dtype), at)
        cv = comp_v[li] = jax.lax.dynamic_update_slice(
            comp_v[li], jnp.swapaxes(v, 2, 3).astype(comp_v[li].dtype), (0, 0, 0, t, 0)
        )
        pk, pv = cache.prompt_k[li], cache.prompt_v[li]  # [B,K,P,Dh]
        if reduce_attn:
            qf = q[:, :, 0].astype(jnp.float32)
            o = _attend_one(qf, pk, pv, ck, cv, pm, cm, scale, cfg.attn_softcap)[:, :, None]
        else:
            s1 = jnp.einsum("bhtkgd,bksd->bhkgts", q, pk, preferred_element_type=jnp.float32) * scale
            s2 = jnp.einsum("bhtkgd,bhksd->bhkgts", q, ck, preferred_element_type=jnp.float32) * scale
            w1, w2 = _softmax_attend([_scores(cfg, s1), _scores(cfg, s2)], [pm, cm])
            o = jnp.einsum("bhkgts,bksd->bhtkgd", w1.astype(dtype), pv) + jnp.einsum(
                "bhkgts,bhksd->bhtkgd", w2.astype(dtype), cv
            )
        x = _mlp(cfg, lp, _out_proj(cfg, lp, x, o, dtype), dtype)
    logits, _ = _head(cfg, params, x[:, :, 0])
    return cache._replace(comp_k=tuple(comp_k), comp_v=tuple(comp_v)), logits


# ----------------------------------------------------------------------------------------------------------
# token log-probabilities


def token_logp(logits: jax.Array, tokens: jax.Array, temperature: float | jax.Array = 1.0):
    """(logp of `tokens` under softmax(logits / temperature), per-position entropy), both float32."""
    lg = logits.astype(jnp.float32) / temperature
    lsm = jax.nn.log_softmax(lg, axis=-1)
    logp = jnp.take_along_axis(lsm, tokens[..., None], axis=-1)[..., 0]
    ent = -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)
    return logp, ent
