"""PPO for the language model (docs/GRPO_MATH.md §2; TRL PPOTrainer): a critic (a value head on the policy's
trunk), KL-shaped per-token rewards, GAE over tokens. The same rollout as GRPO (prompts x G completions; the
group only batches the sampling: the advantages are not group-relative).

targets   from π_old, π_ref, V_old and β of the step (so after the no-gradient pass): r_t = −β·k(π_old, π_ref)
          on every valid token + the sandbox reward on the last one, GAE (γ, λ; V after the last token = 0),
          R̂ = Â + V_old, Â whitened over the batch's valid tokens (grpo_jax.core.value.ppo_token_advantages).
loss      `ppo_loss`: the policy loss on the per-token Â with its KL term off (the KL is in the rewards) plus
          vf_coef x the clipped value loss, normalised like the policy term.
metrics   value/* (loss, clip fraction, V_old, returns, explained variance) and the reward's KL part; the
          advantage statistics over tokens.

`ppo_loss` is also the loss of the MLP agent's PPO (grpo_jax.train.mlp_agent): one PPO loss in the project.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.algorithms.base import Algorithm, Coefs, PolicyOutputs, Rows, combine_aux
from grpo_jax.algorithms.policy_loss import LossAux, PolicyInputs, policy_loss
from grpo_jax.config import ObjectiveConfig, PolicyLossConfig
from grpo_jax.core.metrics import explained_variance, masked_mean
from grpo_jax.core.value import PPOTargets, clipped_value_loss, ppo_token_advantages

sg = jax.lax.stop_gradient


class ValueAux(NamedTuple):
    """The critic's loss diagnostics of one (micro-)batch."""

    vf_loss: jax.Array  # 0.5 · mean max((V − R̂)², (clip(V) − R̂)²), normalised like the policy loss
    vf_clip_frac: jax.Array  # share of valid tokens where the clipped error is the larger


def ppo_loss(
    logp,
    logp_old,
    logp_ref,
    values,
    values_old,
    adv,
    returns,
    mask,
    *,
    cfg: PolicyLossConfig,
    vf_coef: float,
    cliprange_value: float,
    entropy_coef=0.0,
    entropy=None,
    logp_behaviour=None,
    **norm,
) -> tuple[jax.Array, tuple[LossAux, ValueAux]]:
    """PPO's loss: `policy_loss` (cfg: clip range, aggregation, IS correction, ...) on the per-token
    advantages with its KL term off, + vf_coef x the clipped value loss (its token count = the policy term's
    `num_items` when given). Returns (loss, (LossAux with the total loss, ValueAux))."""
    loss, aux = policy_loss(
        PolicyInputs(logp, logp_old, logp_ref, adv, mask, entropy=entropy, logp_behaviour=logp_behaviour),
        cfg=cfg,
        kl_coef=0.0,
        entropy_coef=entropy_coef,
        **norm,
    )
    vf, vf_clip = clipped_value_loss(
        values, values_old, returns, mask, eps_v=cliprange_value, num_items=norm.get("num_items")
    )
    total = loss + vf_coef * vf
    return total, (aux._replace(loss=sg(total)), ValueAux(sg(vf), vf_clip))


def _values_old(rows: Rows) -> jax.Array:
    """V_old of the rows: always computed for PPO (Algorithm.needs_values)."""
    if rows.old.values is None:
        raise ValueError("ppo: the step's OldStats has no values (the algorithm needs_values)")
    return rows.old.values


def make(obj: ObjectiveConfig) -> Algorithm:
    """PPO over the objective `obj` (static); the model must have a value head."""
    p = obj.ppo
    # the loss's KL term is off (the KL is in the rewards); its logged estimate is the reward's
    loss_cfg = dataclasses.replace(obj.loss, kl_estimator=p.kl_estimator)

    def targets(batch, rewards, mask, old, coefs: Coefs) -> PPOTargets:
        del batch
        return ppo_token_advantages(
            rewards,
            old.values,
            mask,
            logp_old=old.logp,
            logp_ref=old.ref,
            kl_coef=coefs.kl,
            kl_kind=p.kl_estimator,
            gamma=p.gamma,
            lam=p.lam,
            whiten_advantages=p.whiten_advantages,
        )

    def loss(out: PolicyOutputs, rows: Rows, coefs: Coefs, norm: dict):
        return ppo_loss(
            out.logp,
            rows.old.logp,
            rows.old.ref,
            out.values,
            rows.old.values,
            rows.targets.adv,
            rows.targets.returns,
            rows.mask,
            cfg=loss_cfg,
            vf_coef=p.vf_coef,
            cliprange_value=p.cliprange_value,
            entropy_coef=coefs.entropy,
            entropy=out.entropy,
            logp_behaviour=rows.batch.logp_sampler if obj.loss.uses_behaviour else None,
            **norm,
        )

    def combine(aux, tokens):
        pol, val = aux
        n_updates = pol.loss.shape[0]
        flat_tok = tokens.reshape(-1)
        pol = combine_aux(
            jax.tree.map(lambda x: x.reshape(-1), pol), flat_tok, obj.loss.importance_level, n_updates
        )
        w = flat_tok / jnp.maximum(flat_tok.sum(), 1.0)
        val = ValueAux(val.vf_loss.sum() / n_updates, jnp.sum(val.vf_clip_frac.reshape(-1) * w))
        return pol, val

    def metrics(rows: Rows, aux):
        adv_tok, mask = rows.targets.adv, rows.mask
        seq_adv = masked_mean(adv_tok, mask, axis=-1)  # the sequence-level metrics see the mean token Â
        nan = jnp.float32(jnp.nan)  # histograms drop non-finite entries: only the valid tokens show
        outputs = {
            "advantages": jnp.where(mask > 0, adv_tok, nan),
            "values": jnp.where(mask > 0, _values_old(rows), nan),
        }
        return seq_adv, value_metrics(rows, aux[1]), outputs

    return Algorithm(
        "ppo",
        targets,
        loss,
        combine,
        metrics,
        kl_estimator=p.kl_estimator,
        needs_values=True,
        targets_use_old=True,
    )


def value_metrics(rows: Rows, vaux: ValueAux) -> dict[str, jax.Array]:
    """The critic's diagnostics and the token-level advantage statistics that replace the sequence ones:
    value loss / clip fraction of the step's updates; V_old, returns and explained variance (SB3: 1 −
    Var(R̂ − V_old) / Var(R̂)) over the valid tokens; the KL part of the reward (TRL's
    objective/non_score_reward: Σ_t −β·k_t, mean over sequences)."""
    tgt, v_old, mask, adv = rows.targets, _values_old(rows), rows.mask, rows.targets.adv
    has = (mask.sum(-1) > 0).astype(jnp.float32)
    kl_part = tgt.rewards.sum(-1) - jnp.where(has > 0, rows.rewards, 0.0)
    return {
        "value/loss": vaux.vf_loss,
        "value/clip_frac": vaux.vf_clip_frac,
        "value/mean": masked_mean(v_old, mask),
        "value/return_mean": masked_mean(tgt.returns, mask),
        "value/explained_variance": explained_variance(v_old, tgt.returns, mask),
        "reward/kl_penalty": masked_mean(kl_part, has),
        "Training/AdvantageNorm": jnp.sqrt(masked_mean(jnp.square(adv), mask)),  # RMS over valid tokens
        "adv/mean": masked_mean(adv, mask),
        "adv/abs_mean": masked_mean(jnp.abs(adv), mask),
    }
