"""The GRPO train step: `train_step(state, batch, frozen=None) -> (state, metrics, outputs)`, jitted once
with the TrainState donated.

One call does, on device:
  1. rewards: the batch's correctness rewards (non-finite ones leave their group and are counted) plus DAPO's
     soft overlong punishment when `overlong_cache_len` > 0;
  2. advantages from the group rewards (estimator, pool / mix baseline, multi-scale sub-goals);
  3. the reference log-probs (if the objective has a KL to π_ref) with the shared-prompt forward;
  4. μ = num_iterations optimiser updates in a `lax.scan`: policy forward/backward (`grpo_loss`), global-norm
     clip, AdamW (a non-finite gradient skips the update and is counted: optax.apply_if_finite);
  5. the controller updates (β and the entropy coefficient: constant, a schedule, or adaptive) and the
     reference update (frozen / hard / EMA);
  6. metrics (a flat dict of scalars: the seed's TensorBoard names + the standard GRPO diagnostics) and
     `outputs` = {"advantages" [B, G], "rewards" [B, G]}, what the loop logs as histograms.

π_old: the first iteration uses logp_old = stop_gradient(logp_θ), so ρ = 1 exactly (TRL does the same); the
sampler's own log-probs (the behaviour policy) are logged as `logp_mismatch` and, with `tis_cap`, weight each
token by sg(min(π_old/π_behaviour, C)). Later iterations (μ > 1) use the first iteration's log-probs as π_old.

PPO (obj.algorithm == "ppo", GRPO_MATH.md §2): the policy function also returns the value head's V [B, G, T]
(the critic: a D -> 1 head on the policy's trunk). V_old and π_old come from the same no-gradient values as
GRPO's π_old (the first iteration's forward in the plain step, the pre-pass in the split step); step 2 is
then per-token: r_t = −β·k(π_old, π_ref) + the reward on the last valid token, GAE (γ, λ, V after the last
token = 0), R̂ = Â + V_old, Â whitened over the batch's valid tokens (`core.losses.ppo_token_advantages`),
and the loss is `grpo_loss` on the per-token Â (the KL term off: it is in the reward) + vf_coef × the
clipped value loss. β is the KL controller's coefficient of the step (measured on π_old, as GRPO's).

Controllers: every controller is called the same way (grpo_jax.core.controllers): `applied(state, signal)`
gives the coefficient of this step, `update(state, signal)` the next state, where `signal` is what the
controller measures on this batch (`Controller.measures`: the mean entropy, the mean KL estimate, or none).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.advantages import compute_advantages, pool_baseline_advantages
from grpo_jax.core.losses import (
    LossAux,
    PPOTargets,
    clipped_value_loss,
    grpo_loss,
    kl_penalty,
    masked_quantile,
    ppo_token_advantages,
    soft_overlong_punishment,
)
from grpo_jax.core.metrics import explained_variance, masked_mean, masked_std
from grpo_jax.core.multiscale import multi_scale_advantages
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import TrainState, make_controllers
from grpo_jax.types import RolloutBatch

sg = jax.lax.stop_gradient
LogitsFn = Callable[[Any, jax.Array, jax.Array, jax.Array], jax.Array]
# logp_fn(params, prompt, prompt_mask, completions, temperature) -> (logp [B, G, T], entropy [B, G, T])
# (PPO: -> (logp, entropy, values [B, G, T]))
LogpFn = Callable[[Any, jax.Array, jax.Array, jax.Array, Any], tuple[jax.Array, ...]]

_NEEDS_VALUES = (
    "make_train_step: algorithm=ppo needs the critic's values from the policy function: a model with "
    "TransformerConfig.value_head=True and transformer_logits_fn(cfg, with_values=True) or "
    "logp.make_logp_fn(cfg, chunk, with_values=True)"
)


def transformer_logits_fn(cfg: tfm.TransformerConfig, with_values: bool = False) -> LogitsFn:
    """logits_fn(params, prompt, prompt_mask, completions) -> logits [B, G, T, V]; with_values=True (PPO, a
    model with a value head) -> (logits, values [B, G, T]) from the same forward."""

    def fn(params, prompt, prompt_mask, completions):
        if with_values:
            return tfm.forward_grouped(params, cfg, prompt, prompt_mask, completions)
        return tfm.forward_grouped(params, cfg, prompt, prompt_mask, completions)[0]

    return fn


def logp_from_logits(logits_fn: LogitsFn) -> LogpFn:
    """The LogpFn of a LogitsFn: full [B, G, T, V] logits, then token log-probs and entropies (and the values
    when the LogitsFn returns (logits, values))."""

    def fn(params, prompt, prompt_mask, completions, temperature):
        out = logits_fn(params, prompt, prompt_mask, completions)
        if isinstance(out, tuple):
            logits, values = out
            return (*tfm.token_logp(logits, completions, temperature), values)
        return tfm.token_logp(out, completions, temperature)

    return fn


class ValueAux(NamedTuple):
    """The critic's loss diagnostics of one (micro-)batch (PPO)."""

    vf_loss: jax.Array  # 0.5 · mean max((V − R̂)², (clip(V) − R̂)²), normalised like the policy loss
    vf_clip_frac: jax.Array  # share of valid tokens where the clipped error is the larger


def loss_mask(batch: RolloutBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G, T] tokens that enter the loss."""
    m = batch.completion_mask * batch.group_mask[..., None]
    if obj.mask_truncated:
        m = m * (1.0 - batch.truncated.astype(jnp.float32))[..., None]
    return m


def total_rewards(batch: RolloutBatch, obj: ObjectiveConfig) -> jax.Array:
    """[B, G] the rewards the advantages see: correctness + DAPO soft overlong punishment (if on), with
    L_max = obj.loss.max_len (the run's max_new_tokens) and L_cache = obj.overlong_cache_len."""
    r = batch.rewards
    if obj.overlong_cache_len > 0:
        lengths = batch.completion_mask.sum(-1)
        r = r + soft_overlong_punishment(lengths, max_len=obj.loss.max_len, cache_len=obj.overlong_cache_len)
    return r


def make_train_step(
    logits_fn: LogitsFn | None,
    obj: ObjectiveConfig,
    optimizer: optax.GradientTransformation,
    *,
    temperature: float = 1.0,
    jit: bool = True,
    shardings: tuple[Any, Any] | tuple[Any, Any, Any] | None = None,
    param_fn: Callable[[Any, Any], Any] | None = None,
    logp_fn: LogpFn | None = None,
    micro_batches: int = 1,
):
    """Build `train_step(state, batch, frozen=None) -> (state, metrics, outputs)`.

    The policy enters through `logits_fn(params, prompt, prompt_mask, completions) -> [B, G, T, V]` or, when
    given instead, `logp_fn(params, prompt, prompt_mask, completions, temperature) -> (logp, entropy)` (e.g.
    a chunked LM head that never materialises the full logits).

    jit=True compiles it once (the TrainState is donated; `frozen` is not); `shardings=(state_sharding,
    batch_sharding[, frozen_sharding])` pins input/output shardings for multi-device meshes
    (grpo_jax.train.sharding); batch_sharding is one NamedSharding for every batch leaf (or a tree of them).

    Micro- and mini-batches (`micro_batches` = k, `obj.mini_batches` = m; both 1 = the plain step): each epoch
    (μ = obj.num_iterations of them) shuffles the B prompts and splits them into m mini-batches, one optimiser
    update each; each update's gradient is accumulated over k strided micro-batches of its mini-batch, each
    normalised by the MINI-BATCH's counts (sequences N, tokens Σ|o_i| for token_mean / DAPO, entropy-bonus
    tokens, the top-entropy threshold), so the k micro-batch gradients sum exactly to the mini-batch's
    (tests/test_microbatch.py). With m·k > 1 one no-gradient pass at the step's parameters (in micro-batch
    sized chunks) first gives π_old's log-probs for every update, the reference log-probs, the entropy the
    controllers measure and the top-entropy threshold (over the whole rollout batch); the loss diagnostics
    are those of the first epoch's updates combined.
    param_fn(trainable, frozen) -> full model parameters, for states whose `params` are not the whole model
    (LoRA: `lora.merge` of the stop-gradient'ed frozen base with the adapters). The reference policy is
    `param_fn(state.ref_params, frozen)` likewise.
    obj.algorithm == "ppo": the policy function must also return the values (logits_fn -> (logits, values),
    logp_fn -> (logp, entropy, values); see transformer_logits_fn / logp.make_logp_fn with_values=True).
    """
    if obj.overlong_cache_len > 0 and obj.loss.max_len is None:
        raise ValueError("make_train_step: overlong_cache_len needs obj.loss.max_len (L_max) to be set")
    if (logits_fn is None) == (logp_fn is None):
        raise ValueError("make_train_step: give exactly one of logits_fn and logp_fn")
    if micro_batches < 1 or obj.mini_batches < 1:
        raise ValueError(f"make_train_step: micro_batches={micro_batches} and mini_batches must be >= 1")
    logp_fn = logp_fn or logp_from_logits(logits_fn)
    kl_ctrl, ent_ctrl = make_controllers(obj)
    anchor_is_ref = obj.loss.kl_anchor == "ref"
    n_mini, n_micro = obj.mini_batches, micro_batches
    batch_sh = None if shardings is None else shardings[1]
    ppo = obj.algorithm == "ppo"
    kl_kind = obj.ppo.kl_estimator if ppo else obj.loss.kl_estimator  # the KL the controllers measure
    # PPO: the loss's KL term is off (the KL is in the rewards); its logged estimate is the reward's
    loss_cfg = dataclasses.replace(obj.loss, kl_estimator=obj.ppo.kl_estimator) if ppo else obj.loss

    def token_stats(params, frozen, batch):
        full = params if param_fn is None else param_fn(params, frozen)
        out = logp_fn(full, batch.prompt, batch.prompt_mask, batch.completions, temperature)
        if ppo and (len(out) != 3 or out[2] is None):
            raise ValueError(_NEEDS_VALUES)
        return out

    def prepare(batch: RolloutBatch):
        """(batch, finite [B, G], rewards, loss mask, advantages): a non-finite reward is a data bug, so its
        member leaves the group (and is counted in the metrics); then the shaped rewards and advantages."""
        finite = jnp.isfinite(batch.rewards)
        batch = batch.replace(
            rewards=jnp.where(finite, batch.rewards, 0.0),
            group_mask=batch.group_mask * finite.astype(jnp.float32),
        )
        rewards = total_rewards(batch, obj)  # [B,G]
        mask = loss_mask(batch, obj)  # [B,G,T]
        if ppo:  # per-token advantages come later, from the critic's V_old (ppo_targets)
            return batch, finite, rewards, mask, None
        return batch, finite, rewards, mask, advantages(batch.replace(rewards=rewards), obj)

    def measure(ent, logp, anchor, mask):
        """What the controllers can measure on this batch (Controller.measures), without gradients."""
        kl = 0.0 if anchor is None else masked_mean(kl_penalty(logp, anchor, kind=kl_kind), mask)
        return {"entropy": sg(masked_mean(ent, mask)), "kl": sg(jnp.float32(kl)), "none": jnp.float32(0.0)}

    def ppo_targets(rewards, logp_old, logp_ref, values_old, mask, kl_coef) -> PPOTargets:
        """PPO's per-token rewards, GAE advantages (whitened) and value targets, all stop-gradient."""
        p = obj.ppo
        return ppo_token_advantages(
            rewards,
            values_old,
            mask,
            logp_old=logp_old,
            logp_ref=logp_ref,
            kl_coef=kl_coef,
            kl_kind=p.kl_estimator,
            gamma=p.gamma,
            lam=p.lam,
            whiten_advantages=p.whiten_advantages,
        )

    def ppo_objective(
        logp, ent, values, logp_old, logp_ref, tgt, values_old, mask, ent_coef, behaviour, **norm
    ):
        """PPO's loss: `grpo_loss` on the per-token advantages with its KL term off + vf_coef x the clipped
        value loss (normalised by the same token count). Returns (loss, (LossAux with the total loss,
        ValueAux))."""
        loss, aux = grpo_loss(
            logp,
            logp_old,
            logp_ref,
            tgt.adv,
            mask,
            cfg=loss_cfg,
            kl_coef=0.0,
            entropy_coef=ent_coef,
            entropy=ent,
            logp_behaviour=behaviour,
            **norm,
        )
        vf, vf_clip = clipped_value_loss(
            values,
            values_old,
            tgt.returns,
            mask,
            eps_v=obj.ppo.cliprange_value,
            num_items=norm.get("num_items"),
        )
        total = loss + obj.ppo.vf_coef * vf
        return total, (aux._replace(loss=sg(total)), ValueAux(sg(vf), vf_clip))

    def step(state: TrainState, batch: RolloutBatch, frozen: Any = None):
        batch, finite, rewards, mask, adv = prepare(batch)
        logp_ref = None
        if obj.uses_reference:
            logp_ref = sg(token_stats(state.ref_params, frozen, batch)[0])
        n_samples = jnp.sum(batch.group_mask)
        logp_behaviour = batch.logp_sampler if obj.loss.uses_behaviour else None

        def loss_fn(params, logp_old, first):
            logp, ent = token_stats(params, frozen, batch)
            logp_old = jnp.where(first, sg(logp), logp_old)
            anchor = logp_ref if anchor_is_ref else logp_old
            signals = measure(ent, logp, anchor, mask)
            kl_coef = kl_ctrl.applied(state.kl_ctrl, signals[kl_ctrl.measures])
            ent_coef = ent_ctrl.applied(state.ent_ctrl, signals[ent_ctrl.measures])
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
                logp_behaviour=logp_behaviour,
            )
            return loss, (aux, logp, kl_coef, ent_coef, signals)

        def iteration(carry, it):
            params, opt_state, logp_old = carry
            (_, (aux, logp, kl_coef, ent_coef, signals)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, logp_old, it == 0
            )
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            logp_old = jnp.where(it == 0, sg(logp), logp_old)
            return (params, opt_state, logp_old), (aux, kl_coef, ent_coef, signals, optax.tree.norm(grads))

        carry = (state.params, state.opt_state, jnp.zeros(batch.completions.shape, jnp.float32))
        (params, opt_state, logp_first), per_it = jax.lax.scan(
            iteration, carry, jnp.arange(obj.num_iterations)
        )
        aux, kl_coef, ent_coef, signals, grad_norm = jax.tree.map(lambda x: x[0], per_it)  # iteration 1
        updated = dict(
            params=params, opt_state=opt_state, aux=aux, logp_first=logp_first, grad_norm=grad_norm
        )
        coefs = dict(kl_coef=kl_coef, ent_coef=ent_coef, signals=signals, last_loss=per_it[0].loss[-1])
        return finish(state, batch, rewards, mask, adv, finite, n_samples, **updated, **coefs)

    def step_ppo(state: TrainState, batch: RolloutBatch, frozen: Any = None):
        """The plain step for PPO: the first iteration's forward gives π_old and V_old (stop-gradient), and
        with them β, the per-token rewards, advantages and returns, which later iterations reuse."""
        batch, finite, rewards, mask, _ = prepare(batch)
        logp_ref = None
        if obj.uses_reference:
            logp_ref = sg(token_stats(state.ref_params, frozen, batch)[0])
        n_samples = jnp.sum(batch.group_mask)
        logp_behaviour = batch.logp_sampler if obj.loss.uses_behaviour else None

        def loss_fn(params, old, first):
            logp, ent, values = token_stats(params, frozen, batch)
            logp_old = jnp.where(first, sg(logp), old["logp"])
            values_old = jnp.where(first, sg(values), old["values"])
            signals = measure(ent, logp, logp_ref, mask)
            kl_coef = kl_ctrl.applied(state.kl_ctrl, signals[kl_ctrl.measures])
            ent_coef = ent_ctrl.applied(state.ent_ctrl, signals[ent_ctrl.measures])
            fresh = ppo_targets(rewards, logp_old, logp_ref, values_old, mask, kl_coef)
            tgt = jax.tree.map(lambda a, b: jnp.where(first, a, b), fresh, old["targets"])
            loss, (aux, vaux) = ppo_objective(
                logp, ent, values, logp_old, logp_ref, tgt, values_old, mask, ent_coef, logp_behaviour
            )
            used = {"logp": logp_old, "values": values_old, "targets": tgt}
            return loss, (aux, vaux, used, kl_coef, ent_coef, signals)

        def iteration(carry, it):
            params, opt_state, old = carry
            (_, (aux, vaux, old, kl_coef, ent_coef, signals)), grads = jax.value_and_grad(
                loss_fn, has_aux=True
            )(params, old, it == 0)
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state, old), (aux, vaux, kl_coef, ent_coef, signals, optax.tree.norm(grads))

        zeros = jnp.zeros(batch.completions.shape, jnp.float32)
        old0 = {"logp": zeros, "values": zeros, "targets": PPOTargets(zeros, zeros, zeros)}
        (params, opt_state, old), per_it = jax.lax.scan(
            iteration, (state.params, state.opt_state, old0), jnp.arange(obj.num_iterations)
        )
        aux, vaux, kl_coef, ent_coef, signals, grad_norm = jax.tree.map(lambda x: x[0], per_it)
        updated = dict(
            params=params, opt_state=opt_state, aux=aux, logp_first=old["logp"], grad_norm=grad_norm
        )
        coefs = dict(kl_coef=kl_coef, ent_coef=ent_coef, signals=signals, last_loss=per_it[0].loss[-1])
        critic = dict(targets=old["targets"], values_old=old["values"], value_aux=vaux)
        tgt = old["targets"]
        return finish(state, batch, rewards, mask, tgt.adv, finite, n_samples, **updated, **coefs, ppo=critic)

    def constrain(tree):
        """Pin a (micro-)batch's rows to the batch sharding (data x fsdp) so XLA keeps them local."""
        if batch_sh is None or not isinstance(batch_sh, jax.sharding.NamedSharding):
            return tree
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sh), tree)

    def step_split(state: TrainState, batch: RolloutBatch, frozen: Any = None):
        """The step with mini-batches and / or gradient accumulation (m·k > 1; see make_train_step)."""
        batch, finite, rewards, mask, adv = prepare(batch)
        n_samples = jnp.sum(batch.group_mask)
        B, G = batch.rewards.shape
        n_chunks = n_mini * n_micro
        if B % n_chunks:
            raise ValueError(
                f"train step: B={B} prompts do not split into {n_mini} x {n_micro} micro-batches"
            )

        # one pass without gradients at the step's parameters: π_old, π_ref, entropies (micro-batch chunks)
        # (PPO: and V_old)
        def stats(x):
            out = token_stats(state.params, frozen, x)
            lp, ent = out[0], out[1]
            ref = sg(token_stats(state.ref_params, frozen, x)[0]) if obj.uses_reference else None
            if ppo:
                return sg(lp), sg(ent), ref, sg(out[2])
            return sg(lp), sg(ent), ref

        lp0, ent0, ref0, *v0 = _unsplit(jax.lax.map(lambda x: stats(constrain(x)), _split(batch, n_chunks)))
        anchor0 = ref0 if anchor_is_ref else lp0
        signals = measure(ent0, lp0, anchor0, mask)
        kl_coef = kl_ctrl.applied(state.kl_ctrl, signals[kl_ctrl.measures])
        ent_coef = ent_ctrl.applied(state.ent_ctrl, signals[ent_ctrl.measures])
        thr = None
        if obj.loss.top_entropy_quantile < 1.0:
            thr = masked_quantile(ent0, mask, 1.0 - obj.loss.top_entropy_quantile)
        critic = None
        if ppo:  # over the whole rollout batch (whitening included), before it is split
            tgt = ppo_targets(rewards, lp0, ref0, v0[0], mask, kl_coef)
            adv = tgt.adv
            critic = dict(targets=tgt, values_old=v0[0])
        per_row = {
            "batch": batch,
            "mask": mask,
            "adv": adv,
            "logp_old": lp0,
            "logp_ref": ref0,
            "behaviour": batch.logp_sampler if obj.loss.uses_behaviour else None,
        }
        if ppo:
            per_row.update(returns=critic["targets"].returns, values_old=critic["values_old"])
        rows_per_mini = B // n_mini

        def micro_loss(params, mb, counts):
            if ppo:
                lp, ent, values = token_stats(params, frozen, mb["batch"])
                tgt_mb = PPOTargets(mb["adv"], mb["returns"], jnp.zeros_like(mb["adv"]))
                return ppo_objective(
                    lp,
                    ent,
                    values,
                    mb["logp_old"],
                    mb["logp_ref"],
                    tgt_mb,
                    mb["values_old"],
                    mb["mask"],
                    ent_coef,
                    mb["behaviour"],
                    num_items=counts["tokens"],
                    num_seqs=rows_per_mini * G,
                    entropy_threshold=thr,
                    entropy_items=counts["entropy_tokens"],
                )
            lp, ent = token_stats(params, frozen, mb["batch"])
            return grpo_loss(
                lp,
                mb["logp_old"],
                mb["logp_ref"],
                mb["adv"],
                mb["mask"],
                cfg=obj.loss,
                kl_coef=kl_coef,
                entropy_coef=ent_coef,
                entropy=ent,
                logp_behaviour=mb["behaviour"],
                num_items=counts["tokens"],
                num_seqs=rows_per_mini * G,
                entropy_threshold=thr,
                entropy_items=counts["entropy_tokens"],
            )

        grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

        def update(carry, u):
            params, opt_state = carry
            epoch = u // n_mini
            j = u % n_mini
            order = jnp.arange(B)
            if n_mini > 1:  # PPO-style: a fresh shuffle of the prompts every epoch
                order = jax.random.permutation(state.key("train", "minibatch", epoch), B)
            rows = jax.lax.dynamic_slice_in_dim(order, j * rows_per_mini, rows_per_mini)
            mini = jax.tree.map(lambda x: x[rows], per_row)
            m_tok = mini["mask"]
            ent_tok = m_tok
            if thr is not None:
                ent_tok = m_tok * ((ent0[rows] * m_tok >= thr) & (m_tok > 0))
            counts = {"tokens": m_tok.sum(), "entropy_tokens": ent_tok.sum()}

            def micro(acc, mb):
                mb = {**mb, "batch": constrain(mb["batch"])}
                (_, aux), g = grad_fn(params, mb, counts)
                return jax.tree.map(jnp.add, acc, g), (aux, mb["mask"].sum())

            zeros = jax.tree.map(jnp.zeros_like, params)
            grads, (aux, tok) = jax.lax.scan(micro, zeros, _split(mini, n_micro))
            updates, opt_state = optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return (params, opt_state), (aux, tok, optax.tree.norm(grads))

        n_updates = obj.num_iterations * n_mini
        (params, opt_state), (aux_all, tok_all, gn_all) = jax.lax.scan(
            update, (state.params, state.opt_state), jnp.arange(n_updates)
        )
        # diagnostics: the first epoch's updates (m mini-batches x k micro-batches) combined
        first = jax.tree.map(lambda x: x[:n_mini].reshape(-1, *x.shape[2:]), aux_all)
        tok_first = tok_all[:n_mini].reshape(-1)
        if ppo:
            (first, vfirst), aux_all = first, aux_all[0]
            w = tok_first / jnp.maximum(tok_first.sum(), 1.0)
            critic["value_aux"] = ValueAux(
                vf_loss=vfirst.vf_loss.sum() / n_mini, vf_clip_frac=jnp.sum(vfirst.vf_clip_frac * w)
            )
        aux = combine_aux(first, tok_first, obj.loss.importance_level)
        aux = aux._replace(loss=aux.loss / n_mini, pg_loss=aux.pg_loss / n_mini)
        last_loss = jnp.sum(aux_all.loss[-1])
        updated = dict(params=params, opt_state=opt_state, aux=aux, logp_first=lp0, grad_norm=gn_all[0])
        coefs = dict(kl_coef=kl_coef, ent_coef=ent_coef, signals=signals, last_loss=last_loss)
        return finish(state, batch, rewards, mask, adv, finite, n_samples, **updated, **coefs, ppo=critic)

    def finish(
        state,
        batch,
        rewards,
        mask,
        adv,
        finite,
        n_samples,
        *,
        params,
        opt_state,
        aux,
        logp_first,
        grad_norm,
        kl_coef,
        ent_coef,
        signals,
        last_loss,
        ppo=None,
    ):
        """Controllers, reference update and metrics after the updates (both step forms). `ppo`: the
        critic's targets, V_old and ValueAux (adv is then per token)."""
        kl_state = kl_ctrl.update(state.kl_ctrl, signals[kl_ctrl.measures], n_steps=n_samples)
        ent_state = ent_ctrl.update(state.ent_ctrl, signals[ent_ctrl.measures], n_steps=n_samples)
        ref_params, ref_due = update_reference(state.ref_params, params, state.step + 1, obj)
        adv_tok = None
        if ppo is not None:  # the sequence-level metrics see each sequence's mean token advantage
            adv_tok, adv = adv, masked_mean(adv, mask, axis=-1)
        metrics = _metrics(batch, rewards, obj, mask, adv, aux, logp_first, grad_norm, opt_state)
        metrics.update(
            {
                "coef/kl": kl_coef,
                "coef/entropy": ent_coef,
                "coef/kl_next": kl_state.coef,
                "coef/entropy_next": ent_state.coef,
                "loss/final_iteration": last_loss,
                "nonfinite/rewards": jnp.sum(~finite).astype(jnp.float32),
                "ref/updated": ref_due,
            }
        )
        if obj.overlong_cache_len > 0:
            metrics["reward/correctness"] = masked_mean(batch.rewards, batch.group_mask)
            metrics["reward/overlong"] = masked_mean(rewards - batch.rewards, batch.group_mask)
        if obj.baseline != "group":
            metrics.update(_baseline_metrics(batch))
        if obj.loss.tis_enabled:  # off-policy diagnostics: the IS-correction weights of this batch
            metrics["tis/weight_mean"] = aux.is_weight_mean
            if obj.loss.tis_cap is not None:
                w_raw = jnp.exp(jnp.where(mask > 0, logp_first - batch.logp_sampler, 0.0))
                metrics["tis/capped_frac"] = masked_mean((w_raw > obj.loss.tis_cap).astype(jnp.float32), mask)
        if obj.loss.off_policy_mask_threshold is not None:
            metrics["off_policy_mask/kept"] = aux.off_policy_kept
        if obj.loss.top_entropy_quantile < 1.0:
            metrics["entropy_mask/kept"] = aux.entropy_kept
        if obj.loss.objective == "vespo":
            metrics["vespo/phi_seq_mean"] = aux.phi_mean
        outputs = {"advantages": adv, "rewards": rewards}
        if ppo is not None:
            metrics.update(_ppo_metrics(ppo, adv_tok, rewards, mask))
            nan = jnp.float32(jnp.nan)  # histograms drop non-finite entries: only the valid tokens show
            outputs["advantages"] = jnp.where(mask > 0, adv_tok, nan)
            outputs["values"] = jnp.where(mask > 0, ppo["values_old"], nan)
        new_state = state.replace(
            step=state.step + 1,
            params=params,
            opt_state=opt_state,
            kl_ctrl=kl_state,
            ent_ctrl=ent_state,
            ref_params=ref_params,
        )
        return new_state, metrics, outputs

    if n_mini * n_micro > 1:
        step = step_split
    elif ppo:
        step = step_ppo
    if not jit:
        return step
    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    state_sh, b_sh, *rest = shardings
    frozen_sh = rest[0] if rest else None
    jitted = jax.jit(
        step,
        donate_argnums=0,
        in_shardings=(state_sh, b_sh, frozen_sh),
        out_shardings=(state_sh, None, None),
    )

    def sharded_step(state: TrainState, batch: RolloutBatch, frozen: Any = None):
        return jitted(state, batch, frozen)  # frozen positional: in_shardings covers every argument

    sharded_step._cache_size = jitted._cache_size
    return sharded_step


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


def _baseline_metrics(batch: RolloutBatch) -> dict[str, jax.Array]:
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


def _ppo_metrics(ppo: dict, adv: jax.Array, scores: jax.Array, mask: jax.Array) -> dict[str, jax.Array]:
    """The critic's diagnostics (PPO) and the token-level advantage statistics that replace the sequence
    ones: value loss / clip fraction of the first epoch's updates; V_old, returns and explained variance
    (SB3: 1 − Var(R̂ − V_old) / Var(R̂)) over the valid tokens; the KL part of the reward (TRL's
    objective/non_score_reward: Σ_t −β·k_t, mean over sequences)."""
    tgt, v_old, vaux = ppo["targets"], ppo["values_old"], ppo["value_aux"]
    has = (mask.sum(-1) > 0).astype(jnp.float32)
    kl_part = tgt.rewards.sum(-1) - jnp.where(has > 0, scores, 0.0)
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


def _metrics(batch, rewards, obj, mask, adv, aux, logp, grad_norm, opt_state) -> dict[str, jax.Array]:
    gm = batch.group_mask
    r = rewards
    n = jnp.maximum(gm.sum(), 1.0)
    # per-group reward std (population) to detect groups that give no policy gradient
    g_std = masked_std(r, gm, axis=-1)
    groups_valid = (gm.sum(-1) > 0).astype(jnp.float32)
    lengths = batch.completion_mask.sum(-1)
    success = (batch.rewards >= obj.success_threshold).astype(jnp.float32)
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
        "clip_ratio/low_min": aux.clip_low_min,
        "clip_ratio/high_max": aux.clip_high_max,
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


def _split(tree: Any, n: int) -> Any:
    """[B, ...] leaves -> [n, B/n, ...], strided (row b goes to part b mod n), so a batch sharded in
    contiguous row blocks over the devices gives every part a share of every device's rows (no data
    movement)."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1), tree)


def _unsplit(tree: Any) -> Any:
    """The inverse of _split: [n, B/n, ...] -> [B, ...]."""
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), tree)


# how each LossAux field of the micro-batches combines into the whole batch's value
_SUMMED = ("loss", "pg_loss")  # already normalised by the whole batch's counts
_MAXED = ("ratio_max", "clip_high_max")
_MINNED = ("ratio_min", "clip_low_min")
_SEQ_MEANS = ("off_policy_kept",)  # plain means over sequences (equal-sized micro-batches)


def combine_aux(aux: LossAux, tokens: jax.Array, importance_level: str) -> LossAux:
    """One LossAux from micro-batch ones stacked on axis 0 (`tokens` [n]: each one's valid tokens): sums for
    the globally normalised losses, max / min for the extremes, plain means for per-sequence shares (and the
    clip fractions at importance_level="sequence"), token-weighted means for the token means."""
    w = tokens / jnp.maximum(tokens.sum(), 1.0)
    seq_means = _SEQ_MEANS + (
        ("clip_low_frac", "clip_high_frac", "clip_region_frac") if importance_level == "sequence" else ()
    )
    has = tokens > 0
    out = {}
    for name, x in aux._asdict().items():
        if name in _SUMMED:
            out[name] = x.sum()
        elif name in _MAXED:
            out[name] = jnp.where(has.any(), jnp.where(has, x, -jnp.inf).max(), 0.0)
        elif name in _MINNED:
            out[name] = jnp.where(has.any(), jnp.where(has, x, jnp.inf).min(), 0.0)
        elif name in seq_means:
            out[name] = x.mean()
        else:
            out[name] = jnp.sum(x * w)
    return LossAux(**out)
