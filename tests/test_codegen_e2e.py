"""End to end: `python -m experiments.codegen` in a subprocess (SFT -> GRPO on sandboxed rewards -> eval), its
events / JSONL / checkpoints, bit-exact resume after SIGKILL, and one-line errors for bad input."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from grpo_jax.train.logging import read_events

ROOT = Path(__file__).resolve().parents[1]
TINY = "--flagfile=experiments/flagfiles/tiny_test.flags"


def _cmd(*args):
    return [sys.executable, "-m", "experiments.codegen", *args]


def _run(*args, timeout=600):
    return subprocess.run(_cmd(*args), cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    wd = tmp_path_factory.mktemp("e2e") / "run"
    proc = _run(TINY, f"--workdir={wd}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return wd, proc


def test_run_leaves_events_jsonl_checkpoints_and_results(uninterrupted):
    wd, proc = uninterrupted
    assert "isolation tier" in proc.stdout
    assert "after SFT" in proc.stdout and "after GRPO" in proc.stdout
    results = json.loads((wd / "results.json").read_text())
    assert results["steps"] == 6
    for phase in ("sft", "grpo"):
        assert 0.0 <= results[phase]["pass@1"] <= 1.0 and "pass@2" in results[phase]
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    train_lines = [x for x in lines if "reward" in x]
    assert [x["step"] for x in train_lines] == [1, 2, 3, 4, 5, 6]
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
        assert key in train_lines[-1], key
    # the memory peaks are monotone high-water marks: the one by the last GRPO step is in results.json and
    # the one after the final evaluation is no smaller (a jax process holds well over 50 MiB)
    grpo_peak = results["memory_grpo_this_process"]["memory/host_peak_rss_mb"]
    assert grpo_peak == train_lines[-1]["memory/host_peak_rss_mb"] > 50
    assert results["memory_this_process"]["memory/host_peak_rss_mb"] >= grpo_peak
    # the procedural suite is parent-graded throughout; every problem got a limit from its reference
    assert train_lines[-1]["sandbox/child_checked_frac"] == 0.0
    assert "time limits: per problem 0.50–" in proc.stdout  # the 0.5 s floor: references take ms
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
    ref_wd, _ = uninterrupted
    ref = json.loads((ref_wd / "results.json").read_text())
    wd = tmp_path / "killed"
    proc = subprocess.Popen(
        _cmd(TINY, f"--workdir={wd}"), cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 300
    try:
        while not (wd / "checkpoints" / "4").exists():  # killed after the step-4 checkpoint, before the end
            assert proc.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline, "no step-4 checkpoint within 300 s"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert not (wd / "results.json").exists()
    resumed = _run(TINY, f"--workdir={wd}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    got = json.loads((wd / "results.json").read_text())
    assert got["final_params_sha256"] == ref["final_params_sha256"]
    assert got["grpo"] == {**ref["grpo"], "seconds": got["grpo"]["seconds"]}
    lines = [json.loads(x) for x in (wd / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if "reward" in x] == [1, 2, 3, 4, 5, 6]  # each step once


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


def test_pool_lora_ema_run_and_extension_resume(tmp_path):
    """--baseline=pool with LoRA adapters and an EMA reference end to end; a 4-step run extended to 8 steps
    (resumed from its final checkpoint) ends bit-identical to an uninterrupted 8-step run."""
    full = _run(TINY, f"--workdir={tmp_path / 'full'}", *POOL)
    assert full.returncode == 0, full.stderr[-3000:]
    assert "LoRA rank 2: training" in full.stdout
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    train = {x["step"]: x for x in lines if "reward" in x}
    assert sorted(train) == list(range(1, 9))
    # line n is the step made from rollout n - 1; the first snapshot is pushed by the rollout of step 2
    assert "pool/members_evaluated" not in train[2]  # the pool is empty until the step-2 push
    assert train[3]["pool/members_evaluated"] == 1.0 and train[3]["pool/baseline_coverage"] == 1.0
    assert [train[s]["pool/k_schedule"] for s in (4, 5)] == [2.0, 4.0]  # K 2 -> 4 at step 4
    # pushes at steps 2, 4, 6; push number 1 (0-based) is an exploration member (fraction 0.5)
    assert train[8]["pool/size"] == 3.0 and train[8]["pool/explore_members"] == 1.0
    assert all(train[s]["ref/updated"] == 1.0 for s in train)
    half = _run(TINY, f"--workdir={tmp_path / 'ext'}", *POOL[:-1], "--steps=4")
    assert half.returncode == 0, half.stderr[-3000:]
    ext = _run(TINY, f"--workdir={tmp_path / 'ext'}", *POOL)
    assert ext.returncode == 0 and "resumed from" in ext.stdout, ext.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("full", "ext"))
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

    r, state = open_checkpoint(str(wd), print_fn=lambda s: None)
    try:
        params = policy_params(r, state)
    finally:
        r.ckpt.close()
    model = transformers.AutoModelForCausalLM.from_pretrained(wd / "hf", dtype=torch.float32).eval()
    tok = load_tokenizer(str(wd / "hf"))
    ids = tok.encode("def solve(n):\n    return n + 1\n")
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    ours = np.asarray(tfm.forward(params, r.model, jnp.asarray([ids]), jnp.ones((1, len(ids))))[0][0])
    np.testing.assert_allclose(ours, theirs, atol=2e-4 * np.abs(theirs).max())
    cfg2, params2 = load_pretrained(str(wd / "hf"))
    assert (cfg2.d_model, cfg2.n_layers, cfg2.vocab_size) == (
        r.model.d_model,
        r.model.n_layers,
        r.model.vocab_size,
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


def test_sparse_mechanisms_async_run_and_extension_resume(tmp_path):
    """Curriculum, dynamic sampling, replay, multi-scale advantages and async rewards together; the pending
    (already graded) rollout travels in the checkpoint, so a 4-step run extended to 8 steps ends
    bit-identical to an uninterrupted 8-step run."""
    full = _run(TINY, f"--workdir={tmp_path / 'full'}", *SPARSE)
    assert full.returncode == 0, full.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    train = {x["step"]: x for x in lines if "reward" in x}
    assert sorted(train) == list(range(1, 9))
    for key in ("dynamic/kept_groups", "replay/size", "curriculum/level0_pass_rate", "time/rollout_wait_s"):
        assert key in train[8], key
    half = _run(TINY, f"--workdir={tmp_path / 'ext'}", *SPARSE[:-1], "--steps=4")
    assert half.returncode == 0, half.stderr[-3000:]
    ext = _run(TINY, f"--workdir={tmp_path / 'ext'}", *SPARSE)
    assert ext.returncode == 0 and "resumed from" in ext.stdout, ext.stderr[-3000:]
    a, b = (json.loads((tmp_path / d / "results.json").read_text()) for d in ("full", "ext"))
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
        (["--pool_capacity=4", "--pool_k_schedule=0:8"], "k_schedule"),
        (["--ref_update=ema", "--kl_coef=0"], "ref_update"),
        (["--async_rewards"], "tis_cap"),
        (["--replay_fraction=1.5"], "--replay_fraction"),
        (["--kl_anchor=old"], "--kl_anchor=old: with num_iterations=1"),
        (["--pool_k_schedule=0:x"], "--pool_k_schedule"),
        (["--mesh_fsdp=2"], "--mesh_fsdp=2 x --mesh_tensor=1 = 2 does not divide the 1 devices"),
    ],
)
def test_bad_flags_give_one_line_and_write_nothing(tmp_path, args, needle):
    wd = tmp_path / "never"
    proc = _run(TINY, f"--workdir={wd}", *args, timeout=120)
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("I1", "W1"))]
    assert len(err) == 1 and needle in err[0], proc.stderr
    assert not wd.exists()


@pytest.mark.parametrize(
    "args, drives",
    [
        (["--controller=seed_entropy", "--entropy_coef=0.01"], "entropy"),
        (["--controller=skywork_entropy", "--controller_target=5.0"], "entropy"),
        (["--controller=ppo_adaptive_kl", "--controller_target=0.01"], "kl"),
        (["--controller=ziegler_kl", "--controller_target=0.01", "--controller_horizon=100"], "kl"),
        (["--controller=seed_entropy", "--controller_acts_on=kl_coef", "--kl_coef=0.01"], "kl"),
        (["--kl_schedule=0:0.04,1:0.01"], None),
        (["--preset=dapo", "--overlong_cache_len=4"], None),
        # TRL 1.16 objectives with the new masks and IS corrections (sapo and luspo: unit tests and the
        # quickstart runs of the closing note; two runs here keep the suite short)
        (
            [
                "--preset=cispo",
                "--top_entropy_quantile=0.5",
                "--off_policy_mask_threshold=0.1",
                "--entropy_coef=0.01",
            ],
            None,
        ),
        (["--preset=vespo", "--tis_cap=2", "--tis_min=0.5", "--tis_mode=mask"], None),
    ],
    ids=[
        "seed_entropy",
        "skywork",
        "ppo_kl",
        "ziegler",
        "seed_on_kl",
        "kl_schedule",
        "dapo",
        "cispo",
        "vespo",
    ],
)
def test_controllers_schedules_and_dapo_run_from_the_cli(tmp_path, args, drives):
    """Each adaptive controller (and the β schedule, and DAPO with its overlong shaping) completes a short
    run from the command line and moves the coefficient it drives (the random-init policy's entropy, ~6.2,
    is above every target here and its KL to the reference after one step is below every target)."""
    common = ("--steps=2", "--sft_steps=0", "--eval_samples=1", "--eval_ks=1")  # no SFT: a short suite
    proc = _run(TINY, f"--workdir={tmp_path / 'run'}", *common, *args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    train = [x for x in lines if "reward" in x]
    assert [x["step"] for x in train] == [1, 2]
    if drives is not None:
        other = "kl" if drives == "entropy" else "entropy"
        assert train[0][f"coef/{drives}_next"] != train[0][f"coef/{drives}"]
        assert train[0][f"coef/{other}_next"] == train[0][f"coef/{other}"]
    if "--kl_schedule=0:0.04,1:0.01" in args:
        assert [x["coef/kl"] for x in train] == pytest.approx([0.04, 0.01])
    if "--preset=dapo" in args:
        assert "reward/overlong" in train[-1] and "dynamic/kept_groups" in train[-1]
    if "--top_entropy_quantile=0.5" in args:
        assert 0.3 < train[0]["entropy_mask/kept"] < 0.7
    if "--off_policy_mask_threshold=0.1" in args:
        assert 0.0 <= train[0]["off_policy_mask/kept"] <= 1.0
    if "--preset=vespo" in args:
        assert train[0]["vespo/phi_seq_mean"] > 0 and "tis/weight_mean" in train[0]
    assert all(math.isfinite(x["loss"]) for x in train)


def test_every_flagfile_resolves_to_a_valid_config(tmp_path):
    """--dry_run on every shipped flagfile: flags parse, the preset resolves, every config validates."""
    files = sorted((ROOT / "experiments" / "flagfiles").glob("*.flags"))
    procs = {
        f.name: subprocess.Popen(
            _cmd(f"--flagfile={f}", f"--workdir={tmp_path / f.stem}", "--dry_run"),
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for f in files
    }
    for name, p in procs.items():
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, (name, err[-2000:])
        cfg = json.loads(out)
        assert cfg["rollout"]["group_size"] >= 2, name
    assert len(procs) >= 15
    assert not any((tmp_path / f.stem).exists() for f in files)  # a dry run writes nothing


def test_garbled_flagfile(tmp_path):
    bad = tmp_path / "bad.flags"
    bad.write_bytes(b"--steps=3\n--\xff\xfe=\n")
    proc = _run(f"--flagfile={bad}", f"--workdir={tmp_path / 'never'}", timeout=120)
    assert proc.returncode != 0
    err = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(err) == 1, proc.stderr
    assert not (tmp_path / "never").exists()


def test_workdir_with_other_run_is_refused(uninterrupted, tmp_path):
    wd, _ = uninterrupted
    proc = _run(TINY, f"--workdir={wd}", "--d_model=64", "--n_heads=2", timeout=300)
    assert proc.returncode == 2
    assert "different" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    os.stat(wd / "results.json")  # the earlier run's files are untouched


def test_sigterm_saves_a_checkpoint_and_exits_cleanly(tmp_path):
    wd = tmp_path / "term"
    proc = subprocess.Popen(
        _cmd(TINY, f"--workdir={wd}"), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    deadline = time.monotonic() + 300
    while not (wd / "checkpoints" / "2").exists():
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out[-2000:]
    assert "signal received: checkpoint saved at step" in out
    stopped = int(out.split("checkpoint saved at step ")[1].split(";")[0])
    assert (wd / "checkpoints" / str(stopped)).exists() and not (wd / "results.json").exists()
