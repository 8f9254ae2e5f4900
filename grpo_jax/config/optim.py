"""The optimiser section: AdamW, micro-batches and the padding-free (packed) update."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.base import _positive, opt
from grpo_jax.errors import fail


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """AdamW with global-norm gradient clipping and linear warm-up; non-finite updates are skipped."""

    FLAG_PREFIX: ClassVar[str] = ""
    learning_rate: float = opt(1e-4, "GRPO AdamW learning rate.")
    warmup_steps: int = opt(0, "Linear learning-rate warm-up steps.")
    weight_decay: float = opt(0.0, "AdamW weight decay.")
    grad_clip: float = opt(1.0, "Global gradient-norm clip.")
    b1: float = opt(0.9, "Adam β1.", flag="adam_b1")
    b2: float = opt(0.999, "Adam β2.", flag="adam_b2")
    eps: float = opt(1e-8, "Adam ε.", flag="adam_eps")
    max_consecutive_nonfinite: int = opt(
        1000, "Non-finite gradients skipped in a row before the run stops updating (optax.apply_if_finite)."
    )
    micro_batches: int = opt(
        1,
        "Gradient accumulation: each update's (mini-)batch is processed in this many micro-batches, "
        "normalised by the whole batch's sequence / token counts (the same update, less memory).",
    )
    pack_tokens: int = opt(
        0,
        "The padding-free update (grpo_jax.policies.packed): each prompt encoded once for its group, and the "
        "group's completions (whole multi-turn trajectories) packed back to back into rows of this many "
        "tokens that attend to that prompt, attention masked per completion; the loss, gradient and metrics "
        "are the padded update's to float rounding. 0 = the padded update. Must hold the longest completion "
        "(>= max_turns * max_new_tokens + (max_turns - 1) * feedback_tokens); not with --mini_batches > 1. "
        "When to use it: docs/ROLLOUT_ENGINES.md.",
    )
    pack_rows_per_doubling: int = opt(
        2,
        "The packed update's row counts: exact up to 2k rows, then k sizes per doubling (k = 2: 1, 2, 3, 4, "
        "6, 8, 12, 16, 24, ..). Each row count the steps need is one compilation of the train step: a larger "
        "k computes fewer empty rows and compiles more often (8 suits a model whose step costs far more than "
        "a compile, e.g. SmolLM2 at 512 new tokens; 2 a model that compiles in seconds and steps in less).",
    )

    def __post_init__(self):
        _positive(
            self,
            (
                "learning_rate",
                "grad_clip",
                "eps",
                "max_consecutive_nonfinite",
                "micro_batches",
                "pack_rows_per_doubling",
            ),
        )
        _positive(self, ("weight_decay", "warmup_steps", "pack_tokens"), strict=False)
        for n in ("b1", "b2"):
            if not 0 <= getattr(self, n) < 1:
                fail(self, n, "must be in [0, 1)")
