"""DPPO, Divergence PPO (Qi et al. 2026, "Rethinking the Trust Region in LLM Reinforcement Learning",
arXiv 2602.04879): prime-rl's default loss, also verl's dppo_tv / dppo_kl and SkyRL's "dppo"
(docs/GRPO_MATH.md §1.17).

targets   GRPO's: the group advantages of `--adv_method` (prime-rl: rewards − group mean, our dr_grpo).
loss      the policy loss with DPPO's policy term instead of the clipped surrogate (core.surrogates.dppo):
          ℓ = −K·A·r + kl_coef·(log r)² with r = π_θ / π_sampler and K = 0 for the tokens whose probability
          left the binary trust region (|π − μ| > δ in the advantage's direction, or the Bernoulli KL) —
          anchored on the SAMPLER's log-probs, as prime-rl, SkyRL and the paper's main variant (verl anchors
          on a recomputed π_old). Aggregation, the entropy bonus and a KL to π_ref (β > 0) compose as for
          GRPO; prime-rl's recipe is experiments/flagfiles/dppo.flags (token_mean, no reference).
metrics   dppo/masked_low, dppo/masked_high (shares of valid tokens dropped on each side; also
          clip_ratio/low and /high), dppo/mismatch_kl (the sampler vs π_old: r − log r − 1, prime-rl's
          mismatch_kl; ~0 for a synchronous rollout, > 0 for async / replayed samples).

In a synchronous rollout μ ≈ π_old, so the first update drops almost nothing (r ≈ 1); the trust region acts
on the later updates of a step (--num_iterations, --mini_batches) and on off-policy samples (async rewards,
replay), where the drift since sampling accumulates.
"""

from __future__ import annotations

from grpo_jax.algorithms import grpo
from grpo_jax.algorithms.base import Algorithm, Rows
from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.kl import kl_penalty
from grpo_jax.core.metrics import masked_mean
from grpo_jax.core.surrogates import ALGORITHM_TERMS


def make(obj: ObjectiveConfig) -> Algorithm:
    """DPPO over the objective `obj` (static)."""
    base = grpo.make(obj)  # the same targets and diagnostics combination
    term = ALGORITHM_TERMS["dppo"]
    params = {name: getattr(obj.dppo, name) for name in term.params}

    # the sampler's log-probs always: they are the trust region's anchor
    loss = grpo.policy_loss_of(obj, behaviour=True, term=term, term_params=params)

    def metrics(rows: Rows, aux):
        seq_adv, extra, outputs = base.metrics(rows, aux)
        loss_aux = aux[0]
        mismatch = kl_penalty(rows.batch.logp_sampler, rows.old.logp, kind="k3")  # r − log r − 1, r = π_old/μ
        extra = {
            **extra,
            "dppo/masked_low": loss_aux.clip_low_frac,
            "dppo/masked_high": loss_aux.clip_high_frac,
            "dppo/mismatch_kl": masked_mean(mismatch, rows.mask),
        }
        return seq_adv, extra, outputs

    return base._replace(name="dppo", loss=loss, metrics=metrics)
