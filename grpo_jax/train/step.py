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
from grpo_jax.core.advantages import compute_advantages, pool_baseline_advantages
from grpo_jax.core.losses import grpo_loss
from grpo_jax.core.metrics import masked_mean, masked_std
from grpo_jax.core.multiscale import multi_scale_advantages
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
    baseline: jax.Array  # [B] float32: external per-prompt baseline (the policy pool's mean return)
    baseline_valid: jax.Array  # [B] float32: 1 where `baseline` holds returns (else the group mean is used)
    test_rewards: jax.Array  # [B, G, M] float32: 1 where test m of the sample passed (multi-scale advantages)
    test_mask: jax.Array  # [B, M] float32: 1 for the problem's real tests


def batch_from_samples(
    prompt,
    prompt_mask,
    out,
    rewards,
    group_mask=None,
    baseline=None,
    baseline_valid=None,
    test_rewards=None,
    test_mask=None,
) -> GRPOBatch:
    """The GRPOBatch of one rollout: prompts [B, P], a sampling.SampleOutput [B, G, T], rewards [B, G];
    optionally the pool baseline [B] and its validity [B] (objective baseline "pool" / "mix"), and per-test
    results [B, G, M] with the test mask [B, M] (multi-scale advantages; default M = 1, all zero)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    b, g = rewards.shape
    return GRPOBatch(
        prompt=jnp.asarray(prompt),
        prompt_mask=jnp.asarray(prompt_mask),
        completions=out.tokens,
        completion_mask=out.mask,
        rewards=rewards,
        group_mask=jnp.ones_like(rewards) if group_mask is None else jnp.asarray(group_mask, jnp.float32),
        logp_sampler=out.logp,
        truncated=out.truncated,
        baseline=jnp.zeros((b,), jnp.float32) if baseline is None else jnp.asarray(baseline, jnp.float32),
        baseline_valid=(
            jnp.zeros((b,), jnp.float32)
            if baseline_valid is None
            else jnp.asarray(baseline_valid, jnp.float32)
        ),
        test_rewards=(
            jnp.zeros((b, g, 1), jnp.float32)
            if test_rewards is None
            else jnp.asarray(test_rewards, jnp.float32)
        ),
        test_mask=jnp.zeros((b, 1), jnp.float32)
        if test_mask is None
        else jnp.asarray(test_mask, jnp.float32),
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
    param_fn: Callable[[Any, Any], Any] | None = None,
):
    """Build `train_step(state, batch) -> (state, metrics)`.

    jit=True compiles it once (the state argument is donated); `shardings=(state_sharding, batch_sharding)`
    pins input/output shardings for multi-device meshes (grpo_jax.train.sharding).
    param_fn(trainable, frozen) -> full model parameters, for states whose `params` are not the whole model
    (LoRA: `lora.merge` of the stop-gradient'ed frozen base `state.frozen` with the adapters). The reference
    policy is `param_fn(state.ref_params, state.frozen)` likewise.
    """
    kl_ctrl, ent_ctrl = make_controllers(obj)
    measures_kl = obj.controller.measures == "kl"

    def token_stats(params, frozen, batch):
        full = params if param_fn is None else param_fn(params, frozen)
        logits = logits_fn(full, batch.prompt, batch.prompt_mask, batch.completions)
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
        adv = advantages(batch, obj)  # [B,G]
        logp_ref = None
        if obj.uses_reference:
            logp_ref, _ = token_stats(state.ref_params, state.frozen, batch)
            logp_ref = jax.lax.stop_gradient(logp_ref)
        n_samples = jnp.sum(batch.group_mask)

        def loss_fn(params, logp_old):
            logp, ent = token_stats(params, state.frozen, batch)
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
                logp_behaviour=batch.logp_sampler if obj.loss.tis_cap is not None else None,
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

        ref_params, ref_due = update_reference(state.ref_params, params, state.step + 1, obj)
        metrics = _metrics(batch, obj, mask, adv, aux_first, logp_first, grad_norms[0], opt_state)
        metrics.update(
            {
                "coef/kl": kl_first,
                "coef/entropy": ent_first,
                "coef/kl_next": kl_state.coef,
                "coef/entropy_next": ent_state.coef,
                "loss/final_iteration": aux.loss,
                "nonfinite/rewards": nonfinite_rewards,
                "ref/updated": ref_due,
            }
        )
        if obj.baseline != "group":
            metrics.update(_baseline_metrics(batch))
        if obj.loss.tis_cap is not None:  # off-policy diagnostics: the truncated IS weights of this batch
            w_raw = jnp.exp(jnp.where(mask > 0, logp_first - batch.logp_sampler, 0.0))
            metrics["tis/weight_mean"] = masked_mean(jnp.minimum(w_raw, obj.loss.tis_cap), mask)
            metrics["tis/capped_frac"] = masked_mean((w_raw > obj.loss.tis_cap).astype(jnp.float32), mask)
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            kl_ctrl=kl_state,
            ent_ctrl=ent_state,
            ref_params=ref_params,
        )
        return new_state, metrics

    if not jit:
        return step
    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    state_sh, batch_sh = shardings
    return jax.jit(step, donate_argnums=0, in_shardings=(state_sh, batch_sh), out_shardings=(state_sh, None))


def advantages(batch: GRPOBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G] sequence advantages of a batch under the objective's estimator and baseline, plus
    multiscale_w_tests x the per-test sub-goal advantage when that is on."""
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


def outcome_advantages(batch: GRPOBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G] advantages of the all-pass outcome reward (group or pool/mix baseline)."""
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


def update_reference(ref: Any, params: Any, new_step: jax.Array, obj: ObjectiveConfig):
    """π_ref after the update that made `new_step` (GRPO_MATH §3 row 9): frozen; hard reset π_ref ← π_θ; or
    EMA π_ref ← π_ref + τ (π_θ − π_ref) — each every `ref_update_every` steps. Returns (ref, updated 0/1)."""
    if ref is None or obj.ref_update == "frozen":
        return ref, jnp.float32(0.0)
    due = (new_step % obj.ref_update_every) == 0

    def upd(r, p):
        if obj.ref_update == "hard":
            new = p.astype(r.dtype)
        else:
            r32 = r.astype(jnp.float32)
            new = (r32 + obj.ref_ema_tau * (p.astype(jnp.float32) - r32)).astype(r.dtype)
        return jnp.where(due, new, r)

    return jax.tree.map(upd, ref, params), due.astype(jnp.float32)


def _baseline_metrics(batch: GRPOBatch) -> dict[str, jax.Array]:
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
