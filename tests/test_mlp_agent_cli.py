"""``python -m experiments.mlp_agent`` in-process (``main(argv)``): learning, bit-identical resume, and its
one-line refusals.

Learning thresholds, measured with this file's XLA flags (tests/conftest.py) on a 2-core CPU, seeds 0–7,
default flags (hidden 64, GRPO B 64 × G 8, PPO 64 envs), on the run's fixed evaluation set:

* GRPO, discrete bandit (A = 8, chance 0.125): step 0 sampled success 0.107–0.141, greedy 0.086–0.177;
  step 40: sampled 0.505–0.580, greedy 0.570–0.706 (step 60: 0.612–0.717 / 0.662–0.832). The test asks for
  >= 0.375 = 3 × chance after 40 steps.
* PPO, chain (n 8, horizon 8): step 0 sampled return 0.160–0.193 (greedy 0–1: ties of a near-uniform policy);
  step 5: 0.917–0.940, greedy 1.0; step 10: 0.989–0.998, greedy 1.0. The test asks for >= 0.9 after 10 steps.
"""

import json
import signal

import pytest

from experiments import mlp_agent as cli
from grpo_jax.train import mlp_agent

CHANCE = 0.125  # the discrete bandit's 8 actions


def run(*args: str) -> int:
    return cli.main(["mlp_agent", *args])


def results(wd):
    return json.loads((wd / "results.json").read_text())


def rows(wd, *, keep_time=False):
    """metrics.jsonl without the wall-clock fields (time, time/step_s)."""
    out = []
    for line in (wd / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.append({k: v for k, v in row.items() if keep_time or not (k == "time" or k.startswith("time/"))})
    return out


def error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def test_grpo_discrete_learns_and_logs(tmp_path):
    wd = tmp_path / "run"
    assert (
        run("--env=discrete", "--steps=40", "--eval_every=20", "--checkpoint_every=0", f"--workdir={wd}") == 0
    )
    res = results(wd)
    start, final = res["evals"]["0"], res["final_eval"]
    assert start["reward"] < 2 * CHANCE and start["greedy_reward"] < 2 * CHANCE, start
    assert final["reward"] >= 0.375 and final["greedy_reward"] >= 0.375, final
    assert res["steps"] == 40 and final == res["evals"]["40"] and len(res["params_sha256"]) == 64
    assert sorted(res["evals"], key=int) == ["0", "20", "40"]
    logged = rows(wd, keep_time=True)
    train = [r for r in logged if "reward" in r]
    assert [r["step"] for r in train] == list(range(1, 41))
    assert {"loss", "kl", "entropy", "grad_norm", "time/step_s"} <= set(train[0])
    evals = [r for r in logged if "eval/reward" in r]
    assert [(r["step"], r["eval/reward"]) for r in evals] == [
        (s, res["evals"][str(s)]["reward"]) for s in (0, 20, 40)
    ]
    assert list((wd / "tb").iterdir()) and (wd / "checkpoints" / "40").is_dir()
    assert json.loads((wd / "run.json").read_text())["config"]["env"] == "discrete"


def test_ppo_chain_learns(tmp_path):
    wd = tmp_path / "chain"
    assert run("--env=chain", "--algorithm=ppo", "--steps=10", "--eval_every=0", f"--workdir={wd}") == 0
    res = results(wd)
    assert res["evals"]["0"]["episode_return"] < 0.4, res["evals"]["0"]
    assert res["final_eval"]["episode_return"] >= 0.9 and res["final_eval"]["greedy_return"] >= 0.9, res
    assert sorted(res["evals"], key=int) == ["0", "10"]


def test_resume_is_bit_identical(tmp_path, monkeypatch, capsys):
    flags = ("--env=discrete", "--steps=30", "--eval_every=10", "--checkpoint_every=0", "--log_every=100")
    straight, extended, signalled, crashed = (
        tmp_path / n for n in ("straight", "extended", "signalled", "crashed")
    )
    assert run(*flags, f"--workdir={straight}") == 0

    # --steps=20, then the same command with --steps=30 (a run extended past its end)
    assert run(*flags, "--steps=20", f"--workdir={extended}") == 0
    assert results(extended)["steps"] == 20
    capsys.readouterr()
    assert run(*flags, f"--workdir={extended}") == 0
    assert f"resumed from {extended}/checkpoints at step 20" in capsys.readouterr().out

    make = mlp_agent.make_grpo_train_step

    def at_call(n, do):  # make_grpo_train_step whose train step calls do() in its n-th call
        def make_step(*a, **kw):
            step, calls = make(*a, **kw), []

            def train_step(state, key):
                calls.append(None)
                if len(calls) == n:
                    do()
                return step(state, key)

            return train_step

        return make_step

    # SIGTERM during step 13 (not an evaluation step): the step ends, step 13 is saved, the run stops
    monkeypatch.setattr(
        mlp_agent, "make_grpo_train_step", at_call(13, lambda: signal.raise_signal(signal.SIGTERM))
    )
    capsys.readouterr()
    assert run(*flags, f"--workdir={signalled}") == 0
    assert "checkpoint saved at step 13" in capsys.readouterr().out
    assert not (signalled / "results.json").exists()
    assert sorted(p.name for p in (signalled / "checkpoints").iterdir()) == ["13"]
    assert max(r["step"] for r in rows(signalled)) == 13

    # a crash in step 17 with checkpoints every 10 steps: steps 11-16 were logged after the last checkpoint
    def crash():
        raise RuntimeError("crash")

    monkeypatch.setattr(mlp_agent, "make_grpo_train_step", at_call(17, crash))
    with pytest.raises(RuntimeError, match="crash"):
        run(*flags, "--checkpoint_every=10", f"--workdir={crashed}")
    assert max(r["step"] for r in rows(crashed)) == 16

    monkeypatch.setattr(mlp_agent, "make_grpo_train_step", make)
    for wd, step in ((signalled, 13), (crashed, 10)):
        assert run(*flags, f"--workdir={wd}") == 0
        assert f"resumed from {wd}/checkpoints at step {step}" in capsys.readouterr().out

    want = results(straight)
    for wd in (extended, signalled, crashed):
        got = results(wd)
        assert got["params_sha256"] == want["params_sha256"], wd.name
        assert got["evals"] == want["evals"] and got["steps"] == 30, wd.name
        assert rows(wd) == rows(straight), (
            wd.name
        )  # every step and evaluation logged once, with the same values


def test_bad_combinations_are_one_line_errors(tmp_path, capsys):
    wd = tmp_path / "never"
    for args, says in (
        (
            ("--env=discrete", "--algorithm=ppo"),
            "valid: --env=discrete or --env=continuous with --algorithm=grpo",
        ),
        (("--env=chain", "--algorithm=grpo"), "--env=chain with --algorithm=ppo"),
        (("--env=chain", "--group=4"), "--group does not apply with --algorithm=ppo"),
        (("--env=discrete", "--horizon=4"), "--horizon does not apply with --env=discrete"),
        (("--env=discrete", "--group=1"), "--group=1"),
    ):
        assert run(*args, f"--workdir={wd}") == 2, args
        assert says in error_line(capsys), args
    assert run("--env=discrete") == 2 and "--workdir is required" in error_line(capsys)
    assert not wd.exists()


def test_workdir_of_another_configuration_is_refused(tmp_path, capsys):
    wd = tmp_path / "run"
    assert run("--env=discrete", "--steps=0", "--eval_every=0", f"--workdir={wd}") == 0
    before = {p: p.read_bytes() for p in (wd / "run.json", wd / "metrics.jsonl", wd / "results.json")}
    capsys.readouterr()
    for args, says in (
        (("--env=continuous",), "env: 'discrete' there, 'continuous' here"),
        (("--env=discrete", "--kl_coef=0.1"), "agent.kl_coef: 0.01 there, 0.1 here"),
        (("--env=discrete", "--hidden=32"), "hidden: 64 there, 32 here"),
    ):
        assert run(*args, "--steps=0", f"--workdir={wd}") == 2, args
        line = error_line(capsys)
        assert "holds a run with a different configuration (run.json" in line and says in line, line
    assert {p: p.read_bytes() for p in before} == before  # nothing was written
    # without run.json, the checkpoint's own copy of the configuration is compared
    (wd / "run.json").unlink()
    assert run("--env=discrete", "--kl_coef=0.1", "--steps=0", f"--workdir={wd}") == 2
    assert "(its checkpoint: agent.kl_coef: 0.01 there, 0.1 here)" in error_line(capsys)
