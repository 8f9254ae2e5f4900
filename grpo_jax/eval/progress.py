"""Progress lines of a long evaluation: per sampler batch and per graded chunk, with the elapsed time and an
ETA."""

from __future__ import annotations

import sys
import time


class EvalProgress:
    """Progress lines of an evaluation with elapsed time and an ETA: per sampler batch (`sampler` wraps a
    pipeline.SampleFn; one line at the first batch, at each tenth and at the last) and per graded chunk
    (`start` / `tick`, `ChunkedExecutor`). Also sums the seconds spent sampling and grading. `write`: where
    the lines go (default stderr); `quiet_s`: no line before that many seconds since the first batch began
    (the main job's evaluations: a short one prints nothing)."""

    def __init__(self, n_batches: int, write=None, quiet_s: float = 0.0):
        self.batches = n_batches  # the sampler calls per pass (pipeline.plan_batches)
        self.write = write or (lambda line: print(line, file=sys.stderr, flush=True))
        self.quiet_s = quiet_s
        self.t_first: float | None = None
        self.what = "greedy"
        self.phase: tuple[str, str] | None = None
        self.seconds = {"sampling": 0.0, "grading": 0.0}

    def start(self, phase: str, total: int, unit: str) -> None:
        self.phase = (phase, self.what)
        self.total, self.unit, self.done, self.t0 = total, unit, 0, time.perf_counter()
        self.t_first = self.t0 if self.t_first is None else self.t_first
        self.every = max(1, total // 10)

    def tick(self, done: int, seconds: float, kind: str) -> None:
        if self.phase is None or self.t_first is None:
            raise RuntimeError("EvalProgress.tick before start")
        prev, self.done = self.done, done
        self.seconds[kind] += seconds
        now = time.perf_counter()
        if now - self.t_first < self.quiet_s:
            return
        if done == self.total or done == 1 or done // self.every != prev // self.every:
            el = now - self.t0
            eta = el / done * (self.total - done) if done else float("nan")
            self.write(
                f"[{self.phase[0]} {self.phase[1]}] {done}/{self.total} {self.unit}, {el:.1f} s, "
                f"ETA {eta:.0f} s"
            )

    def sampler(self, fn):
        """fn (pipeline.SampleFn) with a progress line per batch."""

        def sample(prompt, pmask, n, greedy):
            what = "greedy" if greedy else f"{n} samples/task"
            if self.phase != ("sampling", what):
                self.what = what
                self.start("sampling", self.batches, "batches")
            t = time.perf_counter()
            out = fn(prompt, pmask, n, greedy)
            self.tick(self.done + 1, time.perf_counter() - t, "sampling")
            return out

        return sample


class ChunkedExecutor:
    """An executor's `run` in chunks, with a progress line per chunk (the verdicts are the same: one job never
    depends on another); a deadline holds for the whole call."""

    def __init__(self, executor, progress: EvalProgress):
        self.executor, self.progress = executor, progress

    @property
    def num_workers(self) -> int:
        return self.executor.num_workers

    def run(self, jobs, deadline_s=None):
        jobs = list(jobs)
        chunk = max(8 * self.executor.num_workers, -(-len(jobs) // 10))
        self.progress.start("grading", len(jobs), "programs")
        end = None if deadline_s is None else time.monotonic() + deadline_s
        out = []
        for i in range(0, len(jobs), chunk):
            left = None if end is None else max(0.0, end - time.monotonic())
            t = time.perf_counter()
            out += self.executor.run(jobs[i : i + chunk], deadline_s=left)
            self.progress.tick(len(out), time.perf_counter() - t, "grading")
        return out
