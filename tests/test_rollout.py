"""RolloutWorker with the real sandbox: replayed successes enter the batch with their stored behaviour
log-probs, are excluded from the pass-rate statistics, and dynamic sampling keeps only groups with a signal
(refilling with fresh draws, masking what it cannot fill). The default options reproduce the first
version's problem draw."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import replay
from grpo_jax.codegen import pipeline, tasks
from grpo_jax.codegen.tokenizer import CodeTokenizer
from grpo_jax.config import ObjectiveConfig, RolloutConfig
from grpo_jax.core.losses import GRPOLossConfig
from grpo_jax.policies import transformer as tfm
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits
from grpo_jax.train.loop import CodegenConfig
from grpo_jax.train.rollout import RolloutView, RolloutWorker
from grpo_jax.train.state import rng_streams

B, G, T = 4, 4, 24
MODEL = tfm.TransformerConfig(vocab_size=512, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)


def _cfg(**kw):
    base = dict(
        workdir="/nonexistent",
        model=MODEL,
        objective=ObjectiveConfig(kl_coef=0.0, loss=GRPOLossConfig(tis_cap=2.0)),
        rollout=RolloutConfig(group_size=G, max_new_tokens=T),
        rl_levels=(0,),
        train_per_level=40,
        prompt_len=64,
        prompts_per_step=B,
        replay_fraction=0.5,
        replay_capacity=8,
    )
    base.update(kw)
    return CodegenConfig(**base)


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as e:
        yield e


def _worker_with_two_stored_successes(cfg, ex):
    tok = CodeTokenizer()
    problems = tasks.make_split("train", levels=(0,), n_per_level=40, seed=0)
    w = RolloutWorker(cfg, tok, ex, problems)
    rp = w.init_replay()
    items = {"problem": [], "tokens": [], "mask": [], "logp": [], "truncated": []}
    for q in (3, 7):  # the reference solutions of problems 3 and 7, stored as if sampled with logp -0.5
        ids = tok.encode(pipeline.reference_body(problems[q])) + [tok.eos_id]
        assert len(ids) <= T
        items["problem"].append(q)
        items["tokens"].append(ids + [tok.pad_id] * (T - len(ids)))
        items["mask"].append([1.0] * len(ids) + [0.0] * (T - len(ids)))
        items["logp"].append([-0.5] * len(ids) + [0.0] * (T - len(ids)))
        items["truncated"].append(False)
    items = {k: jnp.asarray(np.asarray(v)) for k, v in items.items()}
    rp = replay.add(rp, items, jnp.ones(2), jnp.ones(2, bool))
    view = RolloutView(
        params=tfm.init_params(MODEL, jax.random.PRNGKey(0)),
        rng=rng_streams(0),
        curriculum=w.init_curriculum(),
        replay=rp,
    )
    return w, view, problems, items


def test_replayed_successes_enter_the_batch_off_policy(ex):
    cfg = _cfg()
    w, view, problems, items = _worker_with_two_stored_successes(cfg, ex)
    r = w.produce(view, 0)
    b = r.batch
    # the last B * 0.5 = 2 groups are replayed problems; their G-th member is the stored reference: it passes
    np.testing.assert_array_equal(b.rewards[2:, G - 1], [1.0, 1.0])
    n = items["mask"].sum(1).astype(int)
    for row in (2, 3):
        lp = np.asarray(b.logp_sampler[row, G - 1])
        k = int(np.asarray(b.completion_mask[row, G - 1]).sum())
        assert k in n.tolist()
        np.testing.assert_allclose(lp[:k], -0.5)
    assert r.metrics["replay/replayed_groups"] == 2.0 and r.metrics["replay/replayed_reward"] == 1.0
    # the replayed members are not fresh evidence: B*G - 2 graded samples enter the pass table / curriculum
    assert len(r.passes) == B * G - 2
    assert int(np.asarray(r.curriculum.attempts).sum()) == B * G - 2
    # a random policy never solves a problem; the buffer holds only the two stored items, and the
    # priorities of the replayed items were refreshed with s(q) (never attempted fresh -> s = 0 -> 1.01)
    assert int(r.replay.size) == 2
    np.testing.assert_allclose(replay.total(r.replay), 2 * 1.01, rtol=1e-6)


def test_dynamic_sampling_keeps_groups_with_a_signal(ex):
    cfg = _cfg(dynamic_sampling=True, dynamic_max_rounds=2)
    w, view, _, _ = _worker_with_two_stored_successes(cfg, ex)
    r = w.produce(view, 0)
    # only the two replayed groups (one pass among failures) have non-zero reward variance; the random
    # policy's fresh groups are all 0, two extra rounds find nothing, and the two missing groups are masked
    assert r.metrics["dynamic/frac_zero_std_first_round"] == 0.5
    assert r.metrics["dynamic/rounds"] == 2.0 and r.metrics["dynamic/kept_groups"] == 2.0
    np.testing.assert_array_equal(np.asarray(r.batch.group_mask)[:, 0], [1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(r.batch.rewards)[:2, G - 1], [1.0, 1.0])
    # every graded fresh sample of every round is evidence: 3 rounds x 16 - 2 replayed members
    assert len(r.passes) == 3 * B * G - 2


def test_default_rollout_draws_the_first_versions_problems(ex):
    cfg = dataclasses.replace(_cfg(), replay_fraction=0.0)
    tok = CodeTokenizer()
    problems = tasks.make_split("train", levels=(0,), n_per_level=40, seed=0)
    w = RolloutWorker(cfg, tok, ex, problems)
    view = RolloutView(
        params=tfm.init_params(MODEL, jax.random.PRNGKey(0)),
        rng=rng_streams(0),
        curriculum=w.init_curriculum(),
        replay=None,
    )
    r = w.produce(view, 5)
    key = jax.random.fold_in(rng_streams(0)["data"], 5)
    idx = np.asarray(jax.random.choice(key, len(problems), (B,), replace=False))
    want, _ = pipeline.encode_prompts(tok, [problems[i] for i in idx], cfg.prompt_len)
    np.testing.assert_array_equal(np.asarray(r.batch.prompt), want)
    assert np.asarray(r.batch.group_mask).min() == 1.0 and "replay/size" not in r.metrics
