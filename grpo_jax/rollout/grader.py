"""How completions are graded: the third of the rollout's three parts (ProblemSource, Sampler, Grader).

    grades = grader.grade(problems, tokens, mask)      # [B] problems, [B, G, T] host token ids and mask

decodes each completion with the tokenizer (cut at its end-of-generation ids), runs it in the sandbox
(grpo_jax.sandbox, through grpo_jax.codegen.pipeline.score_completions: every program in an isolated worker,
graded in the parent from plain data) and returns the verdicts, the all-pass rewards [B, G] and the per-test
results [B, G, M]. In a multi-process run each process grades only the rows it owns
(train/sharding.owned_rows) in its own sandbox, and the verdicts are exchanged through the coordination
service, so every process returns the same grades for every row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from grpo_jax.codegen import pipeline
from grpo_jax.codegen.rewards import per_test_rewards
from grpo_jax.config import SandboxConfig
from grpo_jax.problem import Problem
from grpo_jax.runtime.distributed import Context
from grpo_jax.sandbox.executor import Executor
from grpo_jax.tokenization import Tokenizer, decode_completions


class GradeLimits(NamedTuple):
    """What a Grader takes of the sandbox settings, for a caller without a run config (experiments.evaluate):
    the deadline of one batch of programs (None: none) and whether a program's tests stop at its first
    failure (SandboxConfig has both)."""

    deadline_s: float | None = None
    stop_on_failure: bool = False


@dataclasses.dataclass
class Grades:
    """The graded completions of B problems x G samples."""

    texts: list[str]  # [B * G] the decoded replies, problem-major
    verdicts: list  # [B * G] sandbox verdicts
    rewards: np.ndarray  # [B, G] all-pass rewards
    tests: np.ndarray  # [B, G, M] 1 where test m passed
    test_mask: np.ndarray  # [B, M] 1 for the problem's real tests
    seconds: float


def num_tests(problems: Sequence[Problem]) -> int:
    """M, the per-test axis of a batch of these problems: the most tests of any (at least 1)."""
    return max(1, max(len(p.tests) for p in problems))


class Grader:
    """See the module docstring. `num_tests` = M, the per-test axis of the batch (the most tests of any
    training problem); `owned` [B]: the rows this process grades (None: all)."""

    def __init__(
        self,
        executor: Executor,
        sandbox: SandboxConfig | GradeLimits,
        tok: Tokenizer,
        fmt: pipeline.PromptFormat,
        *,
        group: int,
        num_tests: int,
        ctx: Context | None = None,
        owned: np.ndarray | None = None,
    ):
        self.executor, self.deadline_s, self.tok, self.fmt = executor, sandbox.deadline_s, tok, fmt
        self.stop = bool(sandbox.stop_on_failure)  # --sandbox_stop_on_failure
        self.G, self.num_tests = group, num_tests
        self.ctx, self.owned = ctx or Context(), owned

    def grade(self, problems: Sequence[Problem], tokens: np.ndarray, mask: np.ndarray) -> Grades:
        t0 = time.perf_counter()
        texts = decode_completions(self.tok, tokens, mask)
        verdicts, rewards = self.score(problems, texts)
        return self.assemble(problems, texts, verdicts, rewards, seconds=time.perf_counter() - t0)

    def assemble(self, problems: Sequence[Problem], texts, verdicts, rewards, seconds: float = 0.0) -> Grades:
        """The Grades of B x G graded rows (texts and verdicts [B * G], rewards [B, G]): adds the per-test
        results [B, G, M] of the verdicts."""
        B, G = len(problems), self.G
        n_tests = [len(p.tests) for p in problems for _ in range(G)]
        tv, tm = per_test_rewards(verdicts, self.num_tests, n_tests)
        return Grades(
            texts=list(texts),
            verdicts=list(verdicts),
            rewards=np.asarray(rewards),
            tests=tv.reshape(B, G, self.num_tests),
            test_mask=tm.reshape(B, G, self.num_tests)[:, 0],
            seconds=seconds,
        )

    def score(self, problems: Sequence[Problem], texts: Sequence[str]) -> tuple[list, np.ndarray]:
        """(verdicts [B * G], rewards [B, G]) of the texts; with several processes this process grades its own
        rows and the grades are exchanged, so every process holds every row's."""
        G, dl, kw = self.G, self.deadline_s, dict(stop_on_failure=self.stop)
        if not self.ctx.multi:
            return pipeline.score_completions(self.executor, problems, texts, G, dl, self.fmt, **kw)
        owned = np.ones(len(problems), bool) if self.owned is None else self.owned
        mine = np.flatnonzero(owned)
        my_texts = [texts[b * G + g] for b in mine.tolist() for g in range(G)]
        v, r = pipeline.score_completions(
            self.executor, [problems[b] for b in mine.tolist()], my_texts, G, dl, self.fmt, **kw
        )
        verdicts: list = [None] * (len(problems) * G)
        rewards = np.zeros((len(problems), G), r.dtype)
        for rows, vs, rs in self.ctx.allgather_objects("grades", (mine, v, r)):
            for i, b in enumerate(rows):
                verdicts[b * G : (b + 1) * G] = vs[i * G : (i + 1) * G]
                rewards[b] = rs[i]
        missing = [b for b in range(len(problems)) if verdicts[b * G] is None]
        if missing:
            raise RuntimeError(f"grader: no process graded rows {missing} (the row owners do not cover B)")
        return verdicts, rewards
