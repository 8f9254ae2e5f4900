"""Several rewards in the main job: `--rewards` with built-in and user functions, both aggregations, async
rewards and multi-turn, each reward's figures in metrics.jsonl and TensorBoard; a user reward that cannot be
used stops the run before anything is written, one that fails at a step ends the run with one line (exit 2)
and the fixed command resumes from the last checkpoint."""

from __future__ import annotations

import os

import pytest

from grpo_jax.rewards import RewardError
from grpo_jax.train.events import read_events
from tests import mainjob, reward_fixtures

SHORT = (mainjob.TINY, "--steps=2", "--eval_samples=0", "--eval_ks=", "--checkpoint_every=0")
NAMES = ("tests", "format", "lint", "tests.reward_fixtures.record")


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


@pytest.mark.parametrize(
    "extra",
    [
        ("--reward_aggregation=sum_then_normalize", "--async_rewards", "--tis_cap=2"),
        (
            "--reward_aggregation=normalize_then_sum",
            "--adv_method=batch_std",
            "--max_turns=2",
            "--feedback_tokens=96",
        ),
    ],
    ids=["sum-async", "gdpo-multiturn"],
)
def test_several_rewards_are_logged_and_trained_on(tmp_path, ex, extra):
    wd = tmp_path / "run"
    rewards = "--rewards=tests:1.0,format:0.1,lint:0.1,tests.reward_fixtures:record:0.2"
    reward_fixtures.SEEN.clear()
    mainjob.run(*SHORT, rewards, *extra, workdir=wd, executor=ex)
    rows = mainjob.metrics(wd)
    assert sorted(rows) == [1, 2]
    tb = read_events(wd / "tb")
    for step, m in rows.items():
        for name in NAMES:
            assert 0.0 <= m[f"reward/{name}/adv_share"] <= 1.0
            assert any(s == step for s, _ in tb[f"reward/{name}/mean"])
        assert m["reward/tests.reward_fixtures.record/mean"] == 0.5  # the user function's constant
        # the success rate reads the test reward, not the combined one (all-pass: its mean)
        assert m["Performance/SuccessRate"] == pytest.approx(m["reward/tests/mean"], abs=1e-6)
        assert m["reward/tests.reward_fixtures.record/adv_share"] == 0.0  # a constant moves no advantage
        total = sum(m[f"reward/{n}/adv_share"] for n in NAMES)  # 0: every group all-equal in every reward
        assert total == pytest.approx(1.0, abs=1e-5) or (total == 0.0 and m["frac_reward_zero_std"] == 1.0)
        if "sum_then_normalize" in extra[0]:  # the training reward is the weighted sum of the four
            want = sum(w * m[f"reward/{n}/mean"] for n, w in zip(NAMES, (1.0, 0.1, 0.1, 0.2), strict=True))
            assert m["reward"] == pytest.approx(want, abs=1e-5)
    # the user function ran in this process once per graded reply (4 prompts x G = 4 a rollout): async grades
    # 3 rollouts in 2 steps (one ahead); multi-turn scores each trajectory once, at its last reply
    assert len(reward_fixtures.SEEN) == (3 if "--async_rewards" in extra else 2) * 16


def test_the_success_rate_reads_the_test_reward(tmp_path, ex):
    """Performance/SuccessRate is the share of replies whose TEST reward reaches --success_threshold, whatever
    the other rewards add (a constant 5 would make every combined reward a 'success')."""
    wd = tmp_path / "run"
    mainjob.run(*SHORT, "--steps=1", "--rewards=tests,tests.reward_fixtures:five", workdir=wd, executor=ex)
    m = mainjob.metrics(wd)[1]
    assert m["reward"] >= 5.0 and m["Performance/SuccessRate"] == m["reward/tests/mean"] < 1.0


def test_an_unusable_user_reward_stops_before_the_workdir(tmp_path, ex):
    wd = tmp_path / "run"
    with pytest.raises(RewardError, match="has no callable 'missing'"):
        mainjob.run(*SHORT, "--rewards=tests,tests.reward_fixtures:missing", workdir=wd, executor=ex)
    assert not wd.exists()


def test_a_reward_that_fails_at_a_step_ends_the_run_in_one_line_and_the_fixed_run_resumes(tmp_path):
    """The real process: exit 2 and one error line naming the function and the problem; the checkpoint of
    step 0 is intact, and the same command (the function fixed: its environment switch off) resumes."""
    wd = tmp_path / "run"
    args = (*SHORT, "--rewards=tests,tests.reward_fixtures:fails_when_told:0.5", f"--workdir={wd}")
    env = {**os.environ, "GRPO_TEST_REWARD_FAIL": "1"}
    out = mainjob.subprocess_run(*args, env=env)
    assert out.returncode == 2, out.stderr[-2000:]
    err = [x for x in out.stderr.splitlines() if x.startswith("error:")]
    assert len(err) == 1 and "reward tests.reward_fixtures:fails_when_told raised RuntimeError" in err[0]
    assert "(problem synthetic/L0/train/" in err[0]
    assert (wd / "checkpoints" / "0").is_dir() and not (wd / "results.json").exists()
    again = mainjob.subprocess_run(*args)
    assert again.returncode == 0, again.stderr[-2000:]
    assert "resum" in again.stdout.lower() and (wd / "results.json").exists()
