"""How completions are graded: the third of the rollout's three parts (ProblemSource, Sampler, Grader).

    grades = grader.grade(problems, tokens, mask)      # [B] problems, [B, G, T] host token ids and mask

decodes each completion with the tokenizer (cut at its end-of-generation ids), runs it in the sandbox
(grpo_jax.sandbox, through grpo_jax.codegen.pipeline.score_completions: every program in an isolated worker,
graded in the parent from plain data) and returns the verdicts, the all-pass rewards [B, G] and the per-test
results [B, G, M]. With several reward functions (--rewards, grpo_jax.rewards) it also computes each one on
every graded sample (parts [B, G, F]) and their combination, the training reward (`Grades.train_rewards`,
grpo_jax.core.advantages.multi_reward_advantages); with --rewards=tests (the default) the training reward is
the all-pass reward itself. In a multi-process run each process grades only the rows it owns
(train/sharding.owned_rows) in its own sandbox, and the verdicts are exchanged through the coordination
service, so every process returns the same grades for every row.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from grpo_jax.codegen import pipeline
from grpo_jax.codegen.rewards import per_test_rewards
from grpo_jax.config import SandboxConfig
from grpo_jax.core.advantages import multi_reward_advantages
from grpo_jax.problem import Problem
from grpo_jax.rewards import RewardSet
from grpo_jax.rewards.metrics import reward_metrics
from grpo_jax.rewards.types import Grade, RewardProblem, Sample
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
    parts: np.ndarray | None = None  # [B, G, F] each reward function's value (None: --rewards=tests)
    combined: np.ndarray | None = None  # [B, G] the training reward of several functions

    @property
    def train_rewards(self) -> np.ndarray:
        """[B, G] what the update's advantages are computed from: the combination of --rewards, or the
        all-pass reward alone."""
        return self.rewards if self.combined is None else self.combined


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
        rewards: RewardSet | None = None,
    ):
        self.executor, self.deadline_s, self.tok, self.fmt = executor, sandbox.deadline_s, tok, fmt
        self.stop = bool(sandbox.stop_on_failure)  # --sandbox_stop_on_failure
        self.G, self.num_tests = group, num_tests
        self.ctx, self.owned = ctx or Context(), owned
        self.rewards = None if rewards is None or rewards.trivial else rewards  # None: the all-pass reward

    def grade(
        self, problems: Sequence[Problem], tokens: np.ndarray, mask: np.ndarray, *, first_turn: bool = False
    ) -> Grades:
        """`first_turn`: the first turn of multi-turn trajectories, whose rewards are computed on the
        trajectories' last replies when they end (MultiTurn): no reward function runs here."""
        t0 = time.perf_counter()
        texts = decode_completions(self.tok, tokens, mask)
        lengths = None if first_turn else np.asarray(mask).reshape(len(texts), -1).sum(-1)
        verdicts, rewards, parts = self.score_all(problems, texts, lengths)
        seconds = time.perf_counter() - t0
        return self.assemble(
            problems, texts, verdicts, rewards, seconds, parts=parts, skip_rewards=first_turn
        )

    def assemble(
        self,
        problems: Sequence[Problem],
        texts,
        verdicts,
        rewards,
        seconds: float = 0.0,
        *,
        parts: np.ndarray | None = None,
        replies: Sequence[str] | None = None,
        lengths: np.ndarray | None = None,
        skip_rewards: bool = False,
    ) -> Grades:
        """The Grades of B x G graded rows (texts and verdicts [B * G], rewards [B, G]): adds the per-test
        results [B, G, M] of the verdicts and, with several reward functions, their values `parts` [B, G, F]
        (computed here from `replies` — the texts when None — and the model's token `lengths` [B * G] when
        not given) and the training reward (none of them with `skip_rewards`)."""
        B, G = len(problems), self.G
        n_tests = [len(p.tests) for p in problems for _ in range(G)]
        tv, tm = per_test_rewards(verdicts, self.num_tests, n_tests)
        combined = None
        if self.rewards is not None and not skip_rewards:
            if parts is None:
                assert lengths is not None, "assemble: the reward functions need the replies' token lengths"
                rows = np.arange(B)
                parts = self.reward_parts(problems, rows, replies or texts, verdicts, rewards, lengths)
            combined = combine(parts, self.rewards)
        return Grades(
            texts=list(texts),
            verdicts=list(verdicts),
            rewards=np.asarray(rewards),
            tests=tv.reshape(B, G, self.num_tests),
            test_mask=tm.reshape(B, G, self.num_tests)[:, 0],
            seconds=seconds,
            parts=parts,
            combined=combined,
        )

    def reward_parts(self, problems, rows, replies, verdicts, rewards, lengths) -> np.ndarray:
        """[len(rows), G, F] the reward functions' values on problems[rows] (replies, verdicts, lengths: those
        rows' B' x G samples, problem-major; rewards [B', G] the all-pass / trajectory reward)."""
        assert self.rewards is not None
        G, chat = self.G, self.fmt.kind == "chat"
        samples = []
        for i, b in enumerate(rows):
            p = problems[b]
            view = RewardProblem.of(p)
            for g in range(G):
                j = i * G + g
                program = p.program_for(pipeline.completion_for(p, replies[j], self.fmt))
                grade = Grade.of(verdicts[j], len(p.tests))
                samples.append(
                    Sample(view, replies[j], program, grade, float(rewards[i][g]), int(lengths[j]), chat)
                )
        return self.rewards.compute(samples).reshape(len(rows), G, -1)

    def score(self, problems: Sequence[Problem], texts: Sequence[str]) -> tuple[list, np.ndarray]:
        """(verdicts [B * G], all-pass rewards [B, G]) of the texts (score_all, no reward functions)."""
        verdicts, rewards, _ = self.score_all(problems, texts)
        return verdicts, rewards

    def score_all(
        self, problems: Sequence[Problem], texts: Sequence[str], lengths: np.ndarray | None = None
    ) -> tuple[list, np.ndarray, np.ndarray | None]:
        """(verdicts [B * G], rewards [B, G], reward parts [B, G, F] or None) of the texts (`lengths` [B * G]:
        the model's tokens, for the reward functions); with several processes this process grades its own rows
        and computes their rewards, and the grades are exchanged, so every process holds every row's."""
        G, dl, kw = self.G, self.deadline_s, dict(stop_on_failure=self.stop)
        B = len(problems)
        if not self.ctx.multi:
            v, r = pipeline.score_completions(self.executor, problems, texts, G, dl, self.fmt, **kw)
            parts = None
            if self.rewards is not None and lengths is not None:
                parts = self.reward_parts(problems, np.arange(B), texts, v, r, lengths)
            return v, r, parts
        owned = np.ones(B, bool) if self.owned is None else self.owned
        mine = np.flatnonzero(owned)
        my_texts = [texts[b * G + g] for b in mine.tolist() for g in range(G)]
        v, r = pipeline.score_completions(
            self.executor, [problems[b] for b in mine.tolist()], my_texts, G, dl, self.fmt, **kw
        )
        my_parts = None
        if self.rewards is not None and lengths is not None:
            my_lengths = np.asarray([lengths[b * G + g] for b in mine.tolist() for g in range(G)])
            my_parts = self.reward_parts(problems, mine, my_texts, v, r, my_lengths)
        verdicts: list = [None] * (B * G)
        rewards = np.zeros((B, G), r.dtype)
        parts = None if my_parts is None else np.zeros((B, G, my_parts.shape[-1]), np.float32)
        for rows, vs, rs, ps in self.ctx.allgather_objects("grades", (mine, v, r, my_parts)):
            for i, b in enumerate(rows):
                verdicts[b * G : (b + 1) * G] = vs[i * G : (i + 1) * G]
                rewards[b] = rs[i]
                if parts is not None:
                    parts[b] = ps[i]
        missing = [b for b in range(B) if verdicts[b * G] is None]
        if missing:
            raise RuntimeError(f"grader: no process graded rows {missing} (the row owners do not cover B)")
        return verdicts, rewards, parts


def combine(parts: np.ndarray, rewards: RewardSet) -> np.ndarray:
    """[B, G] float32 training reward of parts [B, G, F] (multi_reward_advantages' combined reward: Σ_k w_k
    r_k, or GDPO's Σ_k w_k r̃_k; the update's advantage estimator then normalises it)."""
    _, combined = multi_reward_advantages(
        jnp.asarray(parts), jnp.asarray(rewards.weights), aggregation=rewards.aggregation, eps=rewards.eps
    )
    return np.asarray(combined, np.float32)


def parts_metrics(parts: np.ndarray, rewards: RewardSet) -> dict[str, float]:
    """Each reward's mean, std and share of the advantage over a batch's parts [B, G, F]."""
    return reward_metrics(parts, rewards.weights, rewards.names, rewards.aggregation, rewards.eps)
