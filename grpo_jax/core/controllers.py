"""Adaptive coefficient controllers and scalar schedules (GRPO_MATH.md §2, §3 rows 11–12, T9).

Controllers are optax-style `Controller(init, update)` pairs over NamedTuple states of float32 scalars:

    ctrl = make_controller("skywork_entropy", target=0.2)
    state = ctrl.init()
    state = ctrl.update(state, measured_value)           # ziegler_kl: update(state, kl, n_steps)
    coef = state.coef                                    # every state exposes the coefficient as `.coef`

`update` is pure and uses only jnp.where (no Python branches on values), so it can sit inside the jitted train
step and a changed coefficient never recompiles. The controller's constants (target, band, caps) are Python
floats closed over at construction: they are configuration, not state. Every `update` also accepts an
`n_steps` keyword (used only by the Ziegler controller) so a trainer can call all of them the same way.

Schedules map a (possibly traced) integer step to a value: `piecewise_constant`, `linear`.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

CONTROLLER_KINDS = ("seed_entropy", "skywork_entropy", "ppo_adaptive_kl", "ziegler_kl", "constant")


class Controller(NamedTuple):
    """An (init, update) pair. init() -> state; update(state, value, n_steps=...) -> state."""

    init: Callable[[], Any]
    update: Callable[..., Any]


class CoefState(NamedTuple):
    """State of single-coefficient controllers (seed entropy, PPO adaptive KL, Ziegler KL, constant)."""

    coef: jax.Array  # [] float32


class SkyworkEntropyState(NamedTuple):
    """State of the Skywork-OR1 adaptive entropy controller."""

    coef: jax.Array  # [] the coefficient c_{k+1} for the NEXT step
    applied: jax.Array  # [] the coefficient applied THIS step: c_k if H_k <= target else 0


def _scalar(x) -> jax.Array:
    return jnp.asarray(x, jnp.float32)


def seed_entropy_controller(
    init_coef: float = 0.01,
    target: float = 2.0,
    *,
    low: float = 0.8,
    high: float = 1.2,
    up: float = 1.2,
    down: float = 0.8,
    min_coef: float = 0.001,
    max_coef: float = 0.02,
) -> Controller:
    """The seed document's `adjust_entropy` rule (GRPO_MATH.md §3 row 11, T9). Its constants come from the
    seed document, NOT from a paper (structural relatives: PPO adaptive KL, Skywork-OR1 adaptive entropy):

        H < low·target   ->  c ← min(max_coef, up·c)
        H > high·target  ->  c ← max(min_coef, down·c)
        otherwise        ->  c unchanged (dead band)

    It is meant to drive an ENTROPY-BONUS coefficient (raising it when entropy is low). The seed applied it to
    its β, which multiplies a KL term; there the rule does not directly raise entropy (§3 row 11).
    T9 (target 2.0): (0.01, H=1.5) -> 0.012; (0.01, 2.5) -> 0.008; (0.01, 2.0) -> 0.01;
    (0.019, 1.0) -> 0.02 (cap); (0.0011, 3.0) -> 0.001 (floor).
    """

    def init() -> CoefState:
        return CoefState(coef=_scalar(init_coef))

    def update(state: CoefState, entropy, n_steps=None) -> CoefState:
        del n_steps
        c = _scalar(state.coef)
        h = _scalar(entropy)
        raised = jnp.minimum(max_coef, up * c)
        lowered = jnp.maximum(min_coef, down * c)
        c_new = jnp.where(h < low * target, raised, jnp.where(h > high * target, lowered, c))
        return CoefState(coef=c_new)

    return Controller(init, update)


def skywork_entropy_controller(
    init_coef: float = 0.01,
    target: float = 0.2,
    delta: float = 0.005,
    min_coef: float = 0.0,
    max_coef: float | None = None,
) -> Controller:
    """Skywork-OR1 adaptive entropy control (He et al. 2025, arXiv 2505.22312; TRL `use_adaptive_entropy`;
    GRPO_MATH.md §3 row 11, T9):

        applied_k = c_k · 1[H_k <= target]                               (coefficient used at step k)
        c_{k+1}   = clip(c_k + Δ·sign(target − H_k), min_coef, max_coef)

    update(state, H) -> state with `applied` (this step's coefficient) and `coef` (next step's).
    T9 (c=0.01, target=0.2, Δ=0.005): H=0.15 -> (0.01, 0.015); H=0.3 -> (0.0, 0.005).
    """

    def init() -> SkyworkEntropyState:
        return SkyworkEntropyState(coef=_scalar(init_coef), applied=_scalar(init_coef))

    def update(state: SkyworkEntropyState, entropy, n_steps=None) -> SkyworkEntropyState:
        del n_steps
        c = _scalar(state.coef)
        h = _scalar(entropy)
        applied = jnp.where(h <= target, c, 0.0)
        c_new = c + delta * jnp.sign(target - h)
        c_new = jnp.maximum(c_new, min_coef)
        if max_coef is not None:
            c_new = jnp.minimum(c_new, max_coef)
        return SkyworkEntropyState(coef=c_new, applied=applied)

    return Controller(init, update)


def ppo_adaptive_kl_controller(init_coef: float = 1.0, target: float = 0.01) -> Controller:
    """PPO adaptive KL penalty (Schulman et al. 2017, arXiv 1707.06347 §4; GRPO_MATH.md §2, T9):

        d < target/1.5  ->  β ← β/2          d > 1.5·target  ->  β ← 2β          otherwise unchanged

    update(state, kl) where kl is the measured KL d. T9 (β=1, target=0.01): d=0.003 -> 0.5; d=0.02 -> 2.0.
    """

    def init() -> CoefState:
        return CoefState(coef=_scalar(init_coef))

    def update(state: CoefState, kl, n_steps=None) -> CoefState:
        del n_steps
        c = _scalar(state.coef)
        d = _scalar(kl)
        c_new = jnp.where(d < target / 1.5, c / 2.0, jnp.where(d > target * 1.5, c * 2.0, c))
        return CoefState(coef=c_new)

    return Controller(init, update)


def ziegler_kl_controller(init_coef: float, target: float, horizon: int) -> Controller:
    """Proportional KL controller (Ziegler et al. 2019, arXiv 1909.08593; verl/TRL AdaptiveKLController;
    GRPO_MATH.md T9):

        e = clip(KL/target − 1, −0.2, 0.2)          β ← β · (1 + e · n_steps / horizon)

    update(state, kl, n_steps). T9 (β=0.1, target=6, horizon=10000, n=256): KL=9 -> 0.100512;
    KL=5 -> 0.099573.
    """
    if horizon <= 0 or target <= 0:
        raise ValueError(
            f"ziegler_kl_controller needs target > 0 and horizon > 0; got {target=}, {horizon=}."
        )

    def init() -> CoefState:
        return CoefState(coef=_scalar(init_coef))

    def update(state: CoefState, kl, n_steps=1) -> CoefState:
        c = _scalar(state.coef)
        e = jnp.clip(_scalar(kl) / target - 1.0, -0.2, 0.2)
        return CoefState(coef=c * (1.0 + e * _scalar(n_steps) / horizon))

    return Controller(init, update)


def constant_controller(coef: float | None = None, *, init_coef: float | None = None) -> Controller:
    """A controller whose coefficient never changes (update returns the state unchanged).

    `init_coef` is accepted as an alias of `coef` so every kind can be built with `init_coef=`.
    """
    if (coef is None) == (init_coef is None):
        raise ValueError("constant_controller needs exactly one of coef / init_coef.")
    coef = coef if coef is not None else init_coef

    def init() -> CoefState:
        return CoefState(coef=_scalar(coef))

    def update(state: CoefState, value=None, n_steps=None) -> CoefState:
        del value, n_steps
        return CoefState(coef=_scalar(state.coef))

    return Controller(init, update)


_FACTORIES = {
    "seed_entropy": seed_entropy_controller,
    "skywork_entropy": skywork_entropy_controller,
    "ppo_adaptive_kl": ppo_adaptive_kl_controller,
    "ziegler_kl": ziegler_kl_controller,
    "constant": constant_controller,
}


def make_controller(kind: str, **kwargs) -> Controller:
    """Build a controller by name: one of CONTROLLER_KINDS; kwargs go to the matching factory."""
    if kind not in _FACTORIES:
        raise ValueError(f"make_controller: unknown kind {kind!r}; valid kinds are {CONTROLLER_KINDS}.")
    return _FACTORIES[kind](**kwargs)


# ------------------------------------------------------------------------------------------------------------
# schedules
# ------------------------------------------------------------------------------------------------------------


def piecewise_constant(boundaries: Sequence[int], values: Sequence[float]) -> Callable[[Any], jax.Array]:
    """Piecewise-constant schedule: values[i] for boundaries[i−1] <= step < boundaries[i].

    len(values) == len(boundaries) + 1; boundaries strictly increasing. The returned callable takes a Python
    or traced integer step (jnp.searchsorted, side="right") and returns values' dtype (int values stay int,
    e.g. a pool size). Example: boundaries (100, 500), values (0.03, 0.01, 0.005): step 99 -> 0.03,
    100 -> 0.01, 499 -> 0.01, 500 -> 0.005.
    """
    b = list(boundaries)
    v = list(values)
    if len(v) != len(b) + 1:
        raise ValueError(
            f"piecewise_constant needs len(values) == len(boundaries) + 1; "
            f"got {len(v)} values, {len(b)} boundaries."
        )
    if any(b1 >= b2 for b1, b2 in zip(b, b[1:], strict=False)):
        raise ValueError(f"piecewise_constant needs strictly increasing boundaries; got {b}.")
    b_arr = jnp.asarray(b, jnp.int32)
    v_arr = jnp.asarray(v)
    if jnp.issubdtype(v_arr.dtype, jnp.floating):
        v_arr = v_arr.astype(jnp.float32)

    def schedule(step) -> jax.Array:
        return v_arr[jnp.searchsorted(b_arr, jnp.asarray(step, jnp.int32), side="right")]

    return schedule


def linear(start: float, end: float, steps: int) -> Callable[[Any], jax.Array]:
    """Linear ramp: start + (end − start)·clip(step/steps, 0, 1); constant `end` after `steps`. float32."""
    if steps <= 0:
        raise ValueError(f"linear schedule needs steps > 0; got {steps}.")

    def schedule(step) -> jax.Array:
        frac = jnp.clip(jnp.asarray(step, jnp.float32) / steps, 0.0, 1.0)
        return jnp.float32(start) + (jnp.float32(end) - jnp.float32(start)) * frac

    return schedule


# The seed document's staged schedule (GRPO_MATH.md §3 row 12; invented there, harmless, NOT a default):
# β 0.03 for epochs [0, 100), 0.01 for [100, 500), 0.005 from 500; pool size K 8 / 16 / 32 at the same
# boundaries. The seed calls β its "entropy regularisation coefficient" though it multiplies a KL term
# (§3 row 3).
# Each entry is a (boundaries, values) tuple for `piecewise_constant`.
SEED_EPOCH_SCHEDULE = types.MappingProxyType(
    {
        "beta": ((100, 500), (0.03, 0.01, 0.005)),
        "pool_size": ((100, 500), (8, 16, 32)),
    }
)
