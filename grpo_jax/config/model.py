"""The policy's sections: the model (a checkpoint, or the shape of one trained from scratch) and LoRA."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, _positive, opt
from grpo_jax.errors import fail
from grpo_jax.policies.lora import TARGETS as LORA_TARGETS
from grpo_jax.policies.transformer import REMAT_POLICIES
from grpo_jax.pretrained.api import resolve as resolve_checkpoint

DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The transformer policy (grpo_jax.policies.transformer): a pretrained checkpoint (`init_from`, with its
    own architecture and tokenizer) or one trained from scratch with the shape below and the procedural
    512-id tokenizer."""

    FLAG_PREFIX: ClassVar[str] = ""
    init_from: str = opt(
        "",
        "Pretrained checkpoint: a Hugging Face directory (config.json + safetensors), a "
        ".gguf file, or a known name (smollm2-135m-instruct); its architecture replaces the "
        "shape flags below. Empty = a random init of that shape. A pretrained model's defaults are no SFT "
        "(--sft_steps=0) and chat prompts (--prompt_format=chat) unless those flags are given.",
    )
    tokenizer: str = opt(
        "",
        "Tokenizer (a directory with tokenizer.json, or a .gguf file); empty = the "
        "checkpoint's own (init_from), or the procedural 512-id tokenizer without one.",
    )
    remat: str = opt(
        "dots_no_batch",
        "Per-layer rematerialisation in the backward pass: none (keep everything) | full (recompute "
        "each layer from its input) | dots (keep matmul outputs) | dots_no_batch (keep the projections' "
        "outputs, recompute the elementwise ops and attention scores). The default keeps less than none and "
        "the backward reads less memory: smaller and faster than none on CPU (experiments.bench; the "
        "figures: docs/results/step_benchmark.md).",
        choices=REMAT_POLICIES,
    )
    logp_chunk: int = opt(
        0,
        "Compute token log-probs and entropies from the LM head in chunks of this many "
        "positions, never materialising [B, G, T, V] logits (0 = full logits).",
    )
    d_model: int = opt(128, "Model width.")
    n_layers: int = opt(2, "Transformer layers.")
    n_heads: int = opt(4, "Query heads.")
    n_kv_heads: int = opt(2, "Key/value heads (grouped-query attention).")
    d_ff: int = opt(512, "MLP width.")
    qkv_bias: bool = opt(True, "Bias on the q/k/v projections (Qwen2).")
    tie_embeddings: bool = opt(True, "Tie the LM head to the embedding.")
    compute_dtype: str = opt(
        "float32",
        "Compute dtype: float32, bfloat16 or float16 (master weights, logits, "
        "log-softmax, ratios and KL stay float32).",
        choices=DTYPES,
    )

    def __post_init__(self):
        for name in ("init_from", "tokenizer"):
            if getattr(self, name):
                try:
                    resolve_checkpoint(getattr(self, name))
                except FileNotFoundError as e:
                    fail(self, name, str(e).split(": ", 1)[-1])
        _positive(self, ("logp_chunk",), strict=False)
        _positive(self, ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff"))
        if self.d_model % self.n_heads:
            fail(self, "n_heads", f"must divide d_model={self.d_model}")
        if self.n_heads % self.n_kv_heads:
            fail(self, "n_kv_heads", f"must divide n_heads={self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            fail(self, "n_heads", f"d_model / n_heads = {self.d_model // self.n_heads} must be even (RoPE)")
        _choice(self, "compute_dtype", DTYPES)
        _choice(self, "remat", REMAT_POLICIES)
        _check_sub_settings(self, "model", SUB_SETTINGS)


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Train LoRA adapters only (Hu et al. 2021), the base frozen; rank 0 = full fine-tuning. The reference
    policy is then the base (initial adapters have B = 0) and a policy pool stores adapters only."""

    FLAG_PREFIX: ClassVar[str] = "lora_"
    rank: int = opt(0, "LoRA rank (0 = full fine-tuning).")
    alpha: float = opt(16.0, "LoRA alpha (scale alpha / rank).")
    targets: tuple[str, ...] = opt(LORA_TARGETS, "Projections that get adapters.")

    def __post_init__(self):
        _positive(self, ("rank",), strict=False)
        _positive(self, ("alpha",))
        if not self.targets or any(t not in LORA_TARGETS for t in self.targets):
            fail(self, "targets", f"a non-empty subset of {', '.join(LORA_TARGETS)}")
        _check_sub_settings(self, "lora", SUB_SETTINGS)

    @property
    def enabled(self) -> bool:
        return self.rank > 0


# the sub-settings of these sections' optional mechanisms (base.Mechanism: one rule)
SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "from_scratch",
        "model",
        "no --init_from",
        "a model trained from scratch: a checkpoint brings its own architecture",
        lambda m: not m.init_from,
        lambda m: f"--init_from={m.init_from}",
        ("d_model", "n_layers", "n_heads", "n_kv_heads", "d_ff", "qkv_bias", "tie_embeddings"),
        fix="drop it (the checkpoint's config.json / GGUF metadata decides the shape)",
    ),
    Mechanism(
        "lora",
        "lora",
        "--lora_rank > 0",
        "LoRA adapters",
        lambda lo: lo.rank > 0,
        lambda lo: f"--lora_rank={lo.rank}",
        ("alpha", "targets"),
    ),
)
