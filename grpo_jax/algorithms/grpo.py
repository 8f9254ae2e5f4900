"""GRPO (DeepSeekMath, arXiv 2402.03300; docs/GRPO_MATH.md §1): group-relative advantages, no critic.

targets   [B, G] sequence advantages of the shaped rewards: the group estimator (`--adv_method`: z-score
          with ddof / eps, Dr. GRPO, RLOO, batch std) or the pool's scale-only baseline (--baseline=pool|mix),
          plus `--multiscale_w_tests` x the per-test sub-goal advantage. They need nothing of the policy, so
          the engine computes them once, before any forward pass.
loss      the policy loss of `--objective` (clip / cispo / sapo / vespo) with the KL to π_ref (or π_old) and
          the entropy bonus, aggregated as `--aggregation` (grpo_jax.algorithms.policy_loss).
metrics   the pool baseline's coverage and gap to the group mean when a pool baseline is on.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from grpo_jax.algorithms.base import Algorithm, PolicyOutputs, Rows, combine_aux
from grpo_jax.algorithms.policy_loss import PolicyInputs, policy_loss
from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.advantages import compute_advantages, pool_baseline_advantages
from grpo_jax.core.metrics import masked_std
from grpo_jax.core.multiscale import multi_scale_advantages
from grpo_jax.types import RolloutBatch


def make(obj: ObjectiveConfig) -> Algorithm:
    """GRPO over the objective `obj` (static)."""

    def targets(batch: RolloutBatch, rewards, mask, old=None, coefs=None):
        del mask, old, coefs
        return advantages(dataclasses.replace(batch, rewards=rewards), obj)

    loss = policy_loss_of(obj)

    def combine(aux, tokens):
        aux = aux[0]
        n_updates = aux.loss.shape[0]
        flat = jax.tree.map(lambda x: x.reshape(-1), aux)
        return combine_aux(flat, tokens.reshape(-1), obj.loss.importance_level, n_updates), None

    def metrics(rows: Rows, aux):
        del aux
        extra = baseline_metrics(rows.batch) if obj.baseline != "group" else {}
        return rows.targets, extra, {}

    return Algorithm("grpo", targets, loss, combine, metrics, kl_estimator=obj.loss.kl_estimator)


def policy_loss_of(obj: ObjectiveConfig, *, behaviour: bool | None = None, **term):
    """An Algorithm.loss over `policy_loss` with the objective's loss config, the step's coefficients and the
    rows' targets as sequence advantages: GRPO's loss, and DPPO's with its own `term=` / `term_params=`.
    `behaviour`: pass the sampler's log-probs (default: when the loss config uses them)."""
    behaviour = obj.loss.uses_behaviour if behaviour is None else behaviour

    def loss(out: PolicyOutputs, rows: Rows, coefs, norm: dict):
        value, aux = policy_loss(
            PolicyInputs(
                out.logp,
                rows.old.logp,
                rows.old.ref,
                rows.targets,
                rows.mask,
                entropy=out.entropy,
                logp_behaviour=rows.batch.logp_sampler if behaviour else None,
            ),
            cfg=obj.loss,
            kl_coef=coefs.kl,
            entropy_coef=coefs.entropy,
            **term,
            **norm,
        )
        return value, (aux, None)

    return loss


def advantages(batch: RolloutBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G] sequence advantages of a batch under the objective's estimator and baseline, plus
    multiscale_w_tests x the per-test sub-goal advantage when that is on. (`batch.rewards` as given: the
    train step passes the shaped rewards.)"""
    adv = outcome_advantages(batch, obj)
    if obj.multiscale_w_tests > 0:
        sub = multi_scale_advantages(
            batch.rewards,
            batch.test_rewards,
            batch.test_mask,
            w_tests=obj.multiscale_w_tests,
            method=obj.adv_method,
            ddof=obj.adv_ddof,
            eps=obj.adv_eps,
            mask=batch.group_mask,
            per_test_mode=obj.multiscale_mode,
        )
        adv = adv + obj.multiscale_w_tests * sub.tests
    return adv


def outcome_advantages(batch: RolloutBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G] advantages of the outcome reward (group or pool/mix baseline)."""
    if obj.baseline == "group":
        return compute_advantages(
            batch.rewards, method=obj.adv_method, ddof=obj.adv_ddof, eps=obj.adv_eps, mask=batch.group_mask
        )
    return pool_baseline_advantages(
        batch.rewards,
        batch.baseline,
        batch.baseline_valid,
        mix=1.0 if obj.baseline == "pool" else obj.baseline_mix,
        ddof=obj.adv_ddof,
        eps=obj.adv_eps,
        mask=batch.group_mask,
        std_floor=obj.baseline_std_floor,
    )


def baseline_metrics(batch: RolloutBatch) -> dict[str, jax.Array]:
    """How the pool baseline relates to the group: coverage, mean gap, and the groups it gives a signal."""
    gm = batch.group_mask
    has = batch.baseline_valid * (gm.sum(-1) > 0)
    n = jnp.maximum(has.sum(), 1.0)
    g_mean = jnp.sum(batch.rewards * gm, -1) / jnp.maximum(gm.sum(-1), 1.0)
    zero_std = masked_std(batch.rewards, gm, axis=-1) == 0
    signal = has * zero_std * (jnp.abs(g_mean - batch.baseline) > 0)
    return {
        "pool/baseline_coverage": has.sum() / jnp.maximum((gm.sum(-1) > 0).sum(), 1.0),
        "pool/baseline_mean": jnp.sum(batch.baseline * has) / n,
        "pool/group_minus_baseline": jnp.sum((g_mean - batch.baseline) * has) / n,
        # all-equal groups (no signal under the group baseline) that the pool baseline gives a signal
        "pool/frac_zero_std_with_signal": signal.sum() / jnp.maximum((zero_std * has).sum(), 1.0),
    }
