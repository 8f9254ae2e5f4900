"""How completions are generated: the second of the rollout's three parts (ProblemSource, Sampler, Grader).

    sampler.generate(params, prompt, prompt_mask, key) -> SampleOutput     # [B, P] prompts -> [B, G, T]

`KVCacheSampler` is the JAX KV-cache sampler of the policy (grpo_jax.policies.sampling: G completions per
prompt from one encoding of the prompt, temperature / top-k / top-p as data); `MemberSampler` (the policy
pool's members, grpo_jax.train.pool_host) is another implementation, and a different engine (a faster decoder,
a multi-turn loop that continues a conversation) plugs in here without touching the rest of the rollout.
The behaviour log-probs in SampleOutput.logp are those of the distribution actually sampled.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax

from grpo_jax.config import RolloutConfig
from grpo_jax.policies import continuation, sampling
from grpo_jax.types import SampleOutput


class Sampler(Protocol):
    """Anything that turns prompts into G completions each."""

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput: ...


class KVCacheSampler:
    """The policy's own sampler: `group` completions of at most `max_new_tokens` per prompt, stopping at any
    of `eos_ids` (one compiled while-loop; the sampling parameters are data). For multi-turn trajectories
    (grpo_jax.train.multiturn) it also keeps the first turn's KV cache and continues the conversations from it
    (grpo_jax.policies.continuation)."""

    def __init__(self, model, ro: RolloutConfig, *, eos_ids: tuple[int, ...], pad_id: int):
        self.params = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
        kw = dict(max_new=ro.max_new_tokens, eos_id=eos_ids, pad_id=pad_id, weights_dtype=ro.rollout_dtype)
        self._fn = sampling.make_sampler(model, group=ro.group_size, **kw)
        self._cached = sampling.make_sampler(model, group=ro.group_size, with_cache=True, **kw)
        self._continue = continuation.make_continuer(model, **kw)

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput:
        return self._fn(params, prompt, prompt_mask, key, self.params)

    def generate_cached(self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array):
        """`generate` that also returns the final KV cache, which a multi-turn trajectory's later turns
        continue: (SampleOutput, KVCache)."""
        return self._cached(params, prompt, prompt_mask, key, self.params)

    def continue_from_cache(self, params: Any, rc, tokens: jax.Array, mask: jax.Array, key: jax.Array):
        """A feedback turn [R, F] appended to cached conversations (a continuation.RowCache) and the next
        reply sampled: (SampleOutput [R, 1, T], the RowCache after it)."""
        return self._continue.extend_decode(params, rc, tokens, mask, key, self.params)

    def continue_from_tokens(self, params: Any, ctx: jax.Array, ctx_mask: jax.Array, key: jax.Array):
        """The next reply after conversations given as left-padded token contexts [R, S] (encoded here)."""
        return self._continue.from_tokens(params, ctx, ctx_mask, key, self.params)
