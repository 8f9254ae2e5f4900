"""Gradient accumulation and mini-batches in the train step (grpo_jax.train.step, make_train_step's
micro_batches / ObjectiveConfig.mini_batches): k micro-batches of a batch give the same update as the whole
batch, for every aggregation mode, because each micro-batch is normalised by the whole batch's counts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.algorithms.policy_loss import PolicyInputs, policy_loss
from grpo_jax.config import ObjectiveConfig, OptimConfig, PolicyLossConfig
from grpo_jax.policies import sampling
from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.logp import policy_logp_fn
from grpo_jax.train.state import init_state, make_optimizer
from grpo_jax.train.step import make_train_step, split, unsplit
from grpo_jax.types import batch_from_samples

CFG = tfm.TransformerConfig(vocab_size=24, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32)
B, G, P, T = 4, 3, 5, 6
OPT = make_optimizer(OptimConfig(learning_rate=1e-3))


@pytest.fixture(scope="module")
def batch():
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    sampler = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=3, pad_id=0)
    prompt = jax.random.randint(jax.random.PRNGKey(1), (B, P), 4, CFG.vocab_size)
    pmask = (jnp.arange(P)[None] >= (jnp.arange(B) % 2)[:, None]).astype(jnp.int32)
    s = sampler(params, prompt, pmask, jax.random.PRNGKey(2), sampling.sampling_params(1.0))
    assert len(set(np.asarray(s.mask.sum(-1)).ravel().tolist())) > 1  # lengths differ: token counts matter
    r = jax.random.uniform(jax.random.PRNGKey(3), (B, G))
    return batch_from_samples(prompt, pmask, s, r)


def _run(obj, batch, micro, steps=2):
    state = init_state(tfm.init_params(CFG, jax.random.PRNGKey(0)), obj, OPT, seed=0)
    step = make_train_step(CFG, obj, OPT, micro_batches=micro)
    ms = []
    for _ in range(steps):
        state, m, _ = step(state, batch)
        ms.append(jax.device_get(m))
    return jax.device_get(state.params), ms, state


def _maxdiff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


CASES = {
    "grpo seq_mean_token_mean": dict(),
    "dapo token_mean": dict(aggregation="token_mean", eps_high=0.28),
    "dr_grpo constant": dict(aggregation="constant", max_len=T),
    "luspo seq_sum_mean": dict(aggregation="seq_sum_mean"),
    "gspo seq_mean": dict(aggregation="seq_mean", importance_level="sequence", eps_low=3e-4, eps_high=4e-4),
    "token_mean entropy bonus + top-entropy": dict(
        aggregation="token_mean", entropy_bonus="token_mean", top_entropy_quantile=0.5
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_micro_batches_equal_the_whole_batch(batch, name):
    loss = PolicyLossConfig(**{"max_len": T, **CASES[name]})
    obj = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01, loss=loss)
    p1, m1, _ = _run(obj, batch, micro=1)
    p0 = tfm.init_params(CFG, jax.random.PRNGKey(0))
    assert _maxdiff(p1, p0) > 1e-4  # the updates really moved the parameters
    for k in (2, 4) if name == "dapo token_mean" else (2,):
        pk, mk, _ = _run(obj, batch, micro=k)
        assert _maxdiff(p1, pk) <= 1e-6, (name, k, _maxdiff(p1, pk))
        for a, b in zip(m1, mk, strict=True):
            for key in (
                "loss",
                "kl",
                "entropy",
                "grad_norm",
                "ratio/max",
                "clip_ratio/region",
                "coef/kl_next",
            ):
                assert abs(float(a[key]) - float(b[key])) <= 1e-5, (name, k, key, a[key], b[key])


def test_normalising_by_the_micro_batch_instead_would_differ(batch):
    """The guard above can fail: averaging micro-batch losses that each divide by their OWN token count (plain
    gradient accumulation) is not DAPO's token mean of the whole batch when the micro-batches' lengths
    differ."""
    loss = PolicyLossConfig(aggregation="token_mean", max_len=T)
    obj = ObjectiveConfig(loss=loss)
    # the whole batch's gradient vs the mean of the halves' gradients, each half normalised by its own tokens
    halves = split(batch, 2)
    state = init_state(tfm.init_params(CFG, jax.random.PRNGKey(0)), obj, OPT, seed=0)

    logp_fn = policy_logp_fn(CFG)

    def local_loss(params, b):
        lp, _ = logp_fn(params, b.prompt, b.prompt_mask, b.completions, 1.0)
        adv = jnp.asarray(b.rewards) - jnp.asarray(b.rewards).mean(-1, keepdims=True)
        return policy_loss(
            PolicyInputs(lp, jax.lax.stop_gradient(lp), None, adv, b.completion_mask),
            cfg=loss,
            kl_coef=0.0,
            entropy_coef=0.0,
        )[0]

    grad = jax.jit(jax.grad(local_loss))
    g_local = [grad(state.params, jax.tree.map(lambda x, i=i: x[i], halves)) for i in range(2)]
    g_whole = grad(state.params, batch)
    tokens = [float(jax.tree.map(lambda x, i=i: x[i], halves).completion_mask.sum()) for i in range(2)]
    assert tokens[0] != tokens[1]
    g_mean = jax.tree.map(lambda a, b: (a + b) / 2, *g_local)
    assert _maxdiff(g_mean, g_whole) > 1e-5  # per-micro-batch normalisation is NOT the whole batch's


def test_split_is_strided_and_inverted_by_unsplit():
    x = jnp.arange(12).reshape(6, 2)
    parts = split(x, 3)
    np.testing.assert_array_equal(np.asarray(parts[:, :, 0]), [[0, 6], [2, 8], [4, 10]])
    np.testing.assert_array_equal(np.asarray(unsplit(parts)), np.asarray(x))


def test_mini_batches_do_one_update_each_and_accumulate_the_same(batch):
    obj = ObjectiveConfig(kl_coef=0.04, mini_batches=2, num_iterations=2)
    p_a, m_a, s_a = _run(obj, batch, micro=1, steps=1)
    p_b, m_b, _ = _run(obj, batch, micro=2, steps=1)
    assert _maxdiff(p_a, p_b) <= 1e-6
    # AdamW's step count: 2 mini-batches x 2 epochs = 4 updates in one train step
    counts = [
        int(x)
        for x in jax.tree.leaves(s_a.opt_state)
        if np.ndim(x) == 0 and np.issubdtype(np.asarray(x).dtype, np.integer)
    ]
    assert 4 in counts, counts
    p_one, _, _ = _run(dataclasses.replace(obj, mini_batches=1), batch, micro=1, steps=1)
    assert _maxdiff(p_a, p_one) > 1e-5  # two mini-batches per epoch are a different (4-update) step
