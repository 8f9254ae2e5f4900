"""GRPO alone on the synthetic counting task (grpo_jax.envs.token_task): sample -> reward -> train step.

    state, history = run(TokenTaskConfig(steps=150))      # ~25 s on a 2-core CPU; reward 0.07 -> ~0.97

The device side of GRPO with nothing else: no sandbox, no SFT. Used by tests/test_learning.py and by
`python -m experiments.token_task`. Keys: the "rollout" stream, named per step (grpo_jax.rng).
"""

from __future__ import annotations

import dataclasses
import time

from grpo_jax import rng as rng_lib
from grpo_jax.config import ObjectiveConfig, OptimConfig, RolloutConfig
from grpo_jax.envs.token_task import make_prompts, rewards
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step
from grpo_jax.types import batch_from_samples


@dataclasses.dataclass(frozen=True)
class TokenTaskConfig:
    vocab_size: int = 16
    prompt_len: int = 6  # P (left-padded); real prompt lengths are drawn from [2, P]
    prompts_per_step: int = 8  # B
    steps: int = 60
    seed: int = 0


def default_model(vocab_size: int) -> tfm.TransformerConfig:
    return tfm.TransformerConfig(
        vocab_size=vocab_size, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, qkv_bias=True
    )


def run(
    task: TokenTaskConfig = TokenTaskConfig(),
    model: tfm.TransformerConfig | None = None,
    obj: ObjectiveConfig = ObjectiveConfig(kl_coef=0.0),
    optim: OptimConfig = OptimConfig(learning_rate=3e-3),
    rollout: RolloutConfig = RolloutConfig(group_size=8, max_new_tokens=8),
    log_every: int = 0,
    print_fn=print,
):
    """Train with GRPO; return (final TrainState, list of per-step metric dicts as Python floats)."""
    model = model or default_model(task.vocab_size)
    optimizer = make_optimizer(optim)
    params = tfm.init_params(model, rng_lib.derive(rng_lib.streams(task.seed)["init"], "model"))
    state = init_state(params, obj, optimizer, seed=task.seed)
    train_step = make_train_step(model, obj, optimizer, temperature=rollout.temperature)
    sampler = sampling.make_sampler(
        model, group=rollout.group_size, max_new=rollout.max_new_tokens, eos_id=-1, pad_id=0
    )
    sp = sampling.sampling_params(rollout.temperature, rollout.top_k, rollout.top_p)
    history = []
    t0 = time.perf_counter()
    for i in range(task.steps):
        prompt, pmask = make_prompts(
            state.key("rollout", "prompts"), task.prompts_per_step, task.prompt_len, task.vocab_size
        )
        out = sampler(state.params, prompt, pmask, state.key("rollout", "sample"), sp)
        r = rewards(prompt, out.tokens, task.vocab_size)
        batch = batch_from_samples(prompt, pmask, out, r)
        state, metrics, _ = train_step(state, batch)
        m = {k: float(v) for k, v in metrics.items()}
        history.append(m)
        if log_every and (i % log_every == 0 or i == task.steps - 1):
            print_fn(
                f"step {i + 1:4d}/{task.steps}  reward {m['reward']:.3f}"
                f"  success {m['Performance/SuccessRate']:.3f}"
                f"  entropy {m['entropy']:.3f}  kl {m['kl']:.4f}  grad_norm {m['grad_norm']:.3f}"
                f"  {time.perf_counter() - t0:6.1f}s"
            )
    return state, history
