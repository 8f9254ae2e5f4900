"""The padding-free update (grpo_jax.policies.packed, --pack_tokens): the packing plan on literal batches,
the packed forward's log-probs / entropies / values and their gradients against the padded forward, segment
isolation (nothing of one completion or block reaches another), and the whole train step packed against
padded (loss, gradient, every metric)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from grpo_jax.config import ObjectiveConfig
from grpo_jax.policies import packed
from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.logp import policy_logp_fn
from grpo_jax.train.state import init_state
from grpo_jax.train.step import make_train_step
from grpo_jax.types import SampleOutput, batch_from_samples

CFG = tfm.TransformerConfig(vocab_size=40, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64)


def test_row_bucket_literal():
    assert [packed.row_bucket(r) for r in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert packed.row_bucket(0) == 1
    assert packed.row_bucket(5, 2) == 6 and packed.row_bucket(7, 4) == 8 and packed.row_bucket(9, 4) == 12
    fine = [packed.row_bucket(r, per_doubling=8) for r in (1, 15, 16, 17, 21, 33, 70)]
    assert fine == [1, 15, 16, 18, 22, 36, 72]
    assert packed.row_bucket(21, 4, per_doubling=8) == 24 and packed.row_bucket(5, per_doubling=1) == 8
    with pytest.raises(ValueError, match="per_doubling=0 must be >= 1"):
        packed.row_bucket(3, per_doubling=0)


def test_completion_lengths_reach_the_last_loss_token():
    m = np.asarray([[1, 1, 0, 0, 0], [1, 0, 0, 1, 0], [0, 0, 0, 0, 0]], np.float32)
    np.testing.assert_array_equal(packed.completion_lengths(m), [2, 4, 0])


def test_plan_literal():
    """Two prompts (lengths 2 and 3) x G = 3 completions (lengths 3, 1, 4 and 2, 4, 0) in rows of 5: each
    group's completions longest first into the first of its rows with room; a row holds one group."""
    pmask = np.asarray([[0, 1, 1], [1, 1, 1]], np.int32)
    comps = np.asarray(
        [[[11, 12, 13, 0], [14, 0, 0, 0], [15, 16, 17, 18]], [[21, 22, 0, 0], [23, 24, 25, 26], [0] * 4]],
        np.int32,
    )
    cmask = (comps > 0).astype(np.float32)
    lay, st = packed.plan(pmask, comps, cmask, 5)
    # group 0: (0, 2) len 4 | (0, 0) len 3 | (0, 1) len 1 -> rows [15 16 17 18 14] [11 12 13 . .]
    # group 1: (1, 1) len 4 | (1, 0) len 2 -> rows [23 24 25 26 .] [21 22 . . .]
    assert st == packed.PlanStats(rows=4, needed=4, tokens=5 + 14, capacity=6 + 20)  # prompts + rows
    np.testing.assert_array_equal(
        lay.tokens[0],
        [[15, 16, 17, 18, 14], [11, 12, 13, 0, 0], [23, 24, 25, 26, 0], [21, 22, 0, 0, 0]],
    )
    np.testing.assert_array_equal(lay.group[0], [0, 0, 1, 1])
    np.testing.assert_array_equal(
        lay.positions[0], [[2, 3, 4, 5, 2], [2, 3, 4, 0, 0], [3, 4, 5, 6, 0], [3, 4, 0, 0, 0]]
    )
    np.testing.assert_array_equal(
        lay.segment[0], [[1, 1, 1, 1, 2], [1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 0, 0, 0]]
    )
    # the predicting state: the group's last prompt position (index b) for t = 0, else B + the previous
    # packed position
    np.testing.assert_array_equal(lay.pred[0][[0, 1, 2, 3, 4]], [0, 2, 3, 4, 0])
    np.testing.assert_array_equal(lay.pred[0][[10, 11, 12, 13, 15, 16]], [1, 12, 13, 14, 1, 17])
    np.testing.assert_array_equal(lay.unpack[0, 0], [[5, 6, 7, 0], [4, 0, 0, 0], [0, 1, 2, 3]])
    np.testing.assert_array_equal(lay.unpack[0, 1], [[15, 16, 0, 0], [10, 11, 12, 13], [0, 0, 0, 0]])


def test_plan_splits_micro_batches_strided():
    """parts=2: micro-batch i holds the groups b with b mod 2 = i, with local group indices; both get the
    same (bucketed) row count."""
    pmask = np.ones((4, 2), np.int32)
    lens = np.asarray([[3, 1], [2, 2], [4, 4], [1, 0]])
    cmask = (np.arange(4) < lens[..., None]).astype(np.float32)
    comps = (cmask * 7).astype(np.int32)
    lay, st = packed.plan(pmask, comps, cmask, 4, parts=2)
    # part 0: groups 0, 2 -> rows [3+1], [4], [4]; part 1: groups 1, 3 -> rows [2+2], [1]
    assert st == packed.PlanStats(rows=3, needed=3, tokens=8 + 17, capacity=8 + 24)
    np.testing.assert_array_equal(lay.group, [[0, 1, 1], [0, 1, 0]])
    np.testing.assert_array_equal(lay.segment[1], [[1, 1, 2, 2], [1, 0, 0, 0], [0, 0, 0, 0]])


def test_plan_refuses_a_completion_longer_than_a_row():
    pmask = np.ones((1, 4), np.int32)
    comps, cmask = np.ones((1, 2, 9), np.int32), np.ones((1, 2, 9), np.float32)
    with pytest.raises(ValueError, match="a completion of 9 tokens does not fit rows of 8"):
        packed.plan(pmask, comps, cmask, 8)


def _batch(seed=0, b=4, g=3, p=6, t=7):
    """Left-padded prompts of different lengths, completions of lengths 0..T, one with a hole in its loss mask
    (a feedback turn inside a trajectory)."""
    rng = np.random.default_rng(seed)
    prompt = rng.integers(4, CFG.vocab_size, (b, p)).astype(np.int32)
    pmask = np.ones((b, p), np.int32)
    pmask[0, :2] = 0
    pmask[2, :4] = 0
    prompt[pmask == 0] = 0
    lens = rng.integers(1, t + 1, (b, g))
    lens[1, 2] = 0
    lens[3, 1] = t
    cmask = (np.arange(t) < lens[..., None]).astype(np.float32)
    comps = np.where(cmask > 0, rng.integers(4, CFG.vocab_size, (b, g, t)), 0).astype(np.int32)
    cmask[3, 1, 2] = 0
    return prompt, pmask, comps, cmask


def _packed_fn(cfg, prompt, pmask, layout, parts, shape):
    """The packed policy function over `parts` micro-batch layouts, unsplit into [B, G, T] (the step's split
    is strided: micro-batch i holds the groups b with b mod parts = i)."""
    fn = packed.packed_policy_fn(cfg)

    def one(params, i):
        lay = jax.tree.map(lambda x: jnp.asarray(x[i]), layout)
        return fn(params, jnp.asarray(prompt[i::parts]), jnp.asarray(pmask[i::parts]), lay, 1.0)

    def run(params):
        outs = [one(params, i) for i in range(parts)]
        return tuple(jnp.stack([o[k] for o in outs], 1).reshape(shape) for k in range(len(outs[0])))

    return run


@pytest.mark.parametrize("chunk, parts, value_head", [(0, 1, False), (5, 2, False), (0, 2, True)])
def test_packed_forward_equals_the_padded_forward_values_and_gradients(chunk, parts, value_head):
    cfg = dataclasses.replace(CFG, logp_chunk=chunk, value_head=value_head)
    params = tfm.init_params(cfg, jax.random.key(0))
    prompt, pmask, comps, cmask = _batch()
    layout, st = packed.plan(pmask, comps, cmask, 14, parts=parts)
    assert st.tokens < prompt.size + comps.size  # packing removed padding
    ours = _packed_fn(cfg, prompt, pmask, layout, parts, comps.shape)
    ref = policy_logp_fn(cfg)

    def theirs(p):
        return ref(p, jnp.asarray(prompt), jnp.asarray(pmask), jnp.asarray(comps), 1.0)

    for a, b in zip(ours(params), theirs(params), strict=True):
        np.testing.assert_allclose(np.asarray(a) * cmask, np.asarray(b) * cmask, atol=2e-6)
    w = jnp.asarray(np.random.default_rng(1).normal(size=comps.shape).astype(np.float32) * cmask)

    def loss(fn):
        return lambda p: sum(jnp.sum(x * w) * c for x, c in zip(fn(p), (1.0, 0.3, 0.7), strict=False))

    ga, gb = jax.grad(loss(ours))(params), jax.grad(loss(theirs))(params)
    for x, y in zip(jax.tree.leaves(ga), jax.tree.leaves(gb), strict=True):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), atol=5e-6, rtol=1e-5)


def test_completions_and_groups_are_isolated():
    """Changing another completion's tokens in the same packed row, or another group's prompt, changes none
    of a completion's log-probs; changing its own prompt does. (A mask that lets attention cross a
    completion, or a row that reads another group's prompt, fails this test.)"""
    params = tfm.init_params(CFG, jax.random.key(0))
    prompt = np.asarray([[0, 5, 6], [7, 8, 9]], np.int32)
    pmask = (prompt > 0).astype(np.int32)
    comps = np.asarray([[[11, 12, 13], [14, 15, 0]], [[21, 22, 0], [23, 24, 25]]], np.int32)
    cmask = (comps > 0).astype(np.float32)
    fn = jax.jit(packed.packed_policy_fn(CFG))

    def logp(prompt, comps):
        layout, st = packed.plan(pmask, comps, cmask, 16)
        assert st.rows == 2  # each group's completions share one row: any leak would be inside it
        lay = jax.tree.map(lambda x: jnp.asarray(x[0]), layout)
        return np.asarray(fn(params, jnp.asarray(prompt), jnp.asarray(pmask), lay, 1.0)[0])

    base = logp(prompt, comps)
    other = comps.copy()
    other[0, 1, :2] = [30, 31]  # completion (0, 1) shares its row with (0, 0)
    other[1, 0, :2] = [32, 33]
    got = logp(prompt, other)
    np.testing.assert_array_equal(got[0, 0], base[0, 0])
    np.testing.assert_array_equal(got[1, 1], base[1, 1])
    p2 = prompt.copy()
    p2[1] = [7, 36, 37]  # group 1's prompt: group 0 is unchanged, group 1 is not
    got = logp(p2, comps)
    np.testing.assert_array_equal(got[0], base[0])
    assert np.abs(got[1] - base[1]).max() > 1e-3


@pytest.mark.parametrize("micro", [1, 2])
def test_packed_train_step_equals_the_padded_one(micro):
    """GRPO with a KL term to a reference and an entropy bonus: the packed step's loss, gradient and every
    logged metric equal the padded step's (float32). The optimizer is SGD with rate 1, so the parameters'
    change is the gradient itself."""
    obj = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01)
    opt = optax.apply_if_finite(optax.sgd(1.0), max_consecutive_errors=3)
    params = tfm.init_params(CFG, jax.random.key(0))
    prompt, pmask, comps, cmask = _batch(b=4)
    rng = np.random.default_rng(2)
    out = SampleOutput(
        jnp.asarray(comps),
        jnp.asarray(rng.normal(size=comps.shape).astype(np.float32) * 0.1 - 3.0) * cmask,
        jnp.asarray(cmask),
        jnp.asarray(cmask.sum(-1).astype(np.int32)),
        jnp.asarray(cmask[..., -1] > 0),
    )
    rewards = rng.integers(0, 2, (4, 3)).astype(np.float32)
    batch = batch_from_samples(prompt, pmask, out, rewards)
    results = []
    for pack in (0, 16):
        step = make_train_step(CFG, obj, opt, micro_batches=micro, pack_tokens=pack)
        state = init_state(jax.tree.map(jnp.copy, params), obj, opt, seed=0)
        state, metrics, _ = step(state, batch)
        results.append((state.params, {k: float(v) for k, v in metrics.items()}))
    (p0, m0), (p1, m1) = results
    for x, y, z in zip(jax.tree.leaves(p0), jax.tree.leaves(p1), jax.tree.leaves(params), strict=True):
        grad0, grad1 = np.asarray(z) - np.asarray(x), np.asarray(z) - np.asarray(y)
        assert np.abs(grad0).max() > 0
        np.testing.assert_allclose(grad1, grad0, atol=1e-6)
    assert set(m1) - set(m0) == {"pack/rows", "pack/rows_needed", "pack/padding_fraction"}
    for k, v in m0.items():
        assert m1[k] == pytest.approx(v, rel=1e-5, abs=1e-6), k
    assert 0 < m1["pack/padding_fraction"] < 1
