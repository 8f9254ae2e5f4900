"""End to end: the main job (SFT -> GRPO on sandboxed rewards -> eval), its events / JSONL / checkpoints,
bit-exact resume after SIGKILL, SIGTERM, extensions of a run, and one-line errors for bad input.

The runs are in-process (tests/mainjob.py: the main job's flag handling and loop without a new interpreter);
the contracts only a process shows are checked once each on the real `python -m experiments.codegen`: a
SIGKILL mid-run and the same command resuming bit-identically, a bad flag (one line on stderr, exit status 2,
nothing written) and --dry_run (the resolved configuration, nothing written)."""

import json
import math
import os
import signal
import subprocess
import threading
import time

import mainjob
import pytest

from grpo_jax import cli
from grpo_jax.train.build import RunConfigError, build
from grpo_jax.train.events import read_events
from grpo_jax.train.loop import setup
from grpo_jax.train.state import make_controllers

TINY = mainjob.TINY


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, ex):
    wd = tmp_path_factory.mktemp("e2e") / "run"
    results, out = mainjob.run(TINY, workdir=wd, executor=ex)
    return wd, results, out


def test_run_leaves_events_jsonl_checkpoints_and_results(uninterrupted):
    wd, results_returned, out = uninterrupted
    assert "after SFT" in out and "after GRPO" in out
    results = json.loads((wd / "results.json").read_text())
    assert results["steps"] == 6 and results["final_params_sha256"] == results_returned["final_params_sha256"]
    for phase in ("sft", "grpo"):
        assert 0.0 <= results[phase]["pass@1"] <= 1.0 and "pass@2" in results[phase]
    train = mainjob.metrics(wd)
    assert sorted(train) == [1, 2, 3, 4, 5, 6]
    for key in (
        "Policy/Entropy",
        "Training/AdvantageNorm",
        "Performance/SuccessRate",
        "sandbox/syntax_error",
        "time/sample_s",
        "time/reward_s",
        "time/train_s",
        "sandbox/programs_per_s",
        "sandbox/child_checked_frac",
        "memory/host_peak_rss_mb",
    ):
        assert key in train[6], key
    # the memory peaks are monotone high-water marks: the one by the last GRPO step is in results.json and
    # the one after the final evaluation is no smaller (a jax process holds well over 50 MiB)
    grpo_peak = results["memory_grpo_this_process"]["memory/host_peak_rss_mb"]
    assert grpo_peak == train[6]["memory/host_peak_rss_mb"] > 50
    assert results["memory_this_process"]["memory/host_peak_rss_mb"] >= grpo_peak
    # the procedural suite is parent-graded throughout; every problem got a limit from its reference
    assert train[6]["sandbox/child_checked_frac"] == 0.0
    assert "time limits: per problem 0.50–" in out  # the 0.5 s floor: references take ms
    events = read_events(wd / "tb")
    for tag in ("Policy/Entropy", "Training/AdvantageNorm", "Performance/SuccessRate", "grad_norm", "kl"):
        assert [s for s, _ in events[tag]] == [1, 2, 3, 4, 5, 6], tag
    assert [s for s, _ in events["eval/pass_at_1"]] == [0, 6]
    samples = [json.loads(x) for x in (wd / "samples.jsonl").read_text().splitlines()]
    assert samples and {"task_id", "completion", "status", "reward"} <= set(samples[0])
    ckpts = sorted(int(p.name) for p in (wd / "checkpoints").iterdir() if p.name.isdigit())
    assert ckpts[-1] == 6
    assert (wd / "run.json").exists() and (wd / "pass_rates.jsonl").exists()


def test_sigkill_and_resume_is_bit_identical(uninterrupted, tmp_path):
    """The real main job killed with SIGKILL after its step-4 checkpoint; the same command resumes and ends
    bit-identical to the uninterrupted run (made in-process: the two paths compute the same bits)."""
    _, ref, _ = uninterrupted
    wd = tmp_path / "killed"
    mainjob.kill_after_checkpoint(TINY, workdir=wd, step=4)  # after the step-4 checkpoint, before the end
    assert not (wd / "results.json").exists()
    resumed = mainjob.subprocess_run(TINY, f"--workdir={wd}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "isolation tier" in resumed.stdout
    got = json.loads((wd / "results.json").read_text())
    assert got["final_params_sha256"] == ref["final_params_sha256"]
    assert got["grpo"] == {**ref["grpo"], "seconds": got["grpo"]["seconds"]}
    assert sorted(mainjob.metrics(wd)) == [1, 2, 3, 4, 5, 6]  # each step once


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_resume_is_bit_identical(uninterrupted, ex, tmp_path):
    """Three chunk files of the newest checkpoint (step 4) overwritten with garbage: --resume_from=4 is one
    error listing the intact steps; the plain rerun says so in one line, resumes from step 2 (the newest
    intact one, recorded in run.json and the results) and ends bit-identical to the uninterrupted run."""
    _, ref, _ = uninterrupted
    wd = tmp_path / "damaged"
    ck = wd / "checkpoints"
    mainjob.run(TINY, "--steps=4", workdir=wd, executor=ex)
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [2, 4]  # keep=2
    chunks = sorted(p for p in (ck / "4" / "state").rglob("*") if p.is_file() and p.parent.name == "d")
    for p in chunks[:3]:
        p.write_bytes(b"\xa5" * p.stat().st_size)
    cfg, _ = mainjob.config(TINY, "--resume_from=4", workdir=wd)
    with pytest.raises(RunConfigError, match=r"^--resume_from=4: checkpoint step 4 .* corrupt .*: \[2\]$"):
        setup(cfg, ex)
    results, out = mainjob.run(TINY, workdir=wd, executor=ex)
    (line,) = [x for x in out.splitlines() if "is corrupt" in x]
    assert line.startswith(f"checkpoint step 4 in {ck} is corrupt (3 of ") and "SHA-256 differs" in line
    assert line.endswith("resuming from step 2, the newest intact one")
    assert f"resumed from {ck} at GRPO step 2" in out
    assert results["resumed_from_step"] == 2 and results["skipped_corrupt_steps"] == [4]
    run_info = json.loads((wd / "run.json").read_text())
    assert run_info["resumed_from_step"] == 2 and run_info["skipped_corrupt_steps"] == [4]
    got = json.loads((wd / "results.json").read_text())
    assert got["final_params_sha256"] == ref["final_params_sha256"]
    assert sorted(mainjob.metrics(wd)) == [1, 2, 3, 4, 5, 6]  # each step once
    assert sorted(int(p.name) for p in ck.iterdir() if p.name.isdigit()) == [4, 6]  # 4 written anew


def test_sigterm_saves_a_checkpoint_and_stops(ex, tmp_path):
    """SIGTERM during a run: the loop finishes the step, checkpoints it and returns (no results.json); the
    same command then resumes from that step."""
    wd = tmp_path / "term"
    args = (TINY, "--steps=1000", "--checkpoint_every=2", "--sft_steps=0", "--eval_samples=0", "--eval_ks=")

    def terminate_after_step_2():
        deadline = time.monotonic() + 300
        while not (wd / "checkpoints" / "2").exists():
            if time.monotonic() > deadline:
                return  # no signal without the loop's handler in place (the assertions below then fail)
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)  # the loop's handler turns it into a stop after this step

    killer = threading.Thread(target=terminate_after_step_2, daemon=True)
    killer.start()
    results, out = mainjob.run(*args, workdir=wd, executor=ex)
    killer.join(timeout=10)
    stopped = results["interrupted_at"]
    assert f"signal received: checkpoint saved at step {stopped}; exiting" in out and stopped < 1000
    assert (wd / "checkpoints" / str(stopped)).exists() and not (wd / "results.json").exists()
    results, out = mainjob.run(*args[:1], f"--steps={stopped + 1}", *args[2:], workdir=wd, executor=ex)
    assert (
        f"resumed from {wd / 'checkpoints'} at GRPO step {stopped}" in out and results["steps"] == stopped + 1
    )


POOL = (
    "--baseline=pool",
    "--pool_capacity=4",
    "--pool_push_every=2",
    "--pool_k_schedule=0:2,4:4",
    "--pool_explore_fraction=0.5",
    "--lora_rank=2",
    "--kl_coef=0.04",
    "--ref_update=ema",
    "--ref_ema_tau=0.1",
    "--export_hf",
    "--steps=8",
)


def test_pool_lora_ema_run_and_extension_resume(ex, tmp_path):
    """--baseline=pool with LoRA adapters and an EMA reference end to end; a 4-step run extended to 8 steps
    (resumed from its final checkpoint) ends bit-identical to an uninterrupted 8-step run."""
    a, out = mainjob.run(TINY, *POOL, workdir=tmp_path / "full", executor=ex)
    assert "LoRA rank 2: training" in out
    train = mainjob.metrics(tmp_path / "full")
    assert sorted(train) == list(range(1, 9))
    # line n is the step made from rollout n - 1; the first snapshot is pushed by the rollout of step 2
    assert "pool/members_evaluated" not in train[2]  # the pool is empty until the step-2 push
    assert train[3]["pool/members_evaluated"] == 1.0 and train[3]["pool/baseline_coverage"] == 1.0
    assert [train[s]["pool/k_schedule"] for s in (4, 5)] == [2.0, 4.0]  # K 2 -> 4 at step 4
    # pushes at steps 2, 4, 6; push number 1 (0-based) is an exploration member (fraction 0.5)
    assert train[8]["pool/size"] == 3.0 and train[8]["pool/explore_members"] == 1.0
    assert all(train[s]["ref/updated"] == 1.0 for s in train)
    mainjob.run(TINY, *POOL[:-1], "--steps=4", workdir=tmp_path / "ext", executor=ex)
    b, out = mainjob.run(TINY, *POOL, workdir=tmp_path / "ext", executor=ex)
    assert "resumed from" in out
    assert a["final_params_sha256"] == b["final_params_sha256"]
    assert b["grpo_eval_step"] == 8 and a["grpo"] == {**b["grpo"], "seconds": a["grpo"]["seconds"]}
    _check_export(tmp_path / "full")


def _check_export(wd):
    """--export_hf: transformers loads workdir/hf (LoRA merged) with the logits of the trained policy, the
    tokenizer round-trips, and the adapters alone are in PEFT's format next to it."""
    import jax.numpy as jnp
    import numpy as np
    import torch
    import transformers

    from grpo_jax.policies import transformer as tfm
    from grpo_jax.pretrained.api import load_pretrained, load_tokenizer
    from grpo_jax.train.export import open_checkpoint, policy_params

    run, state = open_checkpoint(str(wd), print_fn=lambda s: None)
    try:
        params = policy_params(run, state)
    finally:
        run.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(wd / "hf", dtype=torch.float32).eval()
    tok = load_tokenizer(str(wd / "hf"))
    ids = tok.encode("def solve(n):\n    return n + 1\n")
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(tfm.forward(params, run.model, jnp.asarray([ids]), jnp.ones((1, len(ids))))[0][0])
    np.testing.assert_allclose(ours, theirs, atol=2e-4 * np.abs(theirs).max())
    cfg2, _ = load_pretrained(str(wd / "hf"))
    assert (cfg2.d_model, cfg2.n_layers, cfg2.vocab_size) == (
        run.model.d_model,
        run.model.n_layers,
        run.model.vocab_size,
    )
    assert (wd / "hf_peft" / "adapter_config.json").exists()


SPARSE = (
    "--curriculum=pass_rate",
    "--dynamic_sampling",
    "--dynamic_max_rounds=1",
    "--replay_fraction=0.25",
    "--multiscale_w_tests=0.5",
    "--async_rewards",
    "--tis_cap=2",
    "--steps=8",
)


def test_sparse_mechanisms_async_run_and_extension_resume(ex, tmp_path):
    """Curriculum, dynamic sampling, replay, multi-scale advantages and async rewards together; the pending
    (already graded) rollout travels in the checkpoint, so a 4-step run extended to 8 steps ends
    bit-identical to an uninterrupted 8-step run."""
    a, _ = mainjob.run(TINY, *SPARSE, workdir=tmp_path / "full", executor=ex)
    train = mainjob.metrics(tmp_path / "full")
    assert sorted(train) == list(range(1, 9))
    for key in ("dynamic/kept_groups", "replay/size", "curriculum/level0_pass_rate", "time/rollout_wait_s"):
        assert key in train[8], key
    mainjob.run(TINY, *SPARSE[:-1], "--steps=4", workdir=tmp_path / "ext", executor=ex)
    b, out = mainjob.run(TINY, *SPARSE, workdir=tmp_path / "ext", executor=ex)
    assert "resumed from" in out
    assert a["final_params_sha256"] == b["final_params_sha256"]
    assert a["grpo"] == {**b["grpo"], "seconds": a["grpo"]["seconds"]}


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--group_size=1"], "--group_size=1"),
        (["--learning_rate=-1"], "--learning_rate=-1.0"),
        (["--sft_levels=0,9"], "--sft_levels"),
        (["--preset=ppo"], "--preset=ppo"),
        (["--flagfile=does/not/exist.flags"], "does/not/exist.flags"),
        (["--steps=many"], "--steps=many"),
        (["--baseline=pool"], "needs a policy pool"),
        (["--baseline=pool", "--pool_capacity=4", "--pool_k_schedule=0:8"], "k_schedule"),
        (["--ref_update=ema", "--kl_coef=0"], "ref_update"),
        (["--async_rewards"], "tis_cap"),
        (["--replay_fraction=1.5"], "--replay_fraction"),
        (["--kl_anchor=old", "--kl_coef=0.04"], "--kl_anchor=old: with num_iterations=1"),
        (["--pool_k_schedule=0:x"], "--pool_k_schedule"),
        (["--unknown_flag=1"], "unknown_flag"),
    ],
)
def test_bad_flags_give_one_line_naming_the_flag(args, needle, tmp_path):
    """What the main job prints for bad input (the main job's own flag handling, in-process): one line,
    naming the flag; nothing is written (the subprocess test below checks the exit status once)."""
    with pytest.raises(cli.FlagError) as e:
        mainjob.config(TINY, *args, workdir=tmp_path / "never")
    assert needle in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "never").exists()


def test_a_mesh_that_does_not_fit_the_devices_is_refused_before_anything_is_written(tmp_path):
    cfg, _ = mainjob.config(TINY, "--mesh_fsdp=2", workdir=tmp_path / "never")
    with pytest.raises(
        RunConfigError, match="--mesh_fsdp=2 x --mesh_tensor=1 = 2 does not divide the 1 devices"
    ):
        build(cfg, None, print_fn=lambda _: None)
    assert not (tmp_path / "never").exists()


def test_garbled_flagfile_is_one_line(tmp_path):
    bad = tmp_path / "bad.flags"
    bad.write_bytes(b"--steps=3\n--\xff\xfe=\n")
    with pytest.raises(cli.FlagError, match="is not valid UTF-8"):
        mainjob.config(f"--flagfile={bad}", workdir=tmp_path / "never")


def test_the_process_contract_of_bad_input_and_dry_run(tmp_path):
    """The real process: a bad value is one line on stderr, exit status 2, nothing written; --dry_run prints
    the resolved configuration as JSON and writes nothing."""
    wd = tmp_path / "never"
    procs = {
        "bad": subprocess.Popen(
            mainjob.command(TINY, f"--workdir={wd}", "--group_size=1"),
            cwd=mainjob.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
        "dry": subprocess.Popen(
            mainjob.command(
                "--flagfile=experiments/flagfiles/quickstart.flags", f"--workdir={wd}", "--dry_run"
            ),
            cwd=mainjob.ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        ),
    }
    (bad_out, bad_err), (dry_out, dry_err) = (p.communicate(timeout=300) for p in procs.values())
    err = [ln for ln in bad_err.splitlines() if ln.strip()]
    assert procs["bad"].returncode == 2 and len(err) == 1 and err[0].startswith("error: --group_size=1"), (
        bad_err
    )
    assert procs["dry"].returncode == 0, dry_err[-2000:]
    assert json.loads(dry_out)["rollout"]["group_size"] == 8
    assert not wd.exists()


def test_workdir_with_other_run_is_refused(uninterrupted, tmp_path):
    wd, _, _ = uninterrupted
    before = (wd / "results.json").stat().st_mtime_ns
    cfg, _ = mainjob.config(TINY, "--d_model=64", "--n_heads=2", workdir=wd)
    with pytest.raises(RunConfigError, match="different"):
        setup(cfg, None, print_fn=lambda _: None)
    assert (wd / "results.json").stat().st_mtime_ns == before  # the earlier run's files are untouched


# each controller and schedule wired from its flags: step 1's applied coefficient and the next one equal the
# controller (grpo_jax.core.controllers, literal-tested in test_controllers.py) applied to the signal the step
# logged (the random-init policy's entropy, ~6.2, is above every target here; its KL is below every target)
CONTROLLED = {
    "seed_entropy": ["--controller=seed_entropy", "--entropy_coef=0.01"],
    "skywork": ["--controller=skywork_entropy", "--controller_target=5.0"],
    "ppo_kl": ["--controller=ppo_adaptive_kl", "--controller_target=0.01"],
    "ziegler": ["--controller=ziegler_kl", "--controller_target=0.01", "--controller_horizon=100"],
    "seed_on_kl": ["--controller=seed_entropy", "--controller_acts_on=kl_coef", "--kl_coef=0.01"],
    "kl_schedule": ["--kl_schedule=0:0.04,1:0.01", "--kl_coef=0.04"],
}


@pytest.mark.parametrize("name", list(CONTROLLED))
def test_controllers_and_schedules_drive_their_coefficient(ex, tmp_path, name):
    common = ("--steps=2", "--sft_steps=0", "--eval_samples=0", "--eval_ks=")
    _, _ = mainjob.run(TINY, *common, *CONTROLLED[name], workdir=tmp_path / "run", executor=ex)
    cfg, _ = mainjob.config(TINY, *common, *CONTROLLED[name], workdir=tmp_path / "run")
    train = mainjob.metrics(tmp_path / "run")
    kl_ctrl, ent_ctrl = make_controllers(cfg.objective)
    n = cfg.rollout.prompts_per_step * cfg.rollout.group_size
    for what, ctrl in (("kl", kl_ctrl), ("entropy", ent_ctrl)):
        state = ctrl.init()
        for step in (1, 2):
            m = train[step]
            signal = {"kl": m["kl"], "entropy": m["entropy"], "none": 0.0}[ctrl.measures]
            assert m[f"coef/{what}"] == pytest.approx(float(ctrl.applied(state, signal)), rel=1e-5), (
                what,
                step,
            )
            state = ctrl.update(state, signal, n_steps=n)
            assert m[f"coef/{what}_next"] == pytest.approx(float(state.coef), rel=1e-5), (what, step)
    moved = {w for w in ("kl", "entropy") if train[1][f"coef/{w}_next"] != train[1][f"coef/{w}"]}
    assert moved == ({"entropy"} if name in ("seed_entropy", "skywork") else {"kl"})


@pytest.mark.parametrize(
    "args",
    [
        ["--preset=dapo", "--overlong_cache_len=4"],
        [
            "--preset=cispo",
            "--top_entropy_quantile=0.5",
            "--off_policy_mask_threshold=0.1",
            "--entropy_coef=0.01",
        ],
        ["--preset=vespo", "--tis_cap=2", "--tis_min=0.5", "--tis_mode=mask"],
    ],
    ids=["dapo", "cispo", "vespo"],
)
def test_objectives_with_their_masks_run_from_the_command_line(ex, tmp_path, args):
    """DAPO with its overlong shaping and dynamic sampling, and TRL 1.16 objectives with the masks and IS
    corrections, each a short run of the main job whose option metrics are logged and finite."""
    common = ("--steps=2", "--sft_steps=0", "--eval_samples=0", "--eval_ks=")
    mainjob.run(TINY, *common, *args, workdir=tmp_path / "run", executor=ex)
    train = mainjob.metrics(tmp_path / "run")
    assert sorted(train) == [1, 2] and all(math.isfinite(x["loss"]) for x in train.values())
    if "--preset=dapo" in args:
        assert "reward/overlong" in train[2] and "dynamic/kept_groups" in train[2]
    if "--top_entropy_quantile=0.5" in args:
        assert 0.3 < train[1]["entropy_mask/kept"] < 0.7
        assert 0.0 <= train[1]["off_policy_mask/kept"] <= 1.0
    if "--preset=vespo" in args:
        assert train[1]["vespo/phi_seq_mean"] > 0 and "tis/weight_mean" in train[1]


def test_bfloat16_rollouts_run_and_their_mismatch_is_logged(ex, tmp_path):
    """--rollout_dtype=bfloat16 from the command line: the sampler runs on bf16 weights, the trainer on the
    float32 policy, so logp_mismatch (sampler vs trainer, on-policy at step 1) is bf16 rounding instead of
    float32 rounding (measured ~1e-7 with float32 rollouts), and --tis_cap weighs it."""
    common = ("--steps=2", "--sft_steps=0", "--eval_samples=0", "--eval_ks=", "--tis_cap=2")
    mainjob.run(TINY, *common, "--rollout_dtype=bfloat16", workdir=tmp_path / "run", executor=ex)
    train = mainjob.metrics(tmp_path / "run")
    assert sorted(train) == [1, 2] and all(math.isfinite(x["loss"]) for x in train.values())
    # measured 3.3e-4 (float32 rollouts of this run: ~1e-7); TIS weight mean 1.00002
    assert 5e-5 < train[1]["logp_mismatch"] < 0.02
    assert 0.9 < train[1]["tis/weight_mean"] < 1.1
