"""Adaptive coefficient controllers and scalar schedules (docs/GRPO_MATH.md §2, §3 rows 11–12, T9).

Every controller is one `Controller(init, update, applied)` triple over a NamedTuple state of float32 scalars,
called the same way whatever its kind (no duck typing):

    ctrl = make_controller("skywork_entropy", target=0.2)
    state = ctrl.init()
    coef = ctrl.applied(state, measured)                 # the coefficient THIS step uses (given this batch)
    state = ctrl.update(state, measured, n_steps=n)      # the state for the NEXT step
    state.coef                                           # every state exposes its current coefficient

For most kinds `applied(state, x) == state.coef`; Skywork's adaptive entropy applies c·1[H ≤ target] (it
depends on the batch's own entropy), and `piecewise` (a β schedule) ignores the measurement. `n_steps` is used
only by the Ziegler controller. Everything is pure and uses only jnp.where (no Python branches on values), so
it sits inside the jitted train step and a changed coefficient never recompiles. The constants (target, band,
caps, schedule) are Python floats closed over at construction: configuration, not state.

Schedules map a (possibly traced) integer step to a value: `piecewise_constant`, `linear`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

# kinds a run can select (grpo_jax.config.ControllerConfig); "piecewise" is the β schedule (--kl_schedule)
CONTROLLER_KINDS = ("seed_entropy", "skywork_entropy", "ppo_adaptive_kl", "ziegler_kl", "constant")
ENTROPY_CONTROLLERS = ("seed_entropy", "skywork_entropy")  # measure the policy entropy
KL_CONTROLLERS = ("ppo_adaptive_kl", "ziegler_kl")  # measure the KL estimate


def _current(state, measured=None):
    del measured
    return state.coef


class Controller(NamedTuple):
    """init() -> state; applied(state, measured) -> this step's coefficient; update(state, measured,
    n_steps=None) -> next state. `measures` names the signal `measured` must be: "entropy" (the batch's mean
    policy entropy), "kl" (its mean KL estimate) or "none" (constant and schedules ignore it)."""

    init: Callable[[], Any]
    update: Callable[..., Any]
    applied: Callable[..., jax.Array] = _current
    measures: str = "none"


class CoefState(NamedTuple):
    """State of the controllers: the current coefficient."""

    coef: jax.Array  # [] float32


class ScheduleState(NamedTuple):
    """State of the `piecewise` schedule: the coefficient of the current step and the step count."""

    coef: jax.Array  # [] float32
    t: jax.Array  # [] int32 updates so far


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
    """The seed document's `adjust_entropy` rule (docs/GRPO_MATH.md §3 row 11, T9). Its constants come
    from the seed document, NOT from a paper (structural relatives: PPO adaptive KL, Skywork-OR1 adaptive
    entropy):

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

    return Controller(init, update, measures="entropy")


def skywork_entropy_controller(
    init_coef: float = 0.01,
    target: float = 0.2,
    delta: float = 0.005,
    min_coef: float = 0.0,
    max_coef: float | None = None,
) -> Controller:
    """Skywork-OR1 adaptive entropy control (He et al. 2025, arXiv 2505.22312; TRL `use_adaptive_entropy`;
    docs/GRPO_MATH.md §3 row 11, T9):

        applied_k = c_k · 1[H_k <= target]                               (coefficient used at step k)
        c_{k+1}   = clip(c_k + Δ·sign(target − H_k), min_coef, max_coef)

    `applied(state, H)` is this step's coefficient, `update(state, H).coef` the next step's.
    T9 (c=0.01, target=0.2, Δ=0.005): H=0.15 -> (0.01, 0.015); H=0.3 -> (0.0, 0.005).
    """

    def init() -> CoefState:
        return CoefState(coef=_scalar(init_coef))

    def applied(state: CoefState, entropy) -> jax.Array:
        return jnp.where(_scalar(entropy) <= target, _scalar(state.coef), 0.0)

    def update(state: CoefState, entropy, n_steps=None) -> CoefState:
        del n_steps
        c = _scalar(state.coef)
        c_new = jnp.maximum(c + delta * jnp.sign(target - _scalar(entropy)), min_coef)
        if max_coef is not None:
            c_new = jnp.minimum(c_new, max_coef)
        return CoefState(coef=c_new)

    return Controller(init, update, applied, measures="entropy")


def ppo_adaptive_kl_controller(init_coef: float = 1.0, target: float = 0.01) -> Controller:
    """PPO adaptive KL penalty (Schulman et al. 2017, arXiv 1707.06347 §4; docs/GRPO_MATH.md §2, T9):

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

    return Controller(init, update, measures="kl")


def ziegler_kl_controller(init_coef: float = 0.05, target: float = 6.0, horizon: int = 10000) -> Controller:
    """Proportional KL controller (Ziegler et al. 2019, arXiv 1909.08593; verl/TRL AdaptiveKLController;
    docs/GRPO_MATH.md T9):

        e = clip(KL/target − 1, −0.2, 0.2)          β ← β · (1 + e · n_steps / horizon)

    update(state, kl, n_steps). Defaults are TRL PPOConfig's (init 0.05, target 6, horizon 10000); note that
    target 6 is a sequence-summed KL in nats, while GRPO's logged `kl` is a per-token mean: set the target to
    the scale you measure. T9 (β=0.1, target=6, horizon=10000, n=256): KL=9 -> 0.100512; KL=5 -> 0.099573.
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

    return Controller(init, update, measures="kl")


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


def piecewise_controller(boundaries: Sequence[int], values: Sequence[float]) -> Controller:
    """A coefficient schedule as a controller (the seed's β 0.03 -> 0.01 -> 0.005, docs/GRPO_MATH.md §3 row
    12):
    coefficient `piecewise_constant(boundaries, values)(t)` at update t (t = train steps done, counted in the
    state so a resumed run continues it). The measurement is ignored. Values are data of the compiled step:
    the coefficient changes without recompiling."""
    sched = piecewise_constant(boundaries, values)

    def init() -> ScheduleState:
        return ScheduleState(coef=_scalar(sched(0)), t=jnp.int32(0))

    def update(state: ScheduleState, value=None, n_steps=None) -> ScheduleState:
        del value, n_steps
        t = state.t + 1
        return ScheduleState(coef=_scalar(sched(t)), t=t)

    return Controller(init, update)


_FACTORIES: dict[str, Callable[..., Controller]] = {
    "seed_entropy": seed_entropy_controller,
    "skywork_entropy": skywork_entropy_controller,
    "ppo_adaptive_kl": ppo_adaptive_kl_controller,
    "ziegler_kl": ziegler_kl_controller,
    "constant": constant_controller,
    "piecewise": piecewise_controller,
}


def make_controller(kind: str, **kwargs) -> Controller:
    """Build a controller by name: one of CONTROLLER_KINDS or "piecewise"; kwargs go to the factory."""
    if kind not in _FACTORIES:
        raise ValueError(f"make_controller: unknown kind {kind!r}; valid kinds are {tuple(_FACTORIES)}.")
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
