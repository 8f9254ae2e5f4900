"""The adaptive coefficient controller (grpo_jax.core.controllers) of the entropy bonus or the KL penalty:
ControllerConfig, the objective's `controller` section, and which parameters each kind takes."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, opt
from grpo_jax.core.controllers import CONTROLLER_KINDS, KL_CONTROLLERS
from grpo_jax.errors import fail

# multiplicative controllers: a coefficient that starts at 0 stays 0
_MULTIPLICATIVE = ("seed_entropy", "ppo_adaptive_kl", "ziegler_kl")
# which optional controller parameters each kind takes (grpo_jax.core.controllers factories)
CONTROLLER_PARAMS = {
    "constant": (),
    "seed_entropy": ("target", "low", "high", "up", "down", "min_coef", "max_coef"),
    "skywork_entropy": ("target", "delta", "min_coef", "max_coef"),
    "ppo_adaptive_kl": ("target",),
    "ziegler_kl": ("target", "horizon"),
}


@dataclasses.dataclass(frozen=True)
class ControllerConfig:
    """An adaptive coefficient controller (grpo_jax.core.controllers) and the coefficient it drives.

    The parameters left at None take the controller's own defaults; giving one the kind does not take is an
    error (CONTROLLER_PARAMS lists which kind takes which; SUB_SETTINGS has the rule).
    """

    FLAG_PREFIX: ClassVar[str] = "controller_"
    kind: str = opt(
        "constant",
        "Adaptive coefficient controller: constant, seed_entropy (the seed's x1.2/x0.8 "
        "rule), skywork_entropy (Skywork-OR1), ppo_adaptive_kl (PPO), ziegler_kl (Ziegler et al.).",
        flag="controller",
        choices=CONTROLLER_KINDS,
    )
    acts_on: str = opt(
        "auto",
        "The coefficient it drives: auto (entropy controllers -> entropy_coef, KL "
        "controllers -> kl_coef), entropy_coef, or kl_coef (the seed's literal reading).",
        choices=("auto", "entropy_coef", "kl_coef"),
    )
    target: float | None = opt(
        None,
        "Target of the measured entropy / KL (none = the controller's default: "
        "seed 2.0, skywork 0.2, ppo 0.01, ziegler 6.0).",
    )
    horizon: int | None = opt(None, "ziegler_kl horizon (none = 10000): β ← β(1 + e·n/horizon).")
    delta: float | None = opt(None, "skywork_entropy step Δ of the coefficient (none = 0.005).")
    min_coef: float | None = opt(None, "Lower bound of the coefficient (seed_entropy, skywork_entropy).")
    max_coef: float | None = opt(None, "Upper bound of the coefficient (seed_entropy, skywork_entropy).")
    low: float | None = opt(None, "seed_entropy: raise when H < low·target (none = 0.8).")
    high: float | None = opt(None, "seed_entropy: lower when H > high·target (none = 1.2).")
    up: float | None = opt(None, "seed_entropy: raise factor (none = 1.2).")
    down: float | None = opt(None, "seed_entropy: lower factor (none = 0.8).")

    def __post_init__(self):
        _choice(self, "kind", CONTROLLER_KINDS)
        _choice(self, "acts_on", ("auto", "entropy_coef", "kl_coef"))
        for name in ("target", "horizon", "delta", "up", "down", "low", "high"):
            if getattr(self, name) is not None and not getattr(self, name) > 0:
                fail(self, name, "must be > 0")
        _check_sub_settings(self, "objective.controller", SUB_SETTINGS)

    @property
    def measures(self) -> str:
        return "kl" if self.kind in KL_CONTROLLERS else "entropy"

    @property
    def drives(self) -> str | None:
        """The coefficient the controller moves: "kl_coef", "entropy_coef", or None (constant)."""
        if self.kind == "constant":
            return None
        if self.acts_on != "auto":
            return self.acts_on
        return "kl_coef" if self.kind in KL_CONTROLLERS else "entropy_coef"

    def params(self) -> dict[str, float]:
        """Factory keyword arguments: the parameters that were given."""
        return {n: getattr(self, n) for n in CONTROLLER_PARAMS[self.kind] if getattr(self, n) is not None}


def _controller_mechanisms() -> tuple[Mechanism, ...]:
    """One mechanism per optional controller parameter: the controllers that take it (CONTROLLER_PARAMS)."""
    out = []
    for name in ("target", "horizon", "delta", "min_coef", "max_coef", "low", "high", "up", "down"):
        kinds = tuple(k for k, ps in CONTROLLER_PARAMS.items() if name in ps)

        def on(c: Any, kinds: tuple[str, ...] = kinds) -> bool:
            return c.kind in kinds

        out.append(
            Mechanism(
                f"controller:{name}",
                "objective.controller",
                "--controller=" + "|".join(kinds),
                "a parameter of those controllers",
                on,
                lambda c: f"--controller={c.kind}",
                (name,),
            )
        )
    return tuple(out)


# the sub-settings of the controller (base.Mechanism: one rule)
SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "adaptive_controller",
        "objective.controller",
        "--controller=" + "|".join(k for k in CONTROLLER_PARAMS if k != "constant"),
        "an adaptive controller; a constant one drives nothing",
        lambda c: c.kind != "constant",
        lambda c: f"--controller={c.kind}",
        ("acts_on",),
    ),
    *_controller_mechanisms(),
)
