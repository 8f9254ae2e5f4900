"""Group advantages for GRPO and its variants (docs/GRPO_MATH.md §1, §3 row 4, §4 T1/T1b).

Shapes: rewards are [..., G] — any leading batch axes (typically [B, G]: B prompts, G completions each); the
group is always the LAST axis. A `mask` of the same shape marks valid group members (1/True) — e.g. padding
slots or filtered samples (0/False). Masked members get advantage 0 and do not enter the group statistics.

Every function is pure, jit/vmap-safe and computes in float32. A group whose valid rewards are all equal
(zero variance) gets advantage exactly 0 — never NaN, even with eps=0 — by a `jnp.where` guard on an exact
"all equal" test (max == min over the valid members), so rounding in the mean cannot leak a ±1 through.
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp

# estimators that need only the group's rewards (a run selects one: --adv_method); "scaled_baseline" also
# needs an external per-prompt baseline (the run's pool baseline is --baseline=pool|mix on top of "grpo")
GROUP_ADV_METHODS = ("grpo", "dr_grpo", "rloo", "batch_std")
ADV_METHODS = (*GROUP_ADV_METHODS, "scaled_baseline")


# ------------------------------------------------------------------------------------------------------------
# helpers
# ------------------------------------------------------------------------------------------------------------


def _prep(rewards, mask):
    """float32 rewards and mask; a NaN reward (a reward function that returned None) is masked out: excluded
    from its group's statistics, advantage 0 (TRL 1.16)."""
    r = jnp.asarray(rewards, jnp.float32)
    if mask is None:
        m = jnp.ones_like(r)
    else:
        m = jnp.asarray(mask).astype(jnp.float32)
        chex.assert_equal_shape([r, m])
    nan = jnp.isnan(r)
    return jnp.where(nan, 0.0, r), jnp.where(nan, 0.0, m)


def _group_stats(r, m, axis, ddof):
    """Masked mean, std (with ddof), count and an exact all-equal flag over `axis` (kept as size-1 dims)."""
    n = m.sum(axis, keepdims=True)
    mean = (r * m).sum(axis, keepdims=True) / jnp.maximum(n, 1.0)
    var = (jnp.square(r - mean) * m).sum(axis, keepdims=True) / jnp.maximum(n - ddof, 1.0)
    var = jnp.where(n > ddof, var, 0.0)
    std = jnp.where(var > 0, jnp.sqrt(jnp.where(var > 0, var, 1.0)), 0.0)
    valid = m > 0
    rmax = jnp.where(valid, r, -jnp.inf).max(axis, keepdims=True)
    rmin = jnp.where(valid, r, jnp.inf).min(axis, keepdims=True)
    # True for all-equal groups AND for empty groups (max=-inf, min=+inf -> not equal, so also test n).
    all_equal = (rmax == rmin) | (n == 0) | (std == 0)
    return mean, std, n, all_equal


def _safe_div(num, den, zero):
    """num/den where not `zero`, else 0 — with a safe denominator so neither value nor gradient is NaN."""
    return jnp.where(zero, 0.0, num / jnp.where(zero, 1.0, den))


# ------------------------------------------------------------------------------------------------------------
# group advantages
# ------------------------------------------------------------------------------------------------------------


def group_zscore(rewards: jax.Array, *, ddof: int = 1, eps: float = 1e-4, mask: jax.Array | None = None):
    """Canonical GRPO outcome advantage (DeepSeekMath §4.1.2, arXiv 2402.03300; TRL grpo_trainer.py):

        Â_i = (r_i − mean_G(r)) / (std_G(r; ddof) + eps)

    rewards: [..., G]. ddof=1 + eps=1e-4 is TRL (`nanstd` + 1e-4): r=[1,0,0,0] -> 1.4997 (T1).
    Zero-variance (and empty) groups give exactly 0. Masked members give 0.
    Returns [..., G] float32.
    """
    r, m = _prep(rewards, mask)  # [..., G]
    mean, std, _, zero = _group_stats(r, m, -1, ddof)  # [..., 1]
    return _safe_div(r - mean, std + eps, zero) * m


def group_mean_only(rewards: jax.Array, *, mask: jax.Array | None = None):
    """Dr. GRPO advantage (arXiv 2503.20783; TRL scale_rewards="none"): Â_i = r_i − mean_G(r).

    rewards: [..., G] -> [..., G]. All-equal groups give exactly 0; masked members give 0.
    """
    r, m = _prep(rewards, mask)
    mean, _, _, zero = _group_stats(r, m, -1, 0)
    return jnp.where(zero, 0.0, r - mean) * m


def rloo(rewards: jax.Array, *, mask: jax.Array | None = None):
    """RLOO leave-one-out advantage (Ahmadian et al. 2024, arXiv 2402.14740; TRL rloo_trainer.py):

        Â_i = r_i − (1/(n−1)) Σ_{j≠i} r_j  =  n/(n−1) · (r_i − mean)        (n = valid members of the group)

    rewards: [..., G] -> [..., G]. Groups with n <= 1 valid members (no leave-one-out baseline) and all-equal
    groups give 0; masked members give 0.
    """
    r, m = _prep(rewards, mask)
    _, _, n, zero = _group_stats(r, m, -1, 0)
    total = (r * m).sum(-1, keepdims=True)
    loo_mean = (total - r) / jnp.maximum(n - 1.0, 1.0)
    return jnp.where(zero | (n <= 1), 0.0, r - loo_mean) * m


def batch_std_scaled(rewards: jax.Array, *, ddof: int = 1, eps: float = 1e-4, mask: jax.Array | None = None):
    """Group mean, batch std (TRL scale_rewards="batch"; Lite PPO):

        Â_{b,i} = (r_{b,i} − mean_G(r_b)) / (std(all valid rewards of the batch; ddof) + eps)

    rewards: [..., G]; the std runs over ALL axes (every valid reward of every group), like TRL's
    `rewards.std()`. Inside a jit over a sharded batch this is the global-batch std. A batch with zero
    variance gives 0; all-equal groups give exactly 0; masked members give 0.
    """
    r, m = _prep(rewards, mask)
    mean, _, _, group_zero = _group_stats(r, m, -1, ddof)
    axes = tuple(range(r.ndim))
    _, bstd, _, batch_zero = _group_stats(r, m, axes, ddof)  # [1, ..., 1]
    centred = jnp.where(group_zero, 0.0, r - mean)
    return _safe_div(centred, bstd + eps, batch_zero) * m


def scaled_baseline(
    rewards: jax.Array,
    baseline: jax.Array,
    *,
    ddof: int = 1,
    eps: float = 1e-4,
    mask: jax.Array | None = None,
    std_floor: float = 1.0,
):
    """Scale-only external baseline (docs/GRPO_MATH.md §3 row 4, T1b) — the form in which a baseline matters:

        Â_i = (r_i − b) / (std_G(r; ddof) + eps)           if the group's valid rewards are not all equal
        Â_i = (r_i − b) / std_floor                        if they are all equal (std = 0)

    rewards: [..., G]; baseline: [...] (one per group, e.g. the mean return of the pool's K snapshots on the
    SAME prompt; broadcast over G). No re-centring on the group mean: a z-score of (r − b) would cancel any
    constant b (T1b: z-score of r − b == z-score of r). The all-equal case divides by `std_floor` (default
    1.0) instead of 0 so advantages stay finite AND meaningful: an all-fail group (r = 0) whose baseline is
    > 0 gets negative advantages (the prompt did worse than the pool), an all-pass group above the pool gets
    positive ones. T1b: r=[1,0,0,1], b=0.25, ddof=1, eps=0 -> [1.299038, −0.433013, −0.433013, 1.299038].
    The baseline is stop-gradient'ed (it must not depend on the sampled completions). Masked members give 0.
    """
    r, m = _prep(rewards, mask)
    b = jax.lax.stop_gradient(jnp.broadcast_to(jnp.asarray(baseline, jnp.float32), r.shape[:-1]))[..., None]
    _, std, _, zero = _group_stats(r, m, -1, ddof)
    scale = jnp.where(zero, jnp.float32(std_floor), std + eps)
    return (r - b) / scale * m


def pool_baseline_advantages(
    rewards: jax.Array,
    pool_baseline: jax.Array,
    pool_valid: jax.Array,
    *,
    mix: float = 1.0,
    ddof: int = 1,
    eps: float = 1e-4,
    mask: jax.Array | None = None,
    std_floor: float = 1.0,
):
    """The policy-pool baseline (`--baseline=pool|mix`), in the scale-only form of `scaled_baseline`:

        b = mix · b_pool(q) + (1 − mix) · mean_G(r)      where the pool has returns on q (pool_valid)
        b = mean_G(r)                                    otherwise
        Â_i = (r_i − b) / (std_G(r; ddof) + eps),   or (r_i − b) / std_floor for an all-equal group.

    rewards [..., G]; pool_baseline, pool_valid [...]. mix = 1 is the pure pool baseline, mix = 0 (or no pool
    returns) is exactly canonical GRPO (an all-equal group then gets r − mean = 0). The pool matters most on
    all-equal groups: all G completions fail while pool members passed → negative advantages; all pass where
    the pool failed → positive. Literal cases: tests/test_pool.py.
    """
    r, m = _prep(rewards, mask)
    mean, _, _, _ = _group_stats(r, m, -1, ddof)
    mean = mean[..., 0]
    bp = jnp.asarray(pool_baseline, jnp.float32)
    b = jnp.where(jnp.asarray(pool_valid) > 0, mix * bp + (1.0 - mix) * mean, mean)
    return scaled_baseline(r, b, ddof=ddof, eps=eps, mask=m, std_floor=std_floor)


def process_advantages(
    step_rewards: jax.Array,
    step_end: jax.Array,
    step_mask: jax.Array,
    num_tokens: int,
    *,
    ddof: int = 1,
    eps: float = 1e-4,
):
    """Process-supervision advantage (DeepSeekMath §4.1.3, arXiv 2402.03300):

        r̃_i^{index(j)} = (r_i^{index(j)} − mean(R)) / (std(R; ddof) + eps)     R = all valid step rewards of
                                                                                the group (over G AND S)
        Â_{i,t} = Σ_{j : index(j) ≥ t} r̃_i^{index(j)}

    step_rewards: [B, G, S] (S = max steps per completion), step_end: [B, G, S] int, the 0-based token index
    at which step j ends (inclusive), step_mask: [B, G, S] valid steps. num_tokens: static T.
    Returns [B, G, T] float32. Tokens after the last step's end get 0. A step_end >= T counts for every token
    (it is clipped to T−1); a negative step_end counts for none. All-equal groups give 0.
    Leading axes before [G, S] may be any shape (B is not special).
    """
    r = jnp.asarray(step_rewards, jnp.float32)  # [B, G, S]
    m = jnp.asarray(step_mask).astype(jnp.float32)
    end = jnp.asarray(step_end).astype(jnp.int32)
    chex.assert_equal_shape([r, m, end])
    chex.assert_rank(r, {3})
    T = int(num_tokens)
    mean, std, _, zero = _group_stats(r, m, (-2, -1), ddof)  # [B, 1, 1]
    norm = _safe_div(r - mean, std + eps, zero) * m  # [B, G, S]
    norm = jnp.where(end >= 0, norm, 0.0)
    idx = jnp.clip(end, 0, T - 1)
    lead = r.shape[:-1]  # [B, G]
    flat_idx = idx.reshape(-1, r.shape[-1])
    flat_val = norm.reshape(-1, r.shape[-1])
    # Scatter each step's normalised reward at its end token, then a reverse cumulative sum over tokens:
    # A[t] = Σ_{j: end_j >= t} r̃_j.
    at_end = jax.vmap(lambda i, v: jnp.zeros((T,), jnp.float32).at[i].add(v))(flat_idx, flat_val)  # [B·G, T]
    adv = jnp.cumsum(at_end[:, ::-1], axis=-1)[:, ::-1]
    return adv.reshape(*lead, T)


def compute_advantages(
    rewards: jax.Array,
    *,
    method: str,
    ddof: int = 1,
    eps: float = 1e-4,
    mask: jax.Array | None = None,
    baseline: jax.Array | None = None,
    std_floor: float = 1.0,
):
    """Dispatch on a static `method` string: "grpo" (group_zscore), "dr_grpo" (group_mean_only), "rloo",
    "batch_std" (batch_std_scaled), "scaled_baseline" (needs `baseline`). rewards: [..., G] -> [..., G]."""
    if method == "grpo":
        return group_zscore(rewards, ddof=ddof, eps=eps, mask=mask)
    if method == "dr_grpo":
        return group_mean_only(rewards, mask=mask)
    if method == "rloo":
        return rloo(rewards, mask=mask)
    if method == "batch_std":
        return batch_std_scaled(rewards, ddof=ddof, eps=eps, mask=mask)
    if method == "scaled_baseline":
        if baseline is None:
            raise ValueError(
                "compute_advantages(method='scaled_baseline') needs a `baseline` array; got None."
            )
        return scaled_baseline(rewards, baseline, ddof=ddof, eps=eps, mask=mask, std_floor=std_floor)
    raise ValueError(f"compute_advantages: unknown method {method!r}; valid methods are {ADV_METHODS}.")


def whiten(
    x: jax.Array, mask: jax.Array, *, shift_mean: bool = True, eps: float = 1e-8, unbiased: bool = True
):
    """TRL `masked_whiten` (trl/trainer/utils.py; used on PPO advantages, docs/GRPO_MATH.md §2):

        x̂ = (x − mean_m(x)) · rsqrt(var_m(x) + eps)        (+ mean_m(x) back if not shift_mean)

    Mean and variance run over ALL valid entries (every axis); var is Bessel-corrected (n/(n−1)) when
    `unbiased` and n > 1, as TRL's `masked_var(unbiased=True)`. Like TRL, every position is returned whitened,
    including masked ones (multiply by the mask if you need zeros there).
    """
    x32 = jnp.asarray(x, jnp.float32)
    m = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), x32.shape)
    n = m.sum()
    mean = (x32 * m).sum() / jnp.maximum(n, 1.0)
    var = (jnp.square(x32 - mean) * m).sum() / jnp.maximum(n, 1.0)
    if unbiased:
        var = jnp.where(n > 1, var * n / jnp.maximum(n - 1.0, 1.0), var)
    out = (x32 - mean) * jax.lax.rsqrt(var + eps)
    if not shift_mean:
        out = out + mean
    return out


# ------------------------------------------------------------------------------------------------------------
# several reward functions (TRL reward_funcs + reward_weights + multi_objective_aggregation)
# ------------------------------------------------------------------------------------------------------------
MULTI_REWARD_AGGREGATIONS = ("sum_then_normalize", "normalize_then_sum")
REWARD_SCALES = ("group", "batch", "none")


def _nanmean(x, axis, keepdims=True):
    v = ~jnp.isnan(x)
    n = v.sum(axis, keepdims=keepdims)
    s = jnp.where(v, x, 0.0).sum(axis, keepdims=keepdims)
    return jnp.where(n > 0, s / jnp.maximum(n, 1), jnp.nan)


def _nanstd(x, axis, keepdims=True):
    """TRL's nanstd: Bessel-corrected over the non-NaN entries; NaN with fewer than two."""
    v = ~jnp.isnan(x)
    n = v.sum(axis, keepdims=True)
    mean = _nanmean(x, axis, keepdims=True)
    var = _nanmean(jnp.square(x - mean), axis, keepdims=True) * (n / jnp.maximum(n - 1, 1))
    std = jnp.where(n > 1, jnp.sqrt(jnp.where(n > 1, var, 0.0)), jnp.nan)
    return std if keepdims else jnp.squeeze(std, axis)


def multi_reward_advantages(
    rewards_per_func: jax.Array,
    weights: jax.Array | None = None,
    *,
    aggregation: str = "sum_then_normalize",
    scale: str = "group",
    eps: float = 1e-4,
) -> tuple[jax.Array, jax.Array]:
    """Advantages from several reward functions (TRL 1.16 `_generate_and_score_completions`), NaN = a reward
    function that returned None for that completion:

      "sum_then_normalize":  r_i = Σ_k w_k r_{i,k} over the non-NaN k;  Â_i = (r_i − mean_G r) [/ (std + eps)]
                             with the std per group (scale="group"), over the batch ("batch") or none
      "normalize_then_sum":  r̃_{i,k} = (r_{i,k} − mean_G r_k) / (std_G r_k + eps);  r_i = Σ_k w_k r̃_{i,k};
                             Â_i = (r_i − mean_batch r) / (std_batch r + eps)      (scale is not used)

    Means and stds ignore NaN (std Bessel-corrected, NaN with fewer than two values). A completion for which
    every function returned NaN is unscorable: excluded from every mean and std, advantage 0. Any other
    undefined advantage (a group with one scorable member under a std) is 0 too, as TRL's nan_to_num.
    rewards_per_func [..., G, F] float (NaN allowed), weights [F] (default ones).
    Returns (advantages [..., G], rewards [..., G] — the combined reward, NaN where unscorable)."""
    if aggregation not in MULTI_REWARD_AGGREGATIONS:
        raise ValueError(f"unknown aggregation {aggregation!r}; valid: {MULTI_REWARD_AGGREGATIONS}")
    if scale not in REWARD_SCALES:
        raise ValueError(f"unknown scale {scale!r}; valid: {REWARD_SCALES}")
    r = jnp.asarray(rewards_per_func, jnp.float32)
    if r.ndim < 2:
        raise ValueError(f"rewards_per_func must be [..., G, F]; got shape {r.shape}")
    w = jnp.ones((r.shape[-1],), jnp.float32) if weights is None else jnp.asarray(weights, jnp.float32)
    chex.assert_shape(w, (r.shape[-1],))
    unscorable = jnp.isnan(r).all(-1)  # [..., G]
    all_axes = tuple(range(r.ndim - 1))
    if aggregation == "sum_then_normalize":
        rew = jnp.where(unscorable, jnp.nan, jnp.where(jnp.isnan(r), 0.0, r * w).sum(-1))
        mean = _nanmean(rew, -1)
        adv = rew - mean
        if scale == "group":
            std = _nanstd(rew, -1) if r.shape[-2] > 1 else jnp.zeros_like(mean)
            adv = adv / (std + eps)
        elif scale == "batch":
            adv = adv / (_nanstd(rew, all_axes) + eps)
    else:
        g = r.shape[-2]
        mean_k = _nanmean(r, -2)
        std_k = _nanstd(r, -2) if g > 1 else jnp.zeros_like(mean_k)
        rk = (r - mean_k) / (std_k + eps)
        rew = jnp.where(unscorable, jnp.nan, jnp.where(jnp.isnan(rk), 0.0, rk * w).sum(-1))
        adv = (rew - _nanmean(rew, all_axes)) / (_nanstd(rew, all_axes) + eps)
    return jnp.where(jnp.isnan(adv), 0.0, adv), rew


# ------------------------------------------------------------------------------------------------------------
# reward shaping before the advantages
# ------------------------------------------------------------------------------------------------------------


def soft_overlong_punishment(lengths: jax.Array, *, max_len: int, cache_len: int) -> jax.Array:
    """DAPO soft overlong punishment (Yu et al. 2025, arXiv 2503.14476, eq. 13;
    TRL get_soft_overlong_punishment; docs/GRPO_MATH.md T7), counted in TOKENS:

        R_length(y) = 0                                     |y| ≤ L_max − L_cache
                    = ((L_max − L_cache) − |y|) / L_cache   L_max − L_cache < |y| ≤ L_max
                    = −1                                    |y| > L_max

    lengths: any shape of token counts -> float32 of the same shape. Added to the correctness reward.
    """
    if cache_len <= 0 or max_len <= cache_len:
        raise ValueError(
            f"soft_overlong_punishment needs 0 < cache_len < max_len; got {max_len=}, {cache_len=}."
        )
    y = jnp.asarray(lengths, jnp.float32)
    free = float(max_len - cache_len)
    ramp = (free - y) / float(cache_len)
    return jnp.where(y <= free, 0.0, jnp.where(y <= float(max_len), ramp, -1.0))
