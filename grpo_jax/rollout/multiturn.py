"""Multi-turn trajectories (--max_turns > 1): the model writes a program, sees what it did on the VISIBLE
tests (grpo_jax.codegen.feedback), and writes it again, until a turn passes or max_turns are used.

    turns = MultiTurn(engine, grader, tok, fmt, max_turns=K, feedback_tokens=F, max_new=T, discount=d)
    out, grades, counts, seconds = turns.run(params, problems, prompt, pmask, first, grades1, key, conv, sp)

`first` is turn 1 as the rollout sampled it ([B, G, T] host arrays), `grades1` its grades, `conv` the
engine's conversations of turn 1 (engine.generate_kept; None: encode them from tokens) and `sp` the sampling
parameters of the later turns. Every failed row
gets a feedback turn (at most F tokens) and one more reply, sampled for all such rows of the batch at once;
rows that passed stop (they cost no further decoding). A trajectory is packed as ONE completion of T_tot = K*T
+ (K-1)*F tokens after the prompt, with no gap:

    reply 1 (up to and including its end-of-turn) | feedback 1 | reply 2 | ... | pad

so the train step's log-probs of the completion (causal over the prompt and every earlier token of it) are
exactly those the sampler conditioned on, and its loss mask (`SampleOutput.mask`) is 1 on the model's own
tokens only: feedback and padding are context, never trained on. `logp` holds the behaviour log-probs of the
model's tokens (0 elsewhere); `truncated` is the last turn's. The reward of a trajectory is its last turn's
all-pass reward times discount^(turns - 1); the per-test results are the last turn's. GRPO's group advantage
is then over the G trajectories of a prompt, as for single turns.

A later turn continues the failed rows' conversations through the rollout engine (grpo_jax.rollout.engines:
`select` the rows, `extend` them with the feedback turn and sample the next reply; the static engine keeps the
first turn's KV cache and encodes only the feedback turn, the continuous engine encodes the conversation
again); the next turn takes the rows that still fail. Batches are padded to a power of two rows (few compiled
shapes). Without first-turn conversations (evaluation, whose first turn is sampled without keeping them) turn
2 encodes the conversation once (prompt + reply + feedback, left-padded to P + T + F, `engine.from_tokens`)
and continues from there. Keys: turn k of a round draws with derive(round key, "turn/k"), so sampling stays a
function of (stream, step). One process only (config refuses --dist with --max_turns > 1).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from grpo_jax import rng as rng_lib
from grpo_jax.codegen import feedback, pipeline
from grpo_jax.policies import sampling
from grpo_jax.problem import Problem
from grpo_jax.rollout.grader import Grader, Grades, num_tests
from grpo_jax.tokenization import decode_completions
from grpo_jax.types import SampleOutput

CONSOLE_KEYS = ("multiturn/pass_after_turn1", "multiturn/fix_rate")  # on the main job's step line, when on


def bucket(n: int, cap: int) -> int:
    """Rows of a later turn's sampling batch: the next power of two >= n, at most cap (few compiled
    shapes)."""
    return min(cap, 1 << max(0, int(n) - 1).bit_length())


def trajectory_rewards(passed: np.ndarray, turns: np.ndarray, discount: float) -> np.ndarray:
    """[N] reward of each trajectory: its last turn's all-pass reward (1 / 0) x discount^(turns - 1)."""
    return np.where(passed, np.float32(discount) ** (turns - 1).astype(np.float32), 0.0).astype(np.float32)


class MultiTurn:
    """See the module docstring. `engine`: the rollout engine (grpo_jax.rollout.engines.RolloutEngine) the
    later turns are sampled with; `grader` grades and runs the public-test feedback jobs in its sandbox."""

    def __init__(
        self,
        engine,
        grader: Grader,
        tok,
        fmt,
        *,
        max_turns,
        feedback_tokens,
        max_new,
        discount=1.0,
        record=False,
    ):
        self.engine, self.grader, self.tok, self.fmt = engine, grader, tok, fmt
        self.K, self.F, self.T, self.discount = max_turns, feedback_tokens, max_new, discount
        self.record = record  # keep each row's later turns as text (counts["later"]: the evaluator's files)

    @classmethod
    def from_rollout(
        cls, engine, grader: Grader, tok, fmt, ro, max_turns: int | None = None, record: bool = False
    ) -> MultiTurn:
        """The MultiTurn of a RolloutConfig's turns, feedback budget, reply length and discount (`max_turns`:
        another number of turns, e.g. the evaluation's; `record`: keep the later turns as text)."""
        kw = dict(feedback_tokens=ro.feedback_tokens, max_new=ro.max_new_tokens, discount=ro.turn_discount)
        return cls(engine, grader, tok, fmt, max_turns=max_turns or ro.max_turns, record=record, **kw)

    @property
    def length(self) -> int:
        return self.K * self.T + (self.K - 1) * self.F

    def feedback_ids(self, problems: Sequence[Problem], replies: Sequence[str], ended_with: Sequence) -> list:
        """The feedback turn's token ids of each failed reply, from its run on the public tests only
        (`ended_with`: each reply's end-of-turn id, None where it was cut at the length limit)."""
        programs = [
            p.program_for(pipeline.completion_for(p, r, self.fmt))
            for p, r in zip(problems, replies, strict=True)
        ]
        public = self.grader.executor.run(
            feedback.public_jobs(problems, programs), deadline_s=self.grader.deadline_s
        )
        return [
            feedback.continuation_ids(
                self.tok,
                self.fmt,
                p,
                feedback.feedback_message(p, v),
                ended_with=e,
                budget=self.F,
            )
            for p, v, e in zip(problems, public, ended_with, strict=True)
        ]

    def run(
        self,
        params: Any,
        problems,
        prompt: np.ndarray,
        pmask: np.ndarray,
        first: SampleOutput,
        grades: Grades,
        key,
        conv=None,
        sp=None,
    ) -> tuple[SampleOutput, Grades, dict, float]:
        """(trajectories [B, G, T_tot] as host arrays, their grades, counts for `turn_metrics`, sampling
        seconds). `conv`: the first turn's conversations (engine.generate_kept; None: encoded from tokens);
        `sp`: the later turns' sampling parameters (default: temperature 1)."""
        sp = sampling.sampling_params() if sp is None else sp
        tr = _Trajectories(self, problems, first, grades)
        # rc: the engine's conversations of the rows `held` (the last turn's batch)
        rc: Any = None
        held: np.ndarray | None = None
        for k in range(2, self.K + 1):
            rows = np.flatnonzero(~tr.passed)
            if not rows.size:
                break
            probs = [tr.row_problem[r] for r in rows]
            last = [None if tr.truncated[r] else int(tr.tokens[r, tr.length[r] - 1]) for r in rows]
            t0 = time.perf_counter()
            fb = self.feedback_ids(probs, [tr.replies[r] for r in rows], last)
            tr.t_grade += time.perf_counter() - t0
            idx = np.r_[rows, np.full(bucket(rows.size, tr.N) - rows.size, rows[0])]  # the batch, padded
            fb_tok = np.full((idx.size, self.F), self.tok.pad_id, np.int32)
            fb_mask = np.zeros((idx.size, self.F), np.int32)
            for j, ids in enumerate(fb + [fb[0]] * (idx.size - rows.size)):
                fb_tok[j, : len(ids)], fb_mask[j, : len(ids)] = ids, 1
            for r, ids in zip(rows, fb, strict=True):
                tr.append(r, ids)
                if self.record:  # the feedback turn as the model saw it (its template's tokens included)
                    tr.later[r].append(
                        {"turn": k, "feedback": self.tok.decode(list(ids), skip_special=False)}
                    )
            tr.counts["fb"] += sum(len(ids) for ids in fb)
            t0 = time.perf_counter()
            key_k = rng_lib.derive(key, f"turn/{k}")
            if rc is None and conv is None:  # no first-turn conversations (evaluation): encode them
                ctx, cmask = self.contexts(prompt, pmask, tr.tokens, tr.length, idx, k)
                out, rc = self.engine.from_tokens(params, ctx, cmask, key_k, sp=sp)
            else:  # continue the kept conversations with the feedback turn
                if rc is None:
                    rc = self.engine.select(conv, idx)
                else:
                    assert held is not None  # set together with rc
                    where = {r: j for j, r in reversed(list(enumerate(held)))}
                    rc = self.engine.select(rc, [where[r] for r in idx])
                out, rc = self.engine.extend(params, rc, fb_tok, fb_mask, key_k, sp=sp)
            held = idx
            reply = [np.asarray(x)[: rows.size, 0] for x in (out.tokens, out.mask, out.logp, out.truncated)]
            tr.t_sample += time.perf_counter() - t0
            tr.add_turn(k, rows, probs, *reply)
        return tr.finish(self.discount)

    def contexts(self, prompt, pmask, tokens, length, idx, k) -> tuple[np.ndarray, np.ndarray]:
        """Turn k's conversations of rows `idx` as left-padded token contexts [R, P + (k-1)(T+F)] (the
        prompt's real tokens, then the trajectory so far): a later turn without the first turn's cache."""
        width = prompt.shape[1] + (k - 1) * (self.T + self.F)
        ctx = np.full((idx.size, width), self.tok.pad_id, np.int32)
        cmask = np.zeros((idx.size, width), np.int32)
        G = self.grader.G
        for j, r in enumerate(idx):
            seq = np.concatenate([prompt[r // G][pmask[r // G] > 0], tokens[r, : length[r]]])
            ctx[j, width - seq.size :], cmask[j, width - seq.size :] = seq, 1
        return ctx, cmask


class _Trajectories:
    """The host arrays of one batch's trajectories while their turns are sampled (MultiTurn.run)."""

    def __init__(self, mt: MultiTurn, problems, first: SampleOutput, grades: Grades):
        self.mt, self.problems = mt, problems
        G, T, K = mt.grader.G, mt.T, mt.K
        self.N = N = len(problems) * G
        self.tokens = np.full((N, mt.length), mt.tok.pad_id, np.int32)
        self.mask = np.zeros((N, mt.length), np.float32)
        self.logp = np.zeros((N, mt.length), np.float32)
        m1 = np.asarray(first.mask).reshape(N, T)
        self.tokens[:, :T] = np.asarray(first.tokens).reshape(N, T)
        self.mask[:, :T], self.logp[:, :T] = m1, np.asarray(first.logp).reshape(N, T)
        self.length = m1.sum(1).astype(np.int64)
        self.truncated = np.asarray(first.truncated).reshape(N).copy()
        self.verdicts = list(grades.verdicts)
        self.passed = np.asarray([v.passed for v in self.verdicts])
        self.turns = np.ones(N, np.int64)
        self.replies = list(grades.texts)
        self.later: list[list[dict]] = [[] for _ in range(N)]  # with mt.record: turns 2.. of each row
        self.row_problem = [problems[r // G] for r in range(N)]
        c: dict[str, Any] = {
            "rows": N,
            "passed": np.zeros(K),
            "len": np.zeros(K),
            "turn_rows": np.zeros(K),
            "fb": 0.0,
        }
        c["passed"][0], c["len"][0], c["turn_rows"][0] = self.passed.sum(), self.length.sum(), N
        self.counts, self.t_sample, self.t_grade = c, 0.0, grades.seconds

    def append(self, r: int | np.integer, ids, logp=None) -> None:
        """Tokens after row r's trajectory: the model's own (with their behaviour log-probs: in the loss mask)
        or a feedback turn's (logp None: context only)."""
        sl = slice(self.length[r], self.length[r] + len(ids))
        self.tokens[r, sl] = ids
        if logp is not None:
            self.mask[r, sl], self.logp[r, sl] = 1.0, logp
        self.length[r] += len(ids)

    def add_turn(self, k: int, rows, probs, tk, mk, lk, trk) -> None:
        """Turn k's replies of `rows` (tokens, mask, log-probs [R, T], truncated [R]): appended and graded."""
        for j, r in enumerate(rows):
            n = int(mk[j].sum())
            self.append(r, tk[j, :n], lk[j, :n])
        self.truncated[rows], self.turns[rows] = trk, k
        texts = decode_completions(self.mt.tok, tk, mk)
        t0, g = time.perf_counter(), self.mt.grader
        v, _ = pipeline.score_completions(g.executor, probs, texts, 1, g.deadline_s, self.mt.fmt)
        self.t_grade += time.perf_counter() - t0
        for j, r in enumerate(rows):
            self.verdicts[r], self.replies[r], self.passed[r] = v[j], texts[j], v[j].passed
            if self.mt.record:
                self.later[r][-1].update(reply=texts[j], passed=bool(v[j].passed), status=v[j].status.value)
        self.counts["passed"][k - 1] = self.passed.sum()
        self.counts["len"][k - 1], self.counts["turn_rows"][k - 1] = mk.sum(), len(rows)

    def finish(self, discount: float) -> tuple[SampleOutput, Grades, dict, float]:
        c, passed, turns, N = self.counts, self.passed, self.turns, self.N
        c["passed"][1:] = np.maximum.accumulate(c["passed"])[1:]  # a turn not run adds no pass
        c["passed_turn"] = np.where(passed, turns, 0)  # [N] the turn that passed, 0: none
        c["turns"] = float(turns.sum())
        c["fixed"] = float(np.sum(passed & (turns > 1)))
        c["failed_first"] = float(N - c["passed"][0])
        if self.mt.record:
            c["later"] = self.later
        B, G = len(self.problems), N // len(self.problems)
        rewards = trajectory_rewards(passed, turns, discount).reshape(B, G)
        out = SampleOutput(
            self.tokens.reshape(B, G, -1),
            self.logp.reshape(B, G, -1),
            self.mask.reshape(B, G, -1),
            self.mask.sum(1).astype(np.int32).reshape(B, G),
            self.truncated.reshape(B, G),
        )
        tok = self.mt.tok
        texts = [tok.decode(self.tokens[r, : self.length[r]].tolist(), skip_special=False) for r in range(N)]
        graded = self.mt.grader.assemble(  # the reward functions score each trajectory's last reply
            self.problems,
            texts,
            self.verdicts,
            rewards,
            seconds=self.t_grade,
            replies=list(self.replies),
            lengths=self.mask.sum(1),
        )
        return out, graded, c, self.t_sample


def turn_metrics(counts: Sequence[dict]) -> dict[str, float]:
    """Logged figures of a step's multi-turn rounds: turns used, pass rate after each turn, fix rate (of the
    trajectories that failed turn 1, the fraction a later turn passed), feedback tokens, reply lengths."""
    if not counts:
        return {}
    rows = sum(c["rows"] for c in counts)
    passed = sum(c["passed"] for c in counts)
    length, turn_rows = sum(c["len"] for c in counts), sum(c["turn_rows"] for c in counts)
    failed = sum(c["failed_first"] for c in counts)
    m = {
        "multiturn/turns_mean": sum(c["turns"] for c in counts) / rows,
        "multiturn/fix_rate": sum(c["fixed"] for c in counts) / max(failed, 1.0),
        "multiturn/feedback_tokens_mean": sum(c["fb"] for c in counts) / rows,
    }
    for k in range(len(passed)):
        m[f"multiturn/pass_after_turn{k + 1}"] = float(passed[k] / rows)
        if turn_rows[k]:
            m[f"multiturn/reply_len_turn{k + 1}"] = float(length[k] / turn_rows[k])
    return m


class EvalTurns:
    """The later turns of an evaluation (`pipeline.evaluate(..., turns=EvalTurns(...))`): called with each
    batch's turn-1 samples, it runs turns 2..K on the failed ones through `engine` with the evaluation's
    sampling (greedy, or `sampled`'s temperature / top-k / top-p, as turn 1; keys derived from `key` per call)
    and returns the turn at which each sample passed (0: none) and each sample's later turns as text: a list
    per sample of {"turn", "feedback" (as the model saw it), "reply", "passed", "status"} (empty when turn 1
    passed). `limits`: the sandbox's deadline and stop-on-failure (a SandboxConfig or grader.GradeLimits)."""

    def __init__(
        self,
        engine,
        tok,
        fmt,
        executor,
        limits,
        params,
        key,
        *,
        sampled,
        max_turns: int,
        feedback_tokens: int,
        discount: float = 1.0,
        store=None,
    ):
        self.engine, self.tok, self.fmt, self.executor, self.limits = engine, tok, fmt, executor, limits
        self.store = store  # grpo_jax.eval.evaluation.SampleStore: each call's later turns kept / read back
        self.modes = {True: sampling.sampling_params(0.0), False: sampled}
        self.params, self.key, self.calls, self.max_turns = params, key, 0, max_turns
        self.kw = dict(max_turns=max_turns, feedback_tokens=feedback_tokens, max_new=engine.max_new)
        self.discount = discount
        self.stops = np.asarray(engine.eos_ids)

    def __call__(
        self, problems, prompt, pmask, tokens, mask, n: int, greedy: bool
    ) -> tuple[np.ndarray, list]:
        self.calls += 1
        stored = None if self.store is None else self.store.get_turns(self.calls)
        if stored is not None:
            return stored
        grader = Grader(
            self.executor, self.limits, self.tok, self.fmt, group=n, num_tests=num_tests(problems)
        )
        tokens, mask = np.asarray(tokens), np.asarray(mask)
        ended = (np.isin(tokens, self.stops) & (mask > 0)).any(-1)
        first = SampleOutput(
            tokens, np.zeros(mask.shape, np.float32), mask, mask.sum(-1).astype(np.int32), ~ended
        )
        grades = grader.grade(problems, tokens, mask)
        mt = MultiTurn(
            self.engine, grader, self.tok, self.fmt, discount=self.discount, record=True, **self.kw
        )
        key = rng_lib.derive(self.key, self.calls)
        counts = mt.run(self.params, problems, prompt, pmask, first, grades, key, sp=self.modes[greedy])[2]
        if self.store is not None:
            self.store.put_turns(self.calls, counts["passed_turn"], counts["later"])
        return counts["passed_turn"], counts["later"]
