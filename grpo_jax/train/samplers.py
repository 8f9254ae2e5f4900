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
from grpo_jax.policies import sampling
from grpo_jax.types import SampleOutput


class Sampler(Protocol):
    """Anything that turns prompts into G completions each."""

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput: ...


class KVCacheSampler:
    """The policy's own sampler: `group` completions of at most `max_new_tokens` per prompt, stopping at any
    of `eos_ids` (one compiled while-loop; the sampling parameters are data)."""

    def __init__(self, model, ro: RolloutConfig, *, eos_ids: tuple[int, ...], pad_id: int):
        self.params = sampling.sampling_params(ro.temperature, ro.top_k, ro.top_p)
        self._fn = sampling.make_sampler(
            model, group=ro.group_size, max_new=ro.max_new_tokens, eos_id=eos_ids, pad_id=pad_id
        )
        self._one = sampling.make_sampler(
            model, group=1, max_new=ro.max_new_tokens, eos_id=eos_ids, pad_id=pad_id
        )

    def generate(
        self, params: Any, prompt: jax.Array, prompt_mask: jax.Array, key: jax.Array
    ) -> SampleOutput:
        return self._fn(params, prompt, prompt_mask, key, self.params)

    def continue_(
        self, params: Any, context: jax.Array, context_mask: jax.Array, key: jax.Array
    ) -> SampleOutput:
        """One more reply [R, 1, T] for each of R conversations [R, P'] (left-padded; a multi-turn
        trajectory's later turn, grpo_jax.train.multiturn). The conversation is encoded again (prefill), not
        continued from the previous turn's KV cache."""
        return self._one(params, context, context_mask, key, self.params)
