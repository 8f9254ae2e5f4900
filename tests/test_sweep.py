"""experiments.sweep: grid expansion and errors, resume / skip, warm-start ordering, the parallel limit and
signals against a stand-in main job (a few lines of Python writing the files the real one writes); the main
job's check of --sft_from (resume.check_sft_source); then ONE real tiny experiments.codegen run, the arm of a
sweep on a shared warm start (--sft_from): it starts GRPO from exactly the warm start's post-SFT weights."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from experiments import sweep

ROOT = Path(__file__).resolve().parent.parent
TINY = "experiments/flagfiles/tiny_test.flags"
QS = "experiments/flagfiles/quickstart.flags"

# The stand-in main job: the flags it is given (flagfiles expanded) become its "configuration"; it writes
# run.json (config + argv) at the start and results.json (config, steps, sft / grpo evaluations) at the end,
# as experiments.codegen does, and logs start / end events to $STANDIN_LOG. Test-only flags: --sleep=S,
# --crash_once (fails the first time, after writing a checkpoint), --fail, --bad (refused, also by --dry_run).
STANDIN = textwrap.dedent(
    """
    import json, os, signal, sys, time

    def parse(args, opts):
        for a in args:
            if a.startswith("--flagfile="):
                with open(a.split("=", 1)[1]) as f:
                    parse([x.strip() for x in f if x.strip() and not x.startswith("#")], opts)
            elif "=" in a:
                k, v = a[2:].split("=", 1)
                opts[k] = v
            elif a.startswith("--no"):
                opts[a[4:]] = False
            else:
                opts[a[2:]] = True
        return opts

    args = sys.argv[1:]
    o = parse(args, {})
    if o.get("bad"):
        print("error: --bad=1: not a flag of this job", file=sys.stderr)
        sys.exit(2)
    cfg = {"workdir": o.get("workdir", ""), "seed": int(o.get("seed", 0)), "steps": int(o.get("steps", 3)),
           "model": {"d_model": int(o.get("d_model", 8))},
           "sft": {"steps": int(o.get("sft_steps", 2)), "from_workdir": o.get("sft_from", "")},
           "rollout": {"prompts_per_step": 2, "group_size": 2}, "mech": o.get("mech", "")}
    if o.get("dry_run"):
        print(json.dumps(cfg))
        sys.exit(0)
    wd = o["workdir"]
    def event(kind, **kw):
        with open(os.environ["STANDIN_LOG"], "a") as f:
            f.write(json.dumps({"event": kind, "workdir": wd, "t": time.time(), **kw}) + "\\n")
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))  # before "start": the test signals after it
    event("start", args=args, resumed=os.path.isdir(os.path.join(wd, "checkpoints", "0")))
    src = o.get("sft_from")
    if src and not os.path.exists(os.path.join(src, "results.json")):
        print(f"error: --sft_from={src}: not finished", file=sys.stderr)
        sys.exit(3)
    os.makedirs(os.path.join(wd, "checkpoints", "0"), exist_ok=True)
    with open(os.path.join(wd, "run.json"), "w") as f:
        json.dump({"config": cfg, "argv": sys.argv}, f)
    t_end = time.time() + float(o.get("sleep", 0))
    while time.time() < t_end and not stop:
        time.sleep(0.01)
    if stop:
        event("stopped")
        sys.exit(0)  # "checkpoint saved; exiting", as the main job on SIGTERM
    if o.get("crash_once") and not os.path.exists(os.path.join(wd, "crashed")):
        open(os.path.join(wd, "crashed"), "w").close()
        print("Traceback: boom", file=sys.stderr)
        sys.exit(1)
    if o.get("fail"):
        print("error: it failed", file=sys.stderr)
        sys.exit(1)
    res = {"config": cfg, "steps": cfg["steps"], "sft": {"pass@1": 0.1}, "grpo": {"pass@1": 0.2}}
    with open(os.path.join(wd, "results.json"), "w") as f:
        json.dump(res, f)
    print("done")
    event("end")
    """
)


@pytest.fixture
def standin(tmp_path, monkeypatch):
    """(module name, event log path): the stand-in importable by the sweep's children."""
    d = tmp_path / "standin_pkg"
    d.mkdir()
    (d / "standin_job.py").write_text(STANDIN)
    log = tmp_path / "events.jsonl"
    monkeypatch.setenv("PYTHONPATH", f"{d}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    monkeypatch.setenv("STANDIN_LOG", str(log))
    monkeypatch.chdir(ROOT)  # grid paths are relative to the repository root
    return "standin_job", log


def _events(log: Path) -> list[dict]:
    return [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []


def _sweep(grid: dict, runs: Path, module: str, parallel: int = 1) -> tuple[sweep.Sweep, int]:
    sweep.check_grid(grid)
    s = sweep.Sweep(
        grid, "grid.json", str(runs), sweep.points(grid, str(runs)), python=sys.executable, module=module
    )
    return s, s.run(parallel, poll_s=0.02)


def _grid(**arms_extra) -> dict:
    return {
        "seeds": [0, 1],
        "flags": ["--steps=3"],
        "warm_starts": {"w": {"flagfile": QS}},
        "arms": {
            "base": {"flagfile": QS, "warm_start": "w"},
            "mech": {"flagfile": QS, "flags": ["--mech=x"], "warm_start": "w", **arms_extra},
            "solo": {"flags": ["--mech=solo"]},
        },
    }


# ------------------------------------------------------------------------------------------------------------
# grid expansion and errors
# ------------------------------------------------------------------------------------------------------------


def test_points_expand_the_grid_in_run_order(tmp_path):
    grid = _grid()
    sweep.check_grid(grid)
    pts = sweep.points(grid, "R")
    assert [p.id for p in pts] == [
        "_warm/w/s0", "base/s0", "mech/s0", "solo/s0",
        "_warm/w/s1", "base/s1", "mech/s1", "solo/s1",
    ]  # fmt: skip
    warm, mech, solo = pts[0], pts[2], pts[3]
    assert warm.kind == "warm" and warm.needs is None
    assert warm.args == (f"--flagfile={QS}", "--steps=3", "--steps=0", "--seed=0", "--workdir=R/_warm/w/s0")
    assert mech.args == (
        f"--flagfile={QS}", "--steps=3", "--mech=x", "--seed=0", "--workdir=R/mech/s0",
        "--sft_from=R/_warm/w/s0",
    )  # fmt: skip
    assert mech.needs == "_warm/w/s0" and mech.workdir == os.path.join("R", "mech", "s0")
    assert solo.args == ("--steps=3", "--mech=solo", "--seed=0", "--workdir=R/solo/s0") and solo.needs is None
    # a warm start no arm names is not run
    grid["warm_starts"]["unused"] = {"flagfile": QS}
    assert not any("unused" in p.id for p in sweep.points(grid, "R"))


@pytest.mark.parametrize(
    "change, needle",
    [
        (
            lambda g: g.update(arm={}),
            "grid: unknown key 'arm' (valid: description, seeds, flags, warm_starts, arms)",
        ),
        (lambda g: g["arms"]["base"].update(flagfiles=QS), "grid.arms.base: unknown key 'flagfiles' (valid:"),
        (
            lambda g: g["arms"]["base"].update(flagfile="nope.flags"),
            "grid.arms.base.flagfile: no file 'nope.flags'",
        ),
        (lambda g: g.update(seeds=[]), "grid.seeds: must be a non-empty list"),
        (lambda g: g.update(seeds=[0, 0]), "repeats a seed"),
        (lambda g: g.update(seeds=[True]), "grid.seeds: must be integers >= 0"),
        (lambda g: g["arms"]["base"].update(flags=["--seed=3"]), "the sweep sets --seed itself"),
        (lambda g: g["arms"]["base"].update(flags="--steps=2"), "grid.arms.base.flags: must be a list"),
        (lambda g: g["arms"]["base"].update(flags=["steps=2"]), "'steps=2' is not a flag"),
        (
            lambda g: g["arms"]["base"].update(warm_start="x"),
            "'x' is not a warm start of the grid (valid: w)",
        ),
        (lambda g: g["arms"].update({"_x": {"flagfile": QS}}), "grid.arms._x: the name must match"),
        (lambda g: g["arms"].update({"empty": {}}), "grid.arms.empty: give a flagfile and/or flags"),
        (lambda g: g.update(arms={}), "grid.arms: must be a non-empty object"),
    ],
)
def test_bad_grid_is_one_clear_error(standin, change, needle):
    grid = _grid()
    change(grid)
    with pytest.raises(sweep.GridError) as e:
        sweep.check_grid(grid)
    assert needle in str(e.value)


def test_cli_bad_grid_one_line_exit_2(tmp_path, standin):
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"seeds": [0], "arms": {"a": {"flagfile": "missing.flags"}}}))
    p = subprocess.run(
        [sys.executable, "-m", "experiments.sweep", f"--grid={g}", f"--runs_dir={tmp_path / 'r'}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 2 and p.stdout == ""
    assert (
        p.stderr.strip()
        == f"error: --grid={g}: grid.arms.a.flagfile: no file 'missing.flags' (relative to {ROOT})"
    )
    assert not (tmp_path / "r").exists()


def test_check_resolves_flags_and_warm_start_settings(tmp_path, standin):
    module, _ = standin
    grid = _grid()
    pts = sweep.points(grid, str(tmp_path))
    sweep.check_warm_starts(grid, sweep.resolve_configs(pts, sys.executable, module))  # consistent: passes
    grid["arms"]["mech"]["flags"] = ["--sft_steps=5"]  # other SFT settings than its warm start
    with pytest.raises(
        sweep.GridError, match=r"grid.arms.mech.warm_start: 'w' has other SFT settings \(sft.steps"
    ):
        sweep.check_warm_starts(
            grid, sweep.resolve_configs(sweep.points(grid, str(tmp_path)), sys.executable, module)
        )
    grid["arms"]["solo"]["flags"] = ["--bad=1"]
    with pytest.raises(sweep.GridError, match="arm 'solo': standin_job refused its flags: error: --bad=1"):
        sweep.resolve_configs(sweep.points(grid, str(tmp_path)), sys.executable, module)


# ------------------------------------------------------------------------------------------------------------
# running: order, resume, skip, parallel limit, signals
# ------------------------------------------------------------------------------------------------------------


def test_run_orders_warm_starts_first_skips_finished_and_writes_a_manifest(tmp_path, standin):
    module, log = standin
    runs = tmp_path / "runs"

    def grid(mech_flags=("--mech=x",)):
        g = _grid(flags=list(mech_flags))
        g["warm_starts"]["w"]["flags"] = ["--sleep=0.3"]  # the arms on it could start meanwhile: 3 at a time
        return g

    s, rc = _sweep(grid(), runs, module, parallel=3)
    assert rc == 0 and set(s.state.values()) == {"done"}
    ev = _events(log)
    t = {(e["event"], e["workdir"]): e["t"] for e in ev}
    warm0 = str(runs / "_warm" / "w" / "s0")
    for p in s.points:
        if p.needs:  # every arm on a warm start started after that warm start ended
            assert t[("start", p.workdir)] >= t[("end", str(runs / "_warm" / "w" / f"s{p.seed}"))]
    assert t[("start", str(runs / "solo" / "s0"))] < t[("end", warm0)]  # ... while the others did not wait
    assert sum(e["event"] == "start" for e in ev) == 8
    m = json.loads((runs / "manifest.json").read_text())
    assert m["arms"] == ["base", "mech", "solo"] and m["seeds"] == [0, 1] and m["module"] == module
    by_id = {p["id"]: p for p in m["points"]}
    assert by_id["mech/s1"]["command"] == [
        sys.executable, "-m", module, f"--flagfile={QS}", "--steps=3", "--mech=x", "--seed=1",
        f"--workdir={runs}/mech/s1", f"--sft_from={runs}/_warm/w/s1",
    ]  # fmt: skip
    assert by_id["mech/s1"]["state"] == "done" and by_id["mech/s1"]["needs"] == "_warm/w/s1"
    assert by_id["mech/s1"]["rc"] == 0 and by_id["mech/s1"]["seconds"] >= 0
    out = (runs / "mech" / "s1" / "stdout.log").read_text()
    assert out.startswith("== sweep ") and "done" in out  # per-point logs, a header per attempt
    progress = (runs / "sweep.log").read_text()
    assert "[1/8] start _warm/w/s0 (new;" in progress and "8/8 finished, 0 failed" in progress
    # a second sweep finds every point finished and runs nothing
    s2, rc2 = _sweep(grid(), runs, module)
    assert rc2 == 0 and sum(e["event"] == "start" for e in _events(log)) == 8
    assert all(s2.info[p.id].get("skipped") for p in s2.points)
    # a changed command makes its points run again (the others stay skipped)
    _sweep(grid(["--mech=y"]), runs, module)
    again = [e["workdir"] for e in _events(log)[16:] if e["event"] == "start"]
    assert again == [str(runs / "mech" / "s0"), str(runs / "mech" / "s1")]


def test_failed_warm_start_blocks_its_arms_and_rerun_resumes_with_the_same_command(tmp_path, standin):
    module, log = standin
    runs = tmp_path / "runs"
    grid = _grid()
    grid["seeds"] = [0]
    grid["warm_starts"]["w"]["flags"] = ["--crash_once"]
    s, rc = _sweep(grid, runs, module)
    assert rc == 1
    assert s.state == {"_warm/w/s0": "failed", "base/s0": "blocked", "mech/s0": "blocked", "solo/s0": "done"}
    assert "Traceback: boom" in (runs / "_warm" / "w" / "s0" / "stderr.log").read_text()
    assert "FAILED _warm/w/s0 (exit status 1)" in (runs / "sweep.log").read_text()
    s2, rc2 = _sweep(grid, runs, module)
    assert rc2 == 0 and set(s2.state.values()) == {"done"}
    warm = [e for e in _events(log) if e["event"] == "start" and e["workdir"].endswith("_warm/w/s0")]
    assert len(warm) == 2 and warm[0]["args"] == warm[1]["args"]  # the same command again ...
    assert warm[1]["resumed"] and not warm[0]["resumed"]  # ... over the checkpoint the first attempt left
    assert (runs / "_warm" / "w" / "s0" / "stderr.log").read_text().count("== sweep ") == 2


def _max_concurrency(events: list[dict]) -> int:
    edges = sorted(
        (e["t"], 1 if e["event"] == "start" else -1) for e in events if e["event"] in ("start", "end")
    )
    level = peak = 0
    for _, d in edges:
        level += d
        peak = max(peak, level)
    return peak


def test_parallel_limit(tmp_path, standin):
    module, log = standin
    grid = {"seeds": [0, 1], "arms": {"a": {"flags": ["--sleep=0.4"]}, "b": {"flags": ["--sleep=0.4"]}}}
    _, rc = _sweep(grid, tmp_path / "p2", module, parallel=2)
    assert rc == 0 and _max_concurrency(_events(log)) == 2
    log.unlink()
    _, rc = _sweep(grid, tmp_path / "p1", module, parallel=1)
    assert rc == 0 and _max_concurrency(_events(log)) == 1


def test_sigterm_stops_running_points_and_a_rerun_finishes_them(tmp_path, standin):
    module, log = standin
    g = tmp_path / "g.json"
    g.write_text(json.dumps({"seeds": [0, 1], "arms": {"a": {"flags": ["--sleep=30"]}}}))
    cmd = [sys.executable, "-m", "experiments.sweep", f"--grid={g}", f"--runs_dir={tmp_path / 'r'}"]
    proc = subprocess.Popen([*cmd, f"--module={module}", "--nocheck"], stdout=subprocess.PIPE, text=True)
    deadline = time.time() + 30
    while not any(e["event"] == "start" for e in _events(log)) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130
    assert [e["event"] for e in _events(log)] == ["start", "stopped"]
    assert "interrupted a/s0" in out and "1 interrupted, 1 not started" in out
    m = json.loads((tmp_path / "r" / "manifest.json").read_text())
    assert [p["state"] for p in m["points"]] == ["interrupted", "pending"]


# ------------------------------------------------------------------------------------------------------------
# the main job's side: --sft_from
# ------------------------------------------------------------------------------------------------------------


def test_main_job_checks_the_warm_start_it_is_given(tmp_path):
    from grpo_jax.config import ModelConfig, RunConfig, SFTConfig, TaskConfig
    from grpo_jax.train.build import RunConfigError
    from grpo_jax.train.resume import check_sft_source

    src = tmp_path / "warm"
    src.mkdir()

    def saved(**kw):
        (src / "run.json").write_text(json.dumps({"config": RunConfig(workdir=str(src), **kw).to_json()}))

    def run(**kw):
        return RunConfig(workdir=str(tmp_path / "arm"), sft=SFTConfig(steps=4, from_workdir=str(src)), **kw)

    with pytest.raises(RunConfigError, match="no run.json there"):
        check_sft_source(run())
    saved(sft=SFTConfig(steps=5), seed=1)
    with pytest.raises(RunConfigError) as e:
        check_sft_source(run())
    assert (
        f"--sft_from={src}: that run's post-SFT parameters come from other settings (seed: 1 there, 0 here; "
        "sft.steps: 5 there, 4 here)" in str(e.value)
    )
    saved(sft=SFTConfig(steps=4))
    with pytest.raises(
        RunConfigError, match=r"no step-0 \(post-SFT\) checkpoint there \(complete steps: \[\]\)"
    ):
        check_sft_source(run())
    (src / "checkpoints" / "0").mkdir(parents=True)
    check_sft_source(run())
    # what GRPO alone reads may differ (steps, RL levels, the chunked head); what SFT reads may not
    check_sft_source(run(steps=7, tasks=TaskConfig(rl_levels=(1,)), model=ModelConfig(logp_chunk=8)))
    with pytest.raises(RunConfigError, match="model.d_model: 128 there, 64 here"):
        check_sft_source(run(model=ModelConfig(d_model=64)))
    with pytest.raises(RunConfigError, match="tasks.sft_levels"):
        check_sft_source(run(tasks=TaskConfig(sft_levels=(1,))))


def _warm_start_as_the_main_job_leaves_it(point: sweep.Point, cfg_json: dict):
    """The files of the warm-start point's finished run (--steps=0), made in this process with the main job's
    own functions (model init and SFT as loop.warm_start does them, the step-0 checkpoint, run.json with the
    point's argv, results.json); returns the post-SFT parameters."""
    import jax

    from grpo_jax import rng
    from grpo_jax.policies import transformer as tfm
    from grpo_jax.train import build, export, loop, resume

    cfg = export.config_from_saved(cfg_json)
    r = build.build(cfg, None, print_fn=lambda _: None)
    streams = rng.streams(cfg.seed)
    params = loop.sft_warm_start(
        r, tfm.init_params(r.model, rng.derive(streams["init"], "model")), streams["sft"]
    )
    resume.save(r, build.placed_state(r, params), 0)
    r.close()
    wd = Path(point.workdir)
    (wd / "run.json").write_text(json.dumps({"config": cfg.to_json(), "argv": ["codegen.py", *point.args]}))
    evals = {"pass@1": 0.0, "n_problems": 4.0}
    res = {"config": cfg.to_json(), "steps": 0, "sft": evals, "grpo": evals, **r.results}
    (wd / "results.json").write_text(json.dumps(res))
    return jax.device_get(params)


def test_real_sweep_on_a_shared_warm_start(tmp_path, monkeypatch):
    """The one real main-job run of this module: experiments.codegen on tiny_test.flags (2 GRPO steps) as
    the arm of a sweep whose warm start is already finished (made here by the main job's own SFT code): the
    sweep checks the arm's flags with the real --dry_run, skips the warm start, runs the arm with --sft_from,
    and the arm's step-0 checkpoint holds exactly the warm start's post-SFT parameters; a second sweep
    runs nothing. (By hand, with three real runs: an arm on a warm start ends with the same final-parameter
    SHA-256 as the same arm with its own SFT: WORKSPACE.md §5.)"""
    import numpy as np

    from grpo_jax.train.export import open_checkpoint

    monkeypatch.chdir(ROOT)
    grid = {
        "seeds": [0],
        "flags": ["--steps=2", "--eval_samples=0", "--eval_ks=", "--sample_log_every=0"],
        "warm_starts": {"tiny": {"flagfile": TINY}},
        "arms": {"shared": {"flagfile": TINY, "warm_start": "tiny"}},
    }
    runs = tmp_path / "runs"
    pts = sweep.points(grid, str(runs))
    configs = sweep.resolve_configs(pts, sys.executable, "experiments.codegen")
    sweep.check_warm_starts(grid, configs)
    sft_params = _warm_start_as_the_main_job_leaves_it(pts[0], configs[("warm", "tiny")])
    s, rc = _sweep(grid, runs, "experiments.codegen")
    assert rc == 0, (runs / "sweep.log").read_text() + (runs / "shared" / "s0" / "stderr.log").read_text()
    assert s.info["_warm/tiny/s0"]["skipped"] and not s.info["shared/s0"]["skipped"]
    arm = runs / "shared" / "s0"
    res = json.loads((arm / "results.json").read_text())
    assert res["sft_from"] == str(runs / "_warm" / "tiny" / "s0") and res["steps"] == 2
    out = (arm / "stdout.log").read_text()
    assert "SFT not repeated" in out and "sft step" not in out
    r, state = open_checkpoint(str(arm), step=0, print_fn=lambda _: None)
    r.rollout.close()
    r.ckpt.close()
    got = dict(jax_leaves(state.train.params))
    want = dict(jax_leaves(sft_params))
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_array_equal(got[k], want[k], err_msg=k)  # bit for bit
    s2, rc2 = _sweep(grid, runs, "experiments.codegen")
    assert rc2 == 0 and all(s2.info[p.id]["skipped"] for p in s2.points)


def jax_leaves(tree) -> list[tuple[str, object]]:
    import jax
    import numpy as np

    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    return [(jax.tree_util.keystr(path), np.asarray(jax.device_get(x))) for path, x in flat]
