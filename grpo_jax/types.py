"""The neutral data types every layer may import: what the sampler returns and what the train step eats.

    SampleOutput   [B, G, T] sampled completions with their log-probs and masks (grpo_jax.policies.sampling)
    RolloutBatch      one step's rollout: prompts, completions, rewards and what the objective needs of them
    batch_from_samples / empty_batch   building a RolloutBatch

Shapes: B prompts, G completions per prompt, T completion tokens, P prompt tokens (left-padded), M tests.
"""

from __future__ import annotations

from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


class SampleOutput(NamedTuple):
    """Device arrays from the samplers; host (numpy) arrays from the host-side engines and multi-turn."""

    tokens: jax.Array | np.ndarray  # [B, G, T] int32, pad_id after EOS
    logp: jax.Array | np.ndarray  # [B, G, T] float32, 0 where mask is 0
    mask: jax.Array | np.ndarray  # [B, G, T] float32, 1 for sampled tokens up to and including EOS
    lengths: jax.Array | np.ndarray  # [B, G] int32
    truncated: jax.Array | np.ndarray  # [B, G] bool: no EOS within T tokens


@flax.struct.dataclass
class RolloutBatch:
    """One rollout batch. B prompts x G completions of T tokens; prompts are left-padded to P tokens."""

    prompt: jax.Array  # [B, P] int32
    prompt_mask: jax.Array  # [B, P] int32
    completions: jax.Array  # [B, G, T] int32
    completion_mask: jax.Array  # [B, G, T] float32: 1 for sampled tokens up to and including EOS
    rewards: jax.Array  # [B, G] float32 (correctness; reward shaping is the objective's, in the train step)
    group_mask: jax.Array  # [B, G] float32: 1 for members that take part (padding / filtered groups: 0)
    logp_sampler: jax.Array  # [B, G, T] float32: the behaviour policy's log-probs of the completion tokens
    truncated: jax.Array  # [B, G] bool: no EOS within T
    baseline: jax.Array  # [B] float32: external per-prompt baseline (the policy pool's mean return)
    baseline_valid: jax.Array  # [B] float32: 1 where `baseline` holds returns (else the group mean is used)
    test_rewards: jax.Array  # [B, G, M] float32: 1 where test m of the sample passed (multi-scale advantages)
    test_mask: jax.Array  # [B, M] float32: 1 for the problem's real tests


def batch_from_samples(
    prompt,
    prompt_mask,
    out: SampleOutput,
    rewards,
    group_mask=None,
    baseline=None,
    baseline_valid=None,
    test_rewards=None,
    test_mask=None,
) -> RolloutBatch:
    """The RolloutBatch of one rollout: prompts [B, P], a SampleOutput [B, G, T], rewards [B, G]; optionally
    the pool baseline [B] and its validity [B] (objective baseline "pool" / "mix"), and per-test results
    [B, G, M] with the test mask [B, M] (multi-scale advantages; default M = 1, all zero)."""
    rewards = jnp.asarray(rewards, jnp.float32)
    b, g = rewards.shape

    def arr(x, shape):
        return jnp.zeros(shape, jnp.float32) if x is None else jnp.asarray(x, jnp.float32)

    return RolloutBatch(
        prompt=jnp.asarray(prompt),
        prompt_mask=jnp.asarray(prompt_mask),
        completions=jnp.asarray(out.tokens),
        completion_mask=jnp.asarray(out.mask),
        rewards=rewards,
        group_mask=jnp.ones_like(rewards) if group_mask is None else jnp.asarray(group_mask, jnp.float32),
        logp_sampler=jnp.asarray(out.logp),
        truncated=jnp.asarray(out.truncated),
        baseline=arr(baseline, (b,)),
        baseline_valid=arr(baseline_valid, (b,)),
        test_rewards=arr(test_rewards, (b, g, 1)),
        test_mask=arr(test_mask, (b, 1)),
    )


def empty_batch(b: int, g: int, p: int, t: int, num_tests: int) -> RolloutBatch:
    """A zero RolloutBatch of the given shapes (e.g. the restore template of a pending async rollout)."""
    out = SampleOutput(
        jnp.zeros((b, g, t), jnp.int32),
        jnp.zeros((b, g, t), jnp.float32),
        jnp.zeros((b, g, t), jnp.float32),
        jnp.zeros((b, g), jnp.int32),
        jnp.zeros((b, g), bool),
    )
    return batch_from_samples(
        jnp.zeros((b, p), jnp.int32),
        jnp.zeros((b, p), jnp.int32),
        out,
        jnp.zeros((b, g), jnp.float32),
        baseline_valid=jnp.zeros((b,), jnp.float32),
        test_rewards=jnp.zeros((b, g, num_tests), jnp.float32),
        test_mask=jnp.zeros((b, num_tests), jnp.float32),
    )
