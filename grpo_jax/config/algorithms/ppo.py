"""--algorithm=ppo: token-level PPO with a value-head critic (grpo_jax.algorithms.ppo). Its config in one
place: the section of its knobs (--ppo_*), what it refuses, and its registration."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.config.algorithms.registry import AlgorithmSpec, register
from grpo_jax.config.base import _choice, _positive, opt
from grpo_jax.core.kl import KL_KINDS
from grpo_jax.errors import fail


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """PPO for the language model (--algorithm=ppo; GRPO_MATH.md §2; TRL PPOTrainer's defaults).

    The critic is a scalar value head on the policy transformer (shared trunk: one extra D -> 1 projection
    of the final hidden state, zero-initialised; its gradient from the value loss reaches the trunk). Per
    token: r_t = −β·k(log π_old − log π_ref) (β = --kl_coef, k = kl_estimator; none without a reference),
    plus the sandbox reward of the completion on its last valid token; GAE with V after the last token = 0;
    returns R̂ = Â + V_old; Â whitened over the batch's valid tokens; loss = the clipped surrogate of
    PolicyLossConfig on those per-token Â + vf_coef · 0.5·max((V−R̂)², (clip(V, V_old ± cliprange_value)−R̂)²).
    """

    FLAG_PREFIX: ClassVar[str] = "ppo_"
    gamma: float = opt(1.0, "--algorithm=ppo: GAE discount γ over tokens, in [0, 1] (TRL: 1).")
    lam: float = opt(0.95, "--algorithm=ppo: GAE λ, in [0, 1] (TRL: 0.95).")
    vf_coef: float = opt(
        0.1,
        "--algorithm=ppo: value-loss coefficient c_v (TRL: 0.1); the critic is a value head on the policy's "
        "trunk, so this also weighs how much the value loss moves the shared layers.",
    )
    cliprange_value: float = opt(
        0.2, "--algorithm=ppo: value clip ε_v: V is clipped to V_old ± ε_v in the value loss (TRL: 0.2)."
    )
    whiten_advantages: bool = opt(
        True, "--algorithm=ppo: whiten the GAE advantages over the batch's valid tokens (TRL: on)."
    )
    kl_estimator: str = opt(
        "k1",
        "--algorithm=ppo: KL estimate k_t of the KL-shaped per-token reward r_t = −β·k_t, β = --kl_coef "
        "(TRL kl_estimator: k1 = log π_old − log π_ref).",
        choices=KL_KINDS,
    )

    def __post_init__(self):
        for name in ("gamma", "lam"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                fail(self, name, "must be in [0, 1]")
        _positive(self, ("vf_coef",), strict=False)
        _positive(self, ("cliprange_value",))
        _choice(self, "kl_estimator", KL_KINDS)


def _check(o) -> None:
    """What --algorithm=ppo cannot be combined with in the objective (ObjectiveConfig `o`): group-relative
    advantage machinery, and a KL form other than the KL-shaped reward against π_ref."""
    why = "with --algorithm=ppo the advantages are GAE over tokens from the value head"
    if o.adv_method != "grpo":
        fail(o, "adv_method", f"{why}, not a group estimator: leave it at grpo (unused)")
    if o.baseline != "group":
        fail(o, "baseline", f"{why}, not a pool baseline: use group (unused)")
    if o.multiscale_w_tests > 0:
        fail(o, "multiscale_w_tests", f"{why}: multi-scale group advantages do not apply, use 0")
    if o.loss.kl_anchor != "ref":
        fail(
            o,
            "loss.kl_anchor",
            "with --algorithm=ppo the KL is a per-token reward against π_ref: use ref",
        )
    if o.loss.importance_level != "token":
        fail(
            o,
            "loss.importance_level",
            "with --algorithm=ppo every token has its own advantage and ratio: use token",
        )


def _check_run(c) -> None:
    """What --algorithm=ppo cannot be combined with in the run (RunConfig `c`): LoRA, DAPO's filter."""
    if c.lora.enabled:
        fail(
            c,
            "lora.rank",
            "--algorithm=ppo trains a value head on the policy, which LoRA would leave frozen in the "
            "base (zero): use lora_rank=0 (full fine-tuning) with PPO",
        )
    if c.rollout.dynamic_sampling:
        fail(
            c,
            "rollout.dynamic_sampling",
            "DAPO's filter drops groups whose rewards are all equal (no GRPO gradient), but PPO learns "
            "from them (critic, KL-shaped rewards) and its refills would break the compute match with "
            "GRPO: drop it with --algorithm=ppo",
        )


register(
    AlgorithmSpec(
        name="ppo",
        order=1,
        help="ppo (token-level PPO: a value head on the policy transformer's shared trunk as the critic, "
        "KL-shaped per-token rewards with the sandbox reward on the last token, GAE; the same rollout of "
        "prompts_per_step x group_size completions; --ppo_* flags)",
        section=PPOConfig,
        what="token-level PPO",
        kl_fields=("kl_estimator",),
        check=_check,
        check_run=_check_run,
        without_group_advantages="PPO's are GAE from its value head",
        without_loss_kl="--algorithm=ppo puts the KL in the per-token reward, with --ppo_kl_estimator",
        without_multi_turn="PPO's critic is not trained on trajectories",
    )
)
