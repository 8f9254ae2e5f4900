"""The pool runtime of the code loop in-process (grpo_jax.rollout.pool_runtime): snapshot pushes on the ring
buffer, the pool metrics, the MemberSampler and the pool baseline graded by the real sandbox.

The members are constant policies built by hand, so the baseline has literal values: every layer's output
projections are zero (the residual stream is the token embedding) and the tied embedding is s_v * 1 with
s = 10 for one token and 1 for the others, so every position's logits are 32 * s: that token wins by 288
nats, at temperature 1 too. The EOS member replies "" and the "(" member "((((((((". Of the two prompts, one
is a procedural problem's whole reference program (the empty reply passes, "((((((((" is a syntax error) and
one its plain prompt (a docstring-only function returns None: every reply fails), so b_pool(q) is the
fraction of evaluated members that are the EOS member on the first prompt and 0 on the second."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import pool
from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline, tasks
from grpo_jax.config import PoolConfig, RolloutConfig, SandboxConfig
from grpo_jax.policies import transformer as tfm
from grpo_jax.rollout.grader import Grader
from grpo_jax.rollout.pool_runtime import Members, PoolRuntime
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits
from grpo_jax.tokenization.code import CodeTokenizer

B, g, T, P = 2, 2, 8, 64  # prompts, samples per member, completion tokens, prompt tokens
MODEL = tfm.TransformerConfig(vocab_size=512, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
TOK = CodeTokenizer()
PAREN = TOK.encode("(")[0]
_TRAIN = tasks.make_split("train", levels=(0,), n_per_level=2, seed=0)
SOLVED = dataclasses.replace(_TRAIN[0], prompt=_TRAIN[0].reference)  # the empty reply passes
UNSOLVED = _TRAIN[1]  # a docstring-only function: every reply fails
PROBLEMS = [SOLVED, UNSOLVED]
NUM_TESTS = max(len(p.tests) for p in PROBLEMS)
PCFG = PoolConfig(capacity=2, k_schedule=((0, 1), (5, 2)), push_every=2, samples_per_member=g)
RO = RolloutConfig(prompts_per_step=B, group_size=4, max_new_tokens=T)  # temperature 1
KEY = rng_lib.streams(0)["rollout"]


def step_keys(step: int) -> dict[str, jax.Array]:
    """The pool's named keys of a step, derived as CodegenRollout.step_keys derives them."""
    k = rng_lib.derive(KEY, step)
    return {n: rng_lib.derive(k, n) for n in ("pool_push_noise", "pool_select", "pool_sample")}


def constant_policy(token: int):
    p = tfm.init_params(MODEL, jax.random.PRNGKey(1))
    layers = dict(p["layers"])
    for name in ("o_proj", "down_proj"):
        layers[name] = {"kernel": jnp.zeros_like(layers[name]["kernel"])}
    s = jnp.ones((MODEL.vocab_size,), jnp.float32).at[token].set(10.0)
    return {**p, "layers": layers, "embed": s[:, None] * jnp.ones((1, MODEL.d_model), jnp.float32)}


EOS_POLICY = constant_policy(TOK.eos_id)
PAREN_POLICY = constant_policy(PAREN)
RANDOM_POLICY = tfm.init_params(MODEL, jax.random.PRNGKey(0))
PROMPT, PMASK = (jnp.asarray(a) for a in pipeline.encode_prompts(TOK, PROBLEMS, P))


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as e:
        yield e


@pytest.fixture(scope="module")
def grader(ex):
    return Grader(ex, SandboxConfig(), TOK, pipeline.PLAIN, group=g, num_tests=NUM_TESTS)


@pytest.fixture(scope="module")
def runtime(grader):
    return PoolRuntime(PCFG, RO, MODEL, TOK, grader, uses_baseline=True, lora_alpha=None)


@pytest.fixture(scope="module")
def pools(runtime):
    """{step: the pool after that step's push}: "(" at step 2, EOS at step 4, the random policy at step 6."""
    p0 = runtime.init(EOS_POLICY)
    p2 = runtime.maybe_push(p0, PAREN_POLICY, 2, step_keys(2)["pool_push_noise"])
    p4 = runtime.maybe_push(p2, EOS_POLICY, 4, step_keys(4)["pool_push_noise"])
    p6 = runtime.maybe_push(p4, RANDOM_POLICY, 6, step_keys(6)["pool_push_noise"])
    return {0: p0, 2: p2, 4: p4, 6: p6}


def slot(p, i: int):
    return jax.tree.map(lambda x: np.asarray(x[i]), p.params)


def assert_tree_equal(a, b):
    jax.tree.map(np.testing.assert_array_equal, a, b)


# ----------------------------------------------------------------------------------------------------- push


def test_maybe_push_every_push_every_steps_into_a_ring(runtime, pools):
    p0, p2, p4, p6 = pools[0], pools[2], pools[4], pools[6]
    assert int(p0.pushes) == 0 and not np.asarray(p0.valid).any()
    key = step_keys(0)["pool_push_noise"]
    # no push at step 0, nor between multiples of push_every: the same object back
    assert runtime.maybe_push(p0, EOS_POLICY, 0, key) is p0
    assert runtime.maybe_push(p0, EOS_POLICY, 1, key) is p0
    assert runtime.maybe_push(p2, EOS_POLICY, 3, key) is p2
    assert runtime.maybe_push(p4, EOS_POLICY, 5, key) is p4

    def book(p):
        return (
            int(p.pushes),
            np.asarray(p.valid).tolist(),
            np.asarray(p.push_index).tolist(),
            np.asarray(p.pushed_at).tolist(),
        )

    assert book(p2) == (1, [True, False], [0, -1], [2, -1])
    assert book(p4) == (2, [True, True], [0, 1], [2, 4])
    assert book(p6) == (3, [True, True], [2, 1], [6, 4])  # the third push replaced the oldest (step 2)
    assert_tree_equal(slot(p2, 0), PAREN_POLICY)
    assert_tree_equal(slot(p4, 0), PAREN_POLICY)
    assert_tree_equal(slot(p4, 1), EOS_POLICY)
    assert_tree_equal(slot(p6, 0), RANDOM_POLICY)
    assert_tree_equal(slot(p6, 1), EOS_POLICY)
    assert not np.asarray(p6.explore).any()
    # not donated: the earlier pools are intact (an async rollout may still read them)
    assert book(p2) == (1, [True, False], [0, -1], [2, -1])
    assert_tree_equal(slot(p4, 0), PAREN_POLICY)


@pytest.mark.parametrize("mode", ["temperature", "param_noise"])
def test_exploration_pushes(grader, mode):
    """explore_fraction 0.5: the second push is an exploration member; in temperature mode it samples at the
    explore temperature, in param_noise mode it is stored with noise (and samples at the base temperature).
    A slot may hold any tree (here a small one, quick to compile)."""
    pc = dataclasses.replace(
        PCFG, k_schedule=((0, 1), (8, 2)), explore_fraction=0.5, explore_mode=mode, explore_temperature=1.5
    )
    rt = PoolRuntime(pc, RO, MODEL, TOK, grader, uses_baseline=True, lora_alpha=None)
    snap = {"w": jnp.arange(1.0, 9.0).reshape(2, 4), "b": jnp.ones((3,))}
    p = rt.init(snap)
    for step in (2, 4):
        p = rt.maybe_push(p, snap, step, step_keys(step)["pool_push_noise"])
    assert np.asarray(p.explore).tolist() == [False, True]
    m = rt.metrics(p, 8, with_diversity=True)
    assert m["pool/explore_members"] == 1.0 and m["pool/active_k"] == 2.0
    # a third (plain) push at step 6 with K = 1: the exploration member is in the pool but not active
    p3 = rt.maybe_push(p, snap, 6, step_keys(6)["pool_push_noise"])
    assert np.asarray(p3.explore).tolist() == [False, True]
    assert rt.metrics(p3, 6, with_diversity=False)["pool/explore_members"] == 0.0
    temps = np.asarray(rt._temps(p, jnp.asarray([0, 1], jnp.int32))).tolist()
    assert_tree_equal(slot(p, 0), snap)
    if mode == "temperature":
        assert temps == [1.0, 1.5]
        assert_tree_equal(slot(p, 1), snap)
        assert m["pool/diversity"] == 0.0
    else:
        assert temps == [1.0, 1.0]
        assert not np.allclose(slot(p, 1)["w"], np.asarray(snap["w"]))
        # the relative noise of size explore_noise, drawn with the push's key
        want = pool.param_noise(snap, step_keys(4)["pool_push_noise"], pc.explore_noise)
        jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, rtol=1e-6), slot(p, 1), want)
        assert m["pool/diversity"] > 0.0


# -------------------------------------------------------------------------------------------------- metrics


def test_metrics(runtime, pools):
    base = {"pool/explore_members": 0.0}
    assert runtime.metrics(pools[0], 0, with_diversity=False) == {
        **base,
        "pool/size": 0.0,
        "pool/active_k": 0.0,
        "pool/k_schedule": 1.0,
        "pool/mean_age": 0.0,
    }
    assert runtime.metrics(pools[2], 3, with_diversity=True) == {
        **base,
        "pool/size": 1.0,
        "pool/active_k": 1.0,
        "pool/k_schedule": 1.0,
        "pool/mean_age": 1.0,  # pushed at step 2
        "pool/diversity": 0.0,  # a single member
    }
    # K = 1 until step 5: of the two snapshots only the newest (step 4) is active
    assert runtime.metrics(pools[4], 4, with_diversity=True) == {
        **base,
        "pool/size": 2.0,
        "pool/active_k": 1.0,
        "pool/k_schedule": 1.0,
        "pool/mean_age": 0.0,
        "pool/diversity": 0.0,
    }
    assert runtime.metrics(pools[4], 5, with_diversity=False) == {
        **base,
        "pool/size": 2.0,
        "pool/active_k": 2.0,
        "pool/k_schedule": 2.0,
        "pool/mean_age": 2.0,  # ages 5 - 2 and 5 - 4
    }
    m = runtime.metrics(pools[6], 7, with_diversity=True)
    div = m.pop("pool/diversity")
    assert m == {
        **base,
        "pool/size": 2.0,
        "pool/active_k": 2.0,
        "pool/k_schedule": 2.0,
        "pool/mean_age": 2.0,  # ages 7 - 6 and 7 - 4
    }
    # two members: D = ||θ1 - θ2||² / mean(||θ1||², ||θ2||²)
    flat = [np.concatenate([np.ravel(x) for x in jax.tree.leaves(t)]) for t in (RANDOM_POLICY, EOS_POLICY)]
    want = np.sum((flat[0] - flat[1]) ** 2) / np.mean([np.sum(f**2) for f in flat])
    np.testing.assert_allclose(div, want, rtol=1e-4)


# --------------------------------------------------------------------------------------------- the sampler


def test_member_sampler_shapes_and_greedy_members(runtime, pools):
    p4 = pools[4]  # slot 0: the "(" policy, slot 1: the EOS policy
    stacked = jax.tree.map(lambda a, r: a.at[1].set(r), p4.params, RANDOM_POLICY)  # slot 1: random
    idx = jnp.asarray([0, 1], jnp.int32)

    def gen(temperature, key, stacked=stacked):
        members = Members(stacked, idx, None, jnp.full((2,), temperature, jnp.float32))
        return runtime.sampler.generate(members, PROMPT, PMASK, key)

    k1, k2 = step_keys(6)["pool_sample"], step_keys(7)["pool_sample"]
    greedy = gen(0.0, k1)
    assert greedy.tokens.shape == (2, B, g, T)
    assert greedy.logp.shape == greedy.mask.shape == (2, B, g, T)
    assert greedy.lengths.shape == greedy.truncated.shape == (2, B, g)
    np.testing.assert_array_equal(np.asarray(gen(0.0, k2).tokens), np.asarray(greedy.tokens))
    tokens = np.asarray(greedy.tokens)
    np.testing.assert_array_equal(tokens[:, :, 0], tokens[:, :, 1])  # greedy: the g samples agree
    np.testing.assert_array_equal(tokens[0], PAREN)
    np.testing.assert_array_equal(np.asarray(greedy.mask[0]), 1)
    # at temperature 1 the random member's samples depend on the key; the constant member's do not
    s1, s2 = np.asarray(gen(1.0, k1).tokens), np.asarray(gen(1.0, k2).tokens)
    assert (s1[1] != s2[1]).any() and (s1[1, :, 0] != s1[1, :, 1]).any()
    np.testing.assert_array_equal(s1[0], PAREN)
    np.testing.assert_array_equal(s2[0], PAREN)
    # one key per member: two copies of the random policy draw different samples
    twins = jax.tree.map(lambda a, r: a.at[0].set(r), stacked, RANDOM_POLICY)
    t = np.asarray(gen(1.0, k1, twins).tokens)
    assert (t[0] != t[1]).any()
    np.testing.assert_array_equal(t[1], s1[1])  # member 1's key is the same split of k1


# -------------------------------------------------------------------------------------------- the baseline


def test_baseline_of_an_empty_pool(runtime, pools):
    assert runtime.baseline(pools[0], None, step_keys(0), PROBLEMS, PROMPT, PMASK, 0) == (None, None, {})


def test_baseline_of_the_active_member_only(runtime, pools):
    """Step 4: K = 1, the EOS member alone; the "(" member is selected too but inactive, not evaluated."""
    b, valid, m = runtime.baseline(pools[4], None, step_keys(4), PROBLEMS, PROMPT, PMASK, 4)
    np.testing.assert_array_equal(b, [1.0, 0.0])
    np.testing.assert_array_equal(valid, [1.0, 1.0])
    assert b.shape == valid.shape == (B,) and valid.dtype == np.float32
    assert m["pool/members_evaluated"] == 1.0 and m["pool/explore_evaluated"] == 0.0
    assert m["pool/member_reward"] == 0.5 and m["pool/member_reward_spread"] == 0.0


def test_baseline_is_the_graded_mean_of_the_member_samples(runtime, grader, pools):
    """Step 5: K = 2, both members; recomputed from the sampler's completions graded by the same grader."""
    p4, keys = pools[4], step_keys(5)
    b, valid, m = runtime.baseline(p4, None, keys, PROBLEMS, PROMPT, PMASK, 5)
    np.testing.assert_array_equal(b, [0.5, 0.0])
    np.testing.assert_array_equal(valid, [1.0, 1.0])
    assert m["pool/members_evaluated"] == 2.0 and m["pool/explore_evaluated"] == 0.0
    assert m["pool/member_reward"] == 0.25 and m["pool/member_reward_spread"] == 0.25
    assert m["time/pool_sample_s"] >= 0.0 and m["time/pool_reward_s"] >= 0.0

    # independently: the same selection, the same keys, the sampler and the grader
    idx, mmask = pool.select_members(p4, jnp.int32(2), keys["pool_select"], 2)
    assert np.asarray(mmask).tolist() == [True, True]
    members = Members(p4.params, idx, None, jnp.full((2,), RO.temperature, jnp.float32))
    out = runtime.sampler.generate(members, PROMPT, PMASK, keys["pool_sample"])
    grades = grader.grade(PROBLEMS * 2, np.asarray(out.tokens), np.asarray(out.mask))
    rewards = grades.rewards.reshape(2, B, g)
    np.testing.assert_array_equal(b, rewards.mean(axis=(0, 2)))
    # what the members wrote: the EOS member (pushed at step 4) nothing, the other (step 2) "(" x T
    by_step = {int(s): i for i, s in enumerate(np.asarray(p4.pushed_at)[np.asarray(idx)])}
    texts = np.asarray(grades.texts).reshape(2, B, g)
    assert set(texts[by_step[4]].ravel()) == {""}
    assert set(texts[by_step[2]].ravel()) == {"(" * T}
    np.testing.assert_array_equal(rewards[by_step[4]], [[1.0, 1.0], [0.0, 0.0]])
    np.testing.assert_array_equal(rewards[by_step[2]], 0.0)

    # deterministic: the same keys give the same baseline
    b2, valid2, _ = runtime.baseline(p4, None, keys, PROBLEMS, PROMPT, PMASK, 5)
    np.testing.assert_array_equal(b2, b)
    np.testing.assert_array_equal(valid2, valid)
