"""A synthetic token task that shows the device side of GRPO learns, in about a minute of CPU.

Vocabulary: 0 = pad, 1 = EOS (unused: completions have a fixed length), symbols 2 .. V-1 (S = V - 2 of them).
A prompt is a counting run of random start and random length (left-padded): s, s+1, ..., s+n-1 (mod S).
The rule: every completion token continues the count, c_t = c_{t-1} + 1 (mod S), with c_{-1} the last
prompt token. Reward = fraction of completion tokens that follow the rule, so chance is 1/S and the maximum 1.

Everything here is pure JAX; `run` is the whole GRPO loop (sample -> reward -> train_step) used by the test
and by `python -m experiments.token_task`.
"""

from __future__ import annotations

import dataclasses
import time

import jax
import jax.numpy as jnp

from grpo_jax.config import ObjectiveConfig, OptimConfig, RolloutConfig
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import batch_from_samples, make_train_step, transformer_logits_fn


@dataclasses.dataclass(frozen=True)
class TokenTaskConfig:
    vocab_size: int = 16
    prompt_len: int = 6  # P (left-padded); real prompt lengths are drawn from [2, P]
    prompts_per_step: int = 8  # B
    steps: int = 60
    seed: int = 0


def make_prompts(key: jax.Array, batch: int, prompt_len: int, vocab_size: int):
    """[B, P] left-padded counting prompts and their masks."""
    s = vocab_size - 2
    k1, k2 = jax.random.split(key)
    start = jax.random.randint(k1, (batch, 1), 0, s)
    length = jax.random.randint(k2, (batch, 1), 2, prompt_len + 1)
    idx = jnp.arange(prompt_len)[None, :]
    first = prompt_len - length  # index of the first real token
    tokens = 2 + (start + idx - first) % s
    mask = (idx >= first).astype(jnp.int32)
    return jnp.where(mask > 0, tokens, 0).astype(jnp.int32), mask


def rewards(prompt: jax.Array, completions: jax.Array, vocab_size: int) -> jax.Array:
    """[B, G] fraction of completion tokens continuing the count: c_t = c_{t-1} + 1 (mod S), c_{-1} = p_last.

    Prompts are left-padded, so the prompt's last token is prompt[:, -1]."""
    s = vocab_size - 2
    prev = jnp.concatenate(
        [jnp.broadcast_to(prompt[:, None, -1:], completions.shape[:2] + (1,)), completions[..., :-1]], axis=-1
    )
    ok = (completions >= 2) & ((completions - 2) == (prev - 2 + 1) % s)
    return jnp.mean(ok.astype(jnp.float32), axis=-1)


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
    params = tfm.init_params(model, jax.random.PRNGKey(task.seed))
    state = init_state(params, obj, optimizer, seed=task.seed)
    train_step = make_train_step(
        transformer_logits_fn(model), obj, optimizer, temperature=rollout.temperature
    )
    sampler = sampling.make_sampler(
        model, group=rollout.group_size, max_new=rollout.max_new_tokens, eos_id=-1, pad_id=0
    )
    sp = sampling.sampling_params(rollout.temperature, rollout.top_k, rollout.top_p)
    history = []
    t0 = time.perf_counter()
    for i in range(task.steps):
        prompt, pmask = make_prompts(
            state.key("data"), task.prompts_per_step, task.prompt_len, task.vocab_size
        )
        out = sampler(state.params, prompt, pmask, state.key("sample"), sp)
        r = rewards(prompt, out.tokens, task.vocab_size)
        batch = batch_from_samples(prompt, pmask, out, r)
        state, metrics = train_step(state, batch)
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
