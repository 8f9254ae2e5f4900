"""The GRPO train step: `train_step(state, batch) -> (state, metrics)`, jitted once with the state donated.

One call does, on device:
  1. advantages from the group rewards (grpo_jax.core.advantages, method from the ObjectiveConfig);
  2. the reference log-probs (if the objective has a KL to π_ref) with the shared-prompt forward;
  3. μ = num_iterations optimiser updates: policy forward/backward (`grpo_loss`), global-norm clip, AdamW
     (a non-finite gradient skips the update and is counted: optax.apply_if_finite);
  4. the adaptive-coefficient controller update (entropy or KL measured on this batch);
  5. a flat dict of scalar metrics (the seed's TensorBoard names + the standard GRPO diagnostics).

π_old: with μ = 1 the batch was sampled by the current parameters, so logp_old = stop_gradient(logp_θ) and
ρ = 1 exactly (TRL does the same); the sampler's own log-probs are kept only to measure the sampler-vs-trainer
mismatch (`logp_mismatch`, ~1e-6 here since both use the same float32 code). With μ > 1, logp_old is the
first iteration's log-probs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax

from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.advantages import compute_advantages
from grpo_jax.core.losses import grpo_loss
from grpo_jax.core.metrics import masked_mean, masked_std
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import TrainState, make_controllers


@flax.struct.dataclass
class GRPOBatch:
    """One rollout batch. B prompts x G completions of T tokens; prompts are left-padded to P tokens."""

    prompt: jax.Array  # [B, P] int32
    prompt_mask: jax.Array  # [B, P] int32
    completions: jax.Array  # [B, G, T] int32
    completion_mask: jax.Array  # [B, G, T] float32: 1 for sampled tokens up to and including EOS
    rewards: jax.Array  # [B, G] float32
    group_mask: jax.Array  # [B, G] float32: 1 for members that take part (padding / filtered groups: 0)
    logp_sampler: jax.Array  # [B, G, T] float32: the sampler's log-probs of the completion tokens
    truncated: jax.Array  # [B, G] bool: no EOS within T


def batch_from_samples(prompt, prompt_mask, out, rewards, group_mask=None) -> GRPOBatch:
    """The GRPOBatch of one rollout: prompts [B, P], a sampling.SampleOutput [B, G, T], rewards [B, G]."""
    rewards = jnp.asarray(rewards, jnp.float32)
    return GRPOBatch(
        prompt=jnp.asarray(prompt),
        prompt_mask=jnp.asarray(prompt_mask),
        completions=out.tokens,
        completion_mask=out.mask,
        rewards=rewards,
        group_mask=jnp.ones_like(rewards) if group_mask is None else jnp.asarray(group_mask, jnp.float32),
        logp_sampler=out.logp,
        truncated=out.truncated,
    )


LogitsFn = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]


def transformer_logits_fn(cfg: tfm.TransformerConfig) -> LogitsFn:
    def fn(params, prompt, prompt_mask, completions):
        return tfm.forward_grouped(params, cfg, prompt, prompt_mask, completions)[0]

    return fn


def loss_mask(batch: GRPOBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G, T] tokens that enter the loss."""
    m = batch.completion_mask * batch.group_mask[..., None]
    if obj.mask_truncated:
        m = m * (1.0 - batch.truncated.astype(jnp.float32))[..., None]
    return m


def make_train_step(
    logits_fn: LogitsFn,
    obj: ObjectiveConfig,
    optimizer: optax.GradientTransformation,
    *,
    temperature: float = 1.0,
    jit: bool = True,
    shardings: tuple[Any, Any] | None = None,
):
    """Build `train_step(state, batch) -> (state, metrics)`.

    jit=True compiles it once (the state argument is donated); `shardings=(state_sharding, batch_sharding)`
    pins input/output shardings for multi-device meshes (grpo_jax.train.sharding).
    """
    kl_ctrl, ent_ctrl = make_controllers(obj)
    measures_kl = obj.controller.measures == "kl"

    def token_stats(params, batch):
        logits = logits_fn(params, batch.prompt, batch.prompt_mask, batch.completions)
        return tfm.token_logp(logits, batch.completions, temperature)

    def step(state: TrainState, batch: GRPOBatch):
        # a non-finite reward is a data bug: its member leaves the group (and is counted in the metrics)
        finite = jnp.isfinite(batch.rewards)
        batch = batch.replace(
            rewards=jnp.where(finite, batch.rewards, 0.0),
            group_mask=batch.group_mask * finite.astype(jnp.float32),
        )
        nonfinite_rewards = jnp.sum(~finite).astype(jnp.float32)
        mask = loss_mask(batch, obj)  # [B,G,T]
        adv = compute_advantages(
            batch.rewards, method=obj.adv_method, ddof=obj.adv_ddof, eps=obj.adv_eps, mask=batch.group_mask
        )  # [B,G]
        logp_ref = None
        if obj.uses_reference:
            logp_ref, _ = token_stats(state.ref_params, batch)
            logp_ref = jax.lax.stop_gradient(logp_ref)
        n_samples = jnp.sum(batch.group_mask)

        def loss_fn(params, logp_old):
            logp, ent = token_stats(params, batch)
            if logp_old is None:
                logp_old = jax.lax.stop_gradient(logp)
            ent_mean = jax.lax.stop_gradient(masked_mean(ent, mask))
            # the controllers see this batch's entropy / KL; a controller with an `applied` field (Skywork)
            # decides this step's coefficient from it, the others use their current coefficient.
            kl_state, ent_state = state.kl_ctrl, state.ent_ctrl
            kl_coef = kl_state.coef
            ent_probe = ent_ctrl.update(ent_state, ent_mean, n_steps=n_samples)
            ent_coef = getattr(ent_probe, "applied", ent_state.coef)
            loss, aux = grpo_loss(
                logp,
                logp_old,
                logp_ref,
                adv,
                mask,
                cfg=obj.loss,
                kl_coef=kl_coef,
                entropy_coef=ent_coef,
                entropy=ent,
            )
            return loss, (aux, logp, kl_coef, ent_coef)

        params, opt_state = state.params, state.opt_state
        logp_old = None
        grad_norms = []
        for it in range(obj.num_iterations):
            (loss, (aux, logp, kl_coef, ent_coef)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, logp_old
            )
            grad_norms.append(optax.tree.norm(grads))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            if it == 0:
                logp_first = jax.lax.stop_gradient(logp)
                aux_first, kl_first, ent_first = aux, kl_coef, ent_coef
                logp_old = logp_first

        measured = aux_first.kl if measures_kl else aux_first.entropy
        kl_state, ent_state = state.kl_ctrl, state.ent_ctrl
        if obj.controller.acts_on == "kl_coef":
            kl_state = kl_ctrl.update(kl_state, measured, n_steps=n_samples)
        else:
            ent_state = ent_ctrl.update(ent_state, measured, n_steps=n_samples)

        metrics = _metrics(batch, obj, mask, adv, aux_first, logp_first, grad_norms[0], opt_state)
        metrics.update(
            {
                "coef/kl": kl_first,
                "coef/entropy": ent_first,
                "coef/kl_next": kl_state.coef,
                "coef/entropy_next": ent_state.coef,
                "loss/final_iteration": aux.loss,
                "nonfinite/rewards": nonfinite_rewards,
            }
        )
        new_state = state.replace(
            step=state.step + 1, params=params, opt_state=opt_state, kl_ctrl=kl_state, ent_ctrl=ent_state
        )
        return new_state, metrics

    if not jit:
        return step
    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    state_sh, batch_sh = shardings
    return jax.jit(step, donate_argnums=0, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None))


def _metrics(batch, obj, mask, adv, aux, logp, grad_norm, opt_state) -> dict[str, jax.Array]:
    gm = batch.group_mask
    r = batch.rewards
    n = jnp.maximum(gm.sum(), 1.0)
    # per-group reward std (population) to detect groups that give no policy gradient
    g_std = masked_std(r, gm, axis=-1)
    groups_valid = (gm.sum(-1) > 0).astype(jnp.float32)
    lengths = batch.completion_mask.sum(-1)
    success = (r >= obj.success_threshold).astype(jnp.float32)
    adv_rms = jnp.sqrt(jnp.sum(jnp.square(adv) * gm) / n)
    big = jnp.where(gm > 0, lengths, jnp.inf)
    small = jnp.where(gm > 0, lengths, -jnp.inf)
    return {
        # the seed document's TensorBoard names
        "Policy/Entropy": aux.entropy,
        "Training/AdvantageNorm": adv_rms,  # RMS of the sequence advantages over valid samples
        "Performance/SuccessRate": jnp.sum(success * gm) / n,
        # standard GRPO diagnostics (TRL names where they exist)
        "loss": aux.loss,
        "loss/policy": aux.pg_loss,
        "kl": aux.kl,
        "entropy": aux.entropy,
        "clip_ratio/low": aux.clip_low_frac,
        "clip_ratio/high": aux.clip_high_frac,
        "clip_ratio/region": aux.clip_region_frac,
        "ratio/mean": aux.ratio_mean,
        "ratio/max": aux.ratio_max,
        "ratio/min": aux.ratio_min,
        "adv/mean": jnp.sum(adv * gm) / n,
        "adv/abs_mean": jnp.sum(jnp.abs(adv) * gm) / n,
        "reward": jnp.sum(r * gm) / n,
        "reward_std": masked_std(r, gm),
        "frac_reward_zero_std": jnp.sum((g_std == 0) * groups_valid) / jnp.maximum(groups_valid.sum(), 1.0),
        "completions/mean_length": jnp.sum(lengths * gm) / n,
        "completions/min_length": jnp.min(big),
        "completions/max_length": jnp.max(small),
        "completions/clipped_ratio": jnp.sum(batch.truncated * gm) / n,
        "grad_norm": grad_norm,
        "nonfinite/skipped_total": opt_state.total_notfinite.astype(jnp.float32),
        "nonfinite/consecutive": opt_state.notfinite_count.astype(jnp.float32),
        "logp_mismatch": masked_mean(jnp.abs(batch.logp_sampler - logp), mask),
        "tokens": mask.sum(),
    }
