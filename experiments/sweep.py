"""A sweep: every arm of a grid over every seed, one workdir per point, resumable, N runs at a time.

    python -m experiments.sweep --grid=experiments/sweeps/seed_claims.json --runs_dir=runs/seed_claims
    python -m experiments.sweep --grid=G.json --runs_dir=DIR --dry_run      # the plan and each point's state
    python -m experiments.sweep --grid=G.json --runs_dir=DIR --parallel=2
    python -m experiments.report DIR                                        # tables and plots of the runs

The grid (JSON; paths relative to the directory the sweep runs in, normally the repository root):

    {"description": "...",                          optional
     "seeds": [0, 1, 2],                            required, distinct integers >= 0
     "flags": ["--steps=40"],                       optional: given to every point (after the arm's flagfile)
     "warm_starts": {"qs": {"flagfile": "experiments/flagfiles/quickstart.flags", "flags": []}},   optional
     "arms": {"baseline": {"flagfile": "experiments/flagfiles/quickstart.flags", "warm_start": "qs"},
              "replay": {"flagfile": "experiments/flagfiles/ablate_replay.flags", "warm_start": "qs",
                         "flags": ["--replay_alpha=0.5"], "description": "..."}}}

A point is one arm at one seed: `python -m experiments.codegen --flagfile=F... <grid flags> <arm flags>
--seed=S --workdir=DIR/<arm>/s<S>` (the last setting of a field wins). A warm start is one SFT-only run per
seed (the same flags, `--steps=0`, in DIR/_warm/<name>/s<S>); each arm naming it gets `--sft_from=` that
workdir, so the main job takes its post-SFT parameters from there instead of repeating SFT (it checks that
the seed, model, SFT tasks and SFT settings are the same: grpo_jax.config.SFT_INPUTS) and, where the arm
evaluates as the warm start did, its post-SFT evaluation too (grpo_jax.train.heldout). Before anything runs,
every arm's and warm start's command is resolved by the main job's `--dry_run` (a refused flag is reported
with the arm's name) and each arm's SFT inputs are compared with its warm start's.

Resume: a point is finished when its workdir holds results.json from a run of the same command (run.json's
argv, and the same configuration in both files); finished points are skipped. Any other point is run with
its command; the main job resumes from the workdir's latest checkpoint by itself. Stdout and stderr of each
point go to stdout.log / stderr.log in its workdir (appended, one header per attempt); DIR/manifest.json
holds the grid, every point's exact command and its state; DIR/sweep.log the progress lines. A SIGINT /
SIGTERM to the sweep is passed on to the running points (they checkpoint and stop) and the sweep stops.
Exit status 0 when every point is finished, 1 when some failed (or could not start because their warm start
failed), 2 for a bad grid, 130 when interrupted.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time

from absl import app, flags

from grpo_jax import atomic

FLAGS = flags.FLAGS


def define_flags() -> None:
    """The command line; defined when run as a program only, so that importing this module (the tests)
    defines no absl flag that could collide with another experiment's in the same process."""
    flags.DEFINE_string("grid", None, "The sweep's grid (JSON: seeds, arms, optional flags and warm starts).")
    flags.DEFINE_string(
        "runs_dir", None, "Directory of the sweep: <arm>/s<seed>/ workdirs and manifest.json."
    )
    flags.DEFINE_integer("parallel", 1, "Points run at the same time (this 2-core machine: 1).")
    flags.DEFINE_bool("dry_run", False, "Check the grid, print every point's command and state, run nothing.")
    flags.DEFINE_bool(
        "check", True, "Resolve every arm's flags with the main job's --dry_run before running."
    )
    flags.DEFINE_string("module", "experiments.codegen", "The main job's module (python -m MODULE).")
    flags.DEFINE_string("python", sys.executable, "The Python interpreter that runs the points.")


GRID_KEYS = ("description", "seeds", "flags", "warm_starts", "arms")
ARM_KEYS = ("description", "flagfile", "flags", "warm_start")
WARM_KEYS = ("description", "flagfile", "flags")
RESERVED = ("workdir", "seed", "sft_from", "resume", "noresume")  # the sweep sets these per point
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
WARM_DIR = "_warm"


class GridError(ValueError):
    """The grid is not valid: the message names the key, the value and what is valid."""


@dataclasses.dataclass(frozen=True)
class Point:
    id: str  # "<arm>/s<seed>" or "_warm/<name>/s<seed>"
    kind: str  # "run" | "warm"
    arm: str  # the arm's (or the warm start's) name
    seed: int
    workdir: str
    args: tuple[str, ...]  # the main job's arguments (after python -m MODULE)
    needs: str | None = None  # the id of the warm-start point it takes its post-SFT parameters from


# ------------------------------------------------------------------------------------------------------------
# the grid
# ------------------------------------------------------------------------------------------------------------


def load_grid(path: str) -> dict:
    """The grid of `path`, checked (GridError naming what is wrong and what is valid)."""
    try:
        with open(path, encoding="utf-8") as f:
            grid = json.load(f)
    except OSError as e:
        raise GridError(f"cannot read the grid: {e.strerror}") from None
    except ValueError as e:
        raise GridError(f"not valid JSON: {e}") from None
    check_grid(grid)
    return grid


def _keys(obj, where: str, valid: tuple[str, ...]) -> None:
    if not isinstance(obj, dict):
        raise GridError(f"{where}: must be a JSON object with keys from {', '.join(valid)}")
    for k in obj:
        if k not in valid:
            raise GridError(f"{where}: unknown key {k!r} (valid: {', '.join(valid)})")


def _flagfiles(obj: dict, where: str) -> list[str]:
    ff = obj.get("flagfile", [])
    ff = [ff] if isinstance(ff, str) else ff
    if not isinstance(ff, list) or not all(isinstance(f, str) and f for f in ff):
        raise GridError(f"{where}.flagfile: must be a path or a list of paths, got {ff!r}")
    for f in ff:
        if not os.path.isfile(f):
            raise GridError(f"{where}.flagfile: no file {f!r} (relative to {os.getcwd()})")
    return ff


def _flag_list(obj: dict, where: str) -> list[str]:
    fl = obj.get("flags", [])
    if not isinstance(fl, list) or not all(isinstance(f, str) for f in fl):
        raise GridError(f'{where}.flags: must be a list of strings like "--steps=40", got {fl!r}')
    for f in fl:
        if not f.startswith("--") or len(f) < 3:
            raise GridError(
                f'{where}.flags: {f!r} is not a flag (write "--name=value", "--name" or "--noname")'
            )
        name = f[2:].split("=", 1)[0]
        if name in RESERVED:
            raise GridError(
                f"{where}.flags: {f!r}: the sweep sets --{name} itself for every point "
                f"(reserved: {', '.join('--' + r for r in RESERVED)})"
            )
        if name == "flagfile" and not os.path.isfile(f.split("=", 1)[-1]):
            raise GridError(f"{where}.flags: {f!r}: no such file (relative to {os.getcwd()})")
    return fl


def check_grid(grid) -> None:
    _keys(grid, "grid", GRID_KEYS)
    seeds = grid.get("seeds")
    if not isinstance(seeds, list) or not seeds:
        raise GridError(f"grid.seeds: must be a non-empty list of integers >= 0, got {seeds!r}")
    if not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds):
        raise GridError(f"grid.seeds: must be integers >= 0, got {seeds!r}")
    if len(set(seeds)) != len(seeds):
        raise GridError(f"grid.seeds: {seeds!r} repeats a seed (each point is one arm at one seed)")
    _flag_list(grid, "grid")
    warm = grid.get("warm_starts", {})
    if not isinstance(warm, dict):
        raise GridError("grid.warm_starts: must be an object {name: {flagfile, flags}}")
    for name, w in warm.items():
        where = f"grid.warm_starts.{name}"
        if not NAME.fullmatch(name):
            raise GridError(f"{where}: the name must match {NAME.pattern}")
        _keys(w, where, WARM_KEYS)
        if not _flagfiles(w, where) + _flag_list(w, where):
            raise GridError(f"{where}: give a flagfile and/or flags (the SFT run's settings)")
    arms = grid.get("arms")
    if not isinstance(arms, dict) or not arms:
        raise GridError("grid.arms: must be a non-empty object {name: {flagfile, flags, warm_start}}")
    for name, a in arms.items():
        where = f"grid.arms.{name}"
        if not NAME.fullmatch(name):
            raise GridError(
                f"{where}: the name must match {NAME.pattern} (names starting with _ are the sweep's)"
            )
        _keys(a, where, ARM_KEYS)
        if not _flagfiles(a, where) + _flag_list(a, where):
            raise GridError(f"{where}: give a flagfile and/or flags")
        ws = a.get("warm_start")
        if ws is not None and ws not in warm:
            valid = ", ".join(warm) if warm else "none: the grid has no warm_starts"
            raise GridError(f"{where}.warm_start: {ws!r} is not a warm start of the grid (valid: {valid})")


def points(grid: dict, runs_dir: str) -> list[Point]:
    """Every point of the grid in run order: seed by seed, each seed's warm starts before its arms."""
    common = list(grid.get("flags", []))
    warm, arms = grid.get("warm_starts", {}), grid["arms"]
    used = [w for w in warm if any(a.get("warm_start") == w for a in arms.values())]
    out = []
    for s in grid["seeds"]:
        for w in used:
            wd = os.path.join(runs_dir, WARM_DIR, w, f"s{s}")
            args = _base(warm[w], common) + ["--steps=0", f"--seed={s}", f"--workdir={wd}"]
            out.append(Point(f"{WARM_DIR}/{w}/s{s}", "warm", w, s, wd, tuple(args)))
        for name, a in arms.items():
            wd = os.path.join(runs_dir, name, f"s{s}")
            args = _base(a, common) + [f"--seed={s}", f"--workdir={wd}"]
            needs = None
            if a.get("warm_start"):
                needs = f"{WARM_DIR}/{a['warm_start']}/s{s}"
                args.append(f"--sft_from={os.path.join(runs_dir, WARM_DIR, a['warm_start'], f's{s}')}")
            out.append(Point(f"{name}/s{s}", "run", name, s, wd, tuple(args), needs))
    return out


def _base(spec: dict, common: list[str]) -> list[str]:
    ff = spec.get("flagfile", [])
    return [f"--flagfile={f}" for f in ([ff] if isinstance(ff, str) else ff)] + common + spec.get("flags", [])


# ------------------------------------------------------------------------------------------------------------
# a point's state on disk
# ------------------------------------------------------------------------------------------------------------


def _read_json(path: str):
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def finished(p: Point) -> bool:
    """The workdir holds the results of a finished run of exactly this command: results.json (written by the
    main job's last phase only) with the configuration of run.json, whose argv is this point's."""
    res = _read_json(os.path.join(p.workdir, "results.json"))
    run = _read_json(os.path.join(p.workdir, "run.json"))
    if not isinstance(res, dict) or not isinstance(run, dict) or "grpo" not in res:
        return False
    cfg = res.get("config")
    return (
        list(run.get("argv", [])[1:]) == list(p.args)
        and cfg == run.get("config")
        and isinstance(cfg, dict)
        and res.get("steps") == cfg.get("steps")
    )


def describe(p: Point) -> str:
    """done | resume (checkpoint at step N) | rerun (holds results of another command) | new."""
    if finished(p):
        return "done"
    ckpts = os.path.join(p.workdir, "checkpoints")
    steps = sorted(int(d) for d in os.listdir(ckpts) if d.isdigit()) if os.path.isdir(ckpts) else []
    if steps:
        return f"resume (checkpoint at step {steps[-1]})"
    if os.path.exists(os.path.join(p.workdir, "results.json")):
        return "rerun (its results are of another command)"
    return "new"


# ------------------------------------------------------------------------------------------------------------
# checks through the main job's --dry_run
# ------------------------------------------------------------------------------------------------------------


def resolve_configs(pts: list[Point], python: str, module: str) -> dict[tuple[str, str], dict]:
    """{(kind, arm or warm-start name): resolved config} of each one's first point, by `MODULE ... --dry_run`
    (all at once); GridError with the main job's own message for flags it refuses."""
    first: dict[tuple[str, str], Point] = {}
    for p in pts:
        first.setdefault((p.kind, p.arm), p)
    procs = {
        key: subprocess.Popen(
            [python, "-m", module, *p.args, "--dry_run"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for key, p in first.items()
    }
    configs, errors = {}, []
    for (kind, name), proc in procs.items():
        out, err = proc.communicate()
        what = f"warm start {name!r}" if kind == "warm" else f"arm {name!r}"
        if proc.returncode != 0:
            lines = [x for x in err.strip().splitlines() if x.strip()] or [f"exit status {proc.returncode}"]
            errors.append(f"{what}: {module} refused its flags: {lines[-1]}")
            continue
        try:
            configs[(kind, name)] = json.loads(out)
        except ValueError:
            errors.append(f"{what}: {module} --dry_run did not print a JSON configuration")
    if errors:
        raise GridError("; ".join(errors))
    return configs


def check_warm_starts(grid: dict, configs: dict) -> None:
    """Every arm's SFT inputs equal its warm start's (else GridError naming the fields)."""
    from grpo_jax.config import flat_dict, is_sft_input

    for name, a in grid["arms"].items():
        w = a.get("warm_start")
        if not w:
            continue
        mine, theirs = flat_dict(configs[("run", name)]), flat_dict(configs[("warm", w)])
        diff = [
            k for k in sorted(set(mine) | set(theirs)) if is_sft_input(k) and mine.get(k) != theirs.get(k)
        ]
        if diff:
            shown = "; ".join(f"{k}: {theirs.get(k)!r} there, {mine.get(k)!r} here" for k in diff[:6])
            raise GridError(
                f"grid.arms.{name}.warm_start: {w!r} has other SFT settings ({shown}): give the arm a warm "
                "start with its own settings, or none (it then runs its own SFT)"
            )


# ------------------------------------------------------------------------------------------------------------
# running
# ------------------------------------------------------------------------------------------------------------


def write_json_atomic(path: str, obj) -> None:
    atomic.write_json(path, obj, indent=1)


class Sweep:
    """Runs the points (dependencies first, at most `parallel` at once) and keeps the manifest."""

    def __init__(
        self, grid: dict, grid_path: str, runs_dir: str, pts: list[Point], *, python: str, module: str
    ):
        self.grid, self.grid_path, self.runs_dir, self.points = grid, grid_path, runs_dir, pts
        self.python, self.module = python, module
        self.state = {p.id: "pending" for p in pts}
        self.info: dict[str, dict] = {p.id: {} for p in pts}
        self.stop_signal: int | None = None

    def command(self, p: Point) -> list[str]:
        return [self.python, "-m", self.module, *p.args]

    # -- output ----------------------------------------------------------------------------------------------
    def log(self, line: str) -> None:
        print(line, flush=True)
        with open(os.path.join(self.runs_dir, "sweep.log"), "a", encoding="utf-8") as f:
            f.write(time.strftime("%Y-%m-%d %H:%M:%S ") + line + "\n")

    def write_manifest(self) -> None:
        seeds = self.grid["seeds"]
        manifest = {
            "grid": self.grid_path,
            "grid_content": self.grid,
            "cwd": os.getcwd(),
            "module": self.module,
            "arms": list(self.grid["arms"]),
            "seeds": seeds,
            "points": [
                {
                    "id": p.id,
                    "kind": p.kind,
                    "arm": p.arm,
                    "seed": p.seed,
                    "workdir": p.workdir,
                    "command": self.command(p),
                    "needs": p.needs,
                    "state": self.state[p.id],
                    **self.info[p.id],
                }
                for p in self.points
            ],
        }
        write_json_atomic(os.path.join(self.runs_dir, "manifest.json"), manifest)

    def _summary(self, p: Point) -> str:
        res = _read_json(os.path.join(p.workdir, "results.json")) or {}
        before, after = res.get("sft", {}).get("pass@1"), res.get("grpo", {}).get("pass@1")
        if p.kind == "warm" and before is not None:
            return f"held-out pass@1 after SFT {before:.3f}"
        if before is not None and after is not None:
            return f"held-out pass@1 {before:.3f} -> {after:.3f}"
        return ""

    # -- the run ---------------------------------------------------------------------------------------------
    def run(self, parallel: int, poll_s: float = 0.2) -> int:
        """Run every unfinished point; returns the exit status (0 all finished, 1 not, 130 stopped)."""
        os.makedirs(self.runs_dir, exist_ok=True)
        n = len(self.points)
        for p in self.points:
            if finished(p):
                self.state[p.id] = "done"
                self.info[p.id]["skipped"] = True
        todo = [p for p in self.points if self.state[p.id] != "done"]
        n_warm = sum(p.kind == "warm" for p in self.points)
        self.log(
            f"sweep {self.grid_path}: {n} points ({n_warm} warm starts) in "
            f"{self.runs_dir}; {n - len(todo)} already finished, {len(todo)} to run, {parallel} at a time"
        )
        self.write_manifest()
        running: dict[str, _Running] = {}
        durations: list[float] = []
        t_start, counter, width = time.perf_counter(), n - len(todo), len(str(n))
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            while (todo or running) and self.stop_signal is None:
                for p in list(todo):
                    dep = self.state[p.needs] if p.needs else "done"
                    if dep in ("failed", "blocked", "interrupted"):
                        todo.remove(p)
                        self.state[p.id] = "blocked"
                        self.log(f"[blocked] {p.id}: its warm start {p.needs} {dep}")
                        self.write_manifest()
                    elif dep == "done" and len(running) < parallel:
                        todo.remove(p)
                        counter += 1
                        running[p.id] = self._start(p, f"[{counter:>{width}}/{n}]")
                if not running:
                    break
                time.sleep(poll_s)
                for pid, r in list(running.items()):
                    rc = r.proc.poll()
                    if rc is None:
                        continue
                    del running[pid]
                    durations.append(time.perf_counter() - r.t0)
                    self._finish(r, rc)
                    left = len(todo) + len(running)
                    if left:
                        eta = sum(durations) / len(durations) * left / parallel
                        self.log(f"  {left} points left, about {eta / 60:.0f} min at {parallel} at a time")
            if self.stop_signal is not None:
                self._stop(running)
        finally:
            for s, h in previous.items():
                signal.signal(s, h)
            self.write_manifest()
        states = list(self.state.values())
        counts = {s: states.count(s) for s in ("done", "failed", "blocked", "interrupted", "pending")}
        self.log(
            f"sweep: {counts['done']}/{n} finished, {counts['failed']} failed, {counts['blocked']} blocked, "
            f"{counts['interrupted']} interrupted, {counts['pending']} not started "
            f"({(time.perf_counter() - t_start) / 60:.1f} min); manifest {self.runs_dir}/manifest.json"
        )
        for p in self.points:
            if self.state[p.id] == "failed":
                self.log(
                    f"  failed: {p.id} (exit status {self.info[p.id]['rc']}): see {p.workdir}/stderr.log"
                )
        if self.stop_signal is not None:
            return 130
        return 0 if counts["done"] == n else 1

    def _on_signal(self, signum, frame) -> None:
        self.stop_signal = signum

    def _start(self, p: Point, tag: str) -> _Running:
        os.makedirs(p.workdir, exist_ok=True)
        cmd = self.command(p)
        header = f"== sweep {time.strftime('%Y-%m-%dT%H:%M:%S')}: {' '.join(cmd)}\n"
        logs = []
        for name in ("stdout.log", "stderr.log"):
            f = open(os.path.join(p.workdir, name), "a", encoding="utf-8")  # closed in _finish
            f.write(header)
            f.flush()
            logs.append(f)
        self.log(f"{tag} start {p.id} ({describe(p)}; log {p.workdir}/stdout.log)")
        proc = subprocess.Popen(cmd, stdout=logs[0], stderr=logs[1], start_new_session=True)
        self.state[p.id] = "running"
        self.info[p.id] = {"started": time.strftime("%Y-%m-%dT%H:%M:%S"), "skipped": False}
        self.write_manifest()
        return _Running(proc, p, time.perf_counter(), tuple(logs), tag)

    def _finish(self, r: _Running, rc: int) -> None:
        for f in r.logs:
            f.close()
        p, seconds = r.point, time.perf_counter() - r.t0
        self.info[p.id].update(rc=rc, seconds=round(seconds, 1))
        if rc == 0 and finished(p):
            self.state[p.id] = "done"
            self.log(f"{r.tag} done {p.id} in {seconds:.0f} s  {self._summary(p)}")
        elif rc == 0 or self.stop_signal is not None:  # stopped by a signal: the next sweep resumes it
            self.state[p.id] = "interrupted"
            self.log(f"{r.tag} interrupted {p.id} after {seconds:.0f} s (rerun the sweep to resume it)")
        else:
            self.state[p.id] = "failed"
            last = _last_line(os.path.join(p.workdir, "stderr.log"))
            self.log(f"{r.tag} FAILED {p.id} (exit status {rc}) after {seconds:.0f} s: {last}")
        self.write_manifest()

    def _stop(self, running: dict[str, _Running]) -> None:
        name = signal.Signals(self.stop_signal).name
        self.log(f"sweep: {name}: stopping {len(running)} running point(s) (each checkpoints first)")
        for r in running.values():
            if r.proc.poll() is None:
                r.proc.send_signal(signal.SIGTERM)
        for r in running.values():
            try:
                rc = r.proc.wait(timeout=600)
            except subprocess.TimeoutExpired:
                r.proc.kill()
                rc = r.proc.wait()
            self._finish(r, rc)


@dataclasses.dataclass
class _Running:
    proc: subprocess.Popen
    point: Point
    t0: float
    logs: tuple
    tag: str


def _last_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [x.strip() for x in f if x.strip() and not x.startswith("== sweep ")]
    except OSError:
        return ""
    return lines[-1][:300] if lines else ""


def plan(sweep: Sweep) -> str:
    lines = []
    for p in sweep.points:
        needs = f"  (after {p.needs})" if p.needs else ""
        lines.append(f"{p.id:<32} {describe(p)}{needs}\n    {' '.join(sweep.command(p))}")
    return "\n".join(lines)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not FLAGS.grid or not FLAGS.runs_dir:
        _fail("--grid=GRID.json and --runs_dir=DIR are required")
    if FLAGS.parallel < 1:
        _fail(f"--parallel={FLAGS.parallel}: must be >= 1")
    try:
        grid = load_grid(FLAGS.grid)
        pts = points(grid, FLAGS.runs_dir)
        if FLAGS.check:
            check_warm_starts(grid, resolve_configs(pts, FLAGS.python, FLAGS.module))
    except GridError as e:
        _fail(f"--grid={FLAGS.grid}: {e}")
    sweep = Sweep(grid, FLAGS.grid, FLAGS.runs_dir, pts, python=FLAGS.python, module=FLAGS.module)
    if FLAGS.dry_run:
        print(plan(sweep))
        return
    sys.exit(sweep.run(FLAGS.parallel))


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


if __name__ == "__main__":
    define_flags()
    app.run(main)
