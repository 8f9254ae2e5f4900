"""The rollout with the real sandbox: replayed successes enter the batch with their stored behaviour log-probs
and are excluded from the pass-rate statistics; dynamic sampling keeps only groups with a signal; the async
wrapper returns exactly the batches of the synchronous rollout, one step ahead; every key of a step is
distinct."""

import dataclasses
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import replay
from grpo_jax import rng as rng_lib
from grpo_jax.codegen import pipeline, tasks
from grpo_jax.config import (
    ObjectiveConfig,
    PolicyLossConfig,
    PoolConfig,
    ReplayConfig,
    RewardConfig,
    RolloutConfig,
    RunConfig,
    TaskConfig,
)
from grpo_jax.policies import transformer as tfm
from grpo_jax.rollout.codegen import AsyncRollout, make_rollout
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits
from grpo_jax.tokenization.code import CodeTokenizer

B, G, T = 4, 4, 24
MODEL = tfm.TransformerConfig(vocab_size=512, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64)
TOK = CodeTokenizer()
PROBLEMS = tasks.make_split("train", levels=(0,), n_per_level=40, seed=0)
PARAMS = tfm.init_params(MODEL, jax.random.PRNGKey(0))
KEY = rng_lib.streams(0)["rollout"]


def _cfg(replay_fraction=0.5, **rollout):
    return RunConfig(
        workdir="/nonexistent",
        objective=ObjectiveConfig(kl_coef=0.0, loss=PolicyLossConfig(tis_cap=2.0)),
        rollout=RolloutConfig(prompts_per_step=B, group_size=G, max_new_tokens=T, **rollout),
        tasks=TaskConfig(rl_levels=(0,), train_per_level=40, prompt_len=64),
        replay=ReplayConfig(fraction=replay_fraction, capacity=8) if replay_fraction else ReplayConfig(),
    )


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as e:
        yield e


def _with_two_stored_successes(cfg, ex):
    w = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL)
    state = w.init_state(PARAMS)
    items = {"problem": [], "tokens": [], "mask": [], "logp": [], "truncated": []}
    for q in (3, 7):  # the reference solutions of problems 3 and 7, stored as if sampled with logp -0.5
        ids = TOK.encode(pipeline.reference_body(PROBLEMS[q])) + [TOK.eos_id]
        assert len(ids) <= T
        items["problem"].append(q)
        items["tokens"].append(ids + [TOK.pad_id] * (T - len(ids)))
        items["mask"].append([1.0] * len(ids) + [0.0] * (T - len(ids)))
        items["logp"].append([-0.5] * len(ids) + [0.0] * (T - len(ids)))
        items["truncated"].append(False)
    items = {k: jnp.asarray(np.asarray(v)) for k, v in items.items()}
    state = state.replace(replay=replay.add(state.replay, items, jnp.ones(2), jnp.ones(2, bool)))
    return w, state, items


def test_replayed_successes_enter_the_batch_off_policy(ex):
    w, state, items = _with_two_stored_successes(_cfg(), ex)
    new, b, info = w.produce(state, PARAMS, KEY, 0)
    # the last B * 0.5 = 2 groups are replayed problems; their G-th member is the stored reference: it passes
    np.testing.assert_array_equal(b.rewards[2:, G - 1], [1.0, 1.0])
    n = items["mask"].sum(1).astype(int)
    for row in (2, 3):
        lp = np.asarray(b.logp_sampler[row, G - 1])
        k = int(np.asarray(b.completion_mask[row, G - 1]).sum())
        assert k in n.tolist()
        np.testing.assert_allclose(lp[:k], -0.5)
    assert info.metrics["replay/replayed_groups"] == 2.0 and info.metrics["replay/replayed_reward"] == 1.0
    # the replayed members are not fresh evidence: B*G - 2 graded samples enter the counts / curriculum
    assert int(np.asarray(new.stats.attempts).sum()) == B * G - 2
    assert int(np.asarray(new.curriculum.attempts).sum()) == B * G - 2
    # a random policy never solves a problem; the buffer holds only the two stored items, and the
    # priorities of the replayed items were refreshed with s(q) (never attempted fresh -> s = 0 -> 1.01)
    assert int(new.replay.size) == 2 and int(np.asarray(new.stats.passes).sum()) == 0
    np.testing.assert_allclose(replay.total(new.replay), 2 * 1.01, rtol=1e-6)
    assert isinstance(b.completions, jax.Array)  # the samples stayed on the device


def test_dynamic_sampling_keeps_groups_with_a_signal(ex):
    w, state, _ = _with_two_stored_successes(_cfg(dynamic_sampling=True, dynamic_max_rounds=2), ex)
    new, b, info = w.produce(state, PARAMS, KEY, 0)
    # only the two replayed groups (one pass among failures) have non-zero reward variance; the random
    # policy's fresh groups are all 0, two extra rounds find nothing, and the two missing groups are masked
    assert info.metrics["dynamic/frac_zero_std_first_round"] == 0.5
    assert info.metrics["dynamic/rounds"] == 2.0 and info.metrics["dynamic/kept_groups"] == 2.0
    np.testing.assert_array_equal(np.asarray(b.group_mask)[:, 0], [1, 1, 0, 0])
    np.testing.assert_array_equal(np.asarray(b.rewards)[:2, G - 1], [1.0, 1.0])
    # every graded fresh sample of every round is evidence: 3 rounds x 16 - 2 replayed members
    assert int(np.asarray(new.stats.attempts).sum()) == 3 * B * G - 2


def test_uniform_draw_is_the_named_problems_key(ex):
    w = make_rollout(_cfg(replay_fraction=0.0), TOK, ex, PROBLEMS, MODEL)
    _, b, info = w.produce(w.init_state(PARAMS), PARAMS, KEY, 5)
    key = rng_lib.derive(rng_lib.derive(KEY, 5), "problems")
    idx = np.asarray(jax.random.choice(key, len(PROBLEMS), (B,), replace=False))
    want, _ = pipeline.encode_prompts(TOK, [PROBLEMS[i] for i in idx], 64)
    np.testing.assert_array_equal(np.asarray(b.prompt), want)
    assert np.asarray(b.group_mask).min() == 1.0 and "replay/size" not in info.metrics


def test_async_rollout_returns_the_sync_batches_one_step_ahead(ex):
    cfg = _cfg(replay_fraction=0.0)
    sync = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL)
    s0 = sync.init_state(PARAMS)
    s1, b0, _ = sync.produce(s0, PARAMS, KEY, 0)
    s2, b1, i1 = sync.produce(s1, PARAMS, KEY, 1)
    a = AsyncRollout(make_rollout(cfg, TOK, ex, PROBLEMS, MODEL), (B, G, 64, T))
    try:
        st = a.init_state(PARAMS)
        st, a0, _ = a.produce(st, PARAMS, KEY, 0)  # nothing pending: produced now
        st = a.settle(st)  # waits for step 1, graded while "step 0 trained"
        assert a.host_state()["pending_step"] == 1
        st, a1, ai1 = a.produce(st, PARAMS, KEY, 1)
        after1 = st  # the rollout state once step 1's batch exists: the sync s2
        st = a.settle(st)
    finally:
        a.close()
    for want, got in ((b0, a0), (b1, a1)):
        jax.tree.map(np.testing.assert_array_equal, jax.device_get(want), jax.device_get(got))
    assert ai1.samples == i1.samples
    for f in ("attempts", "pass_rate"):
        np.testing.assert_array_equal(getattr(after1.curriculum, f), getattr(s2.curriculum, f))
    np.testing.assert_array_equal(after1.stats.attempts, s2.stats.attempts)
    assert st.pending is not None and a.host_state()["pending_step"] == 2


def test_keys_of_one_step_are_pairwise_distinct(ex):
    """Every key a step, the warm start and the evaluation hand to a consumer, and the per-token / per-member
    keys the consumers derive from them, are distinct (the old pool-selection key equalled the key of token 0
    of the first refill round)."""
    cfg = _cfg(dynamic_sampling=True, dynamic_max_rounds=3)
    pool_baseline = dataclasses.replace(cfg.objective, baseline="pool")
    cfg = dataclasses.replace(cfg, objective=pool_baseline, pool=PoolConfig(capacity=4, eval_members=4))
    w = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL)
    named = w.step_keys(KEY, 7)
    streams = rng_lib.streams(0)
    used = dict(named)
    for name, k in named.items():  # what the consumers fold in below the key they get
        if name.startswith("sample/"):
            used.update({f"{name}/token{t}": jax.random.fold_in(k, t) for t in range(T)})
        if name == "pool_sample":
            for m, mk in enumerate(jax.random.split(k, cfg.pool.members_per_step)):
                used.update({f"{name}/member{m}/token{t}": jax.random.fold_in(mk, t) for t in range(T)})
    used.update({"init/model": rng_lib.derive(streams["init"], "model")})
    used.update({"init/lora": rng_lib.derive(streams["init"], "lora")})
    used.update({f"sft/shuffle/{e}": rng_lib.derive(streams["sft"], e, "shuffle") for e in range(4)})
    heldout = rng_lib.derive(streams["eval"], 7, "heldout")
    used.update({f"eval/{c}/token{t}": jax.random.fold_in(rng_lib.derive(heldout, c), t)
                 for c in range(1, 4) for t in range(T)})  # fmt: skip
    raw = {n: tuple(np.asarray(k).tolist()) for n, k in used.items()}
    clashes = [(a, b) for a, b in itertools.combinations(raw, 2) if raw[a] == raw[b]]
    assert not clashes, clashes[:5]
    assert len(raw) > 11 * T  # the token keys of 4 rounds, 4 pool members and 3 eval calls were covered


class _TwoProcesses:
    """A Context stand-in for process 0 of 2: the other process's grades are computed here, by the same
    code path, for the rows process 0 does not own."""

    multi = True

    def __init__(self, other):
        self.other = other

    def allgather_objects(self, name, obj):
        assert name == "grades"
        return [obj, self.other()]


@pytest.mark.parametrize("rewards", ["tests", "tests,format:0.5,length:0.25"])
def test_each_process_grades_its_rows_and_the_exchange_puts_them_back_in_place(ex, rewards):
    """Multi-process grading (Grader.score_all): process 0 grades rows 0 and 2, 'process 1' rows 1 and 3, each
    computes its own rows' --rewards functions, and the exchanged verdicts / rewards / reward parts equal the
    single-process grading row for row."""
    cfg = dataclasses.replace(_cfg(replay_fraction=0.0), rewards=RewardConfig(functions=rewards))
    one = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL)
    probs = [PROBLEMS[i] for i in (3, 5, 7, 9)]
    # row b passes in members g < b (row 0: none pass ... row 3: three of four pass): every row differs
    ref = [p.reference[len(p.prompt) :] if p.completion_mode != "program" else p.reference for p in probs]
    texts = [ref[b] if g < b else "syntax error (" for b in range(B) for g in range(G)]
    lengths = np.arange(B * G) % T + 1
    want_v, want_r, want_p = one.grader.score_all(probs, texts, lengths)
    assert want_r.tolist() == [[1.0 * (g < b) for g in range(G)] for b in range(B)]
    assert (want_p is None) == (rewards == "tests")

    other = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL)
    other_owned = np.array([False, True, False, True])
    mine = np.flatnonzero(other_owned)
    sub = [texts[b * G + g] for b in mine for g in range(G)]

    def other_grades():
        v, r = pipeline.score_completions(ex, [probs[b] for b in mine], sub, G, None, other.grader.fmt)
        sub_len = np.asarray([lengths[b * G + g] for b in mine for g in range(G)])
        parts = None if want_p is None else other.grader.reward_parts(probs, mine, sub, v, r, sub_len)
        return mine, v, r, parts

    proc0 = make_rollout(cfg, TOK, ex, PROBLEMS, MODEL, ctx=_TwoProcesses(other_grades))
    proc0.grader.owned = ~other_owned
    got_v, got_r, got_p = proc0.grader.score_all(probs, texts, lengths)
    np.testing.assert_array_equal(got_r, want_r)
    assert [v.status for v in got_v] == [v.status for v in want_v]
    if want_p is not None:
        np.testing.assert_array_equal(got_p, want_p)
        assert got_p[:, :, 1].tolist() == [[float(g < b) for g in range(G)] for b in range(B)]  # format
