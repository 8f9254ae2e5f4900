"""Host side of code-generation training: problems <-> token arrays, sandbox scoring, held-out evaluation.

NumPy only (no JAX): the sampler is injected into `evaluate` as a plain function, so this module can be
used from any process, and the JAX process calls it between its jitted pieces ("tokens out, rewards in").

Shapes: B problems, G completions per problem, P prompt tokens (left-padded), T completion tokens,
N = B * G completions flattened problem-major (the G completions of problem b are rows b*G .. b*G+G-1).

Prompting (`PromptFormat`): "plain" shows the model the problem's prompt as it is and the completion
continues it (the procedural suite and HumanEval convention: program = prompt + completion); "chat" renders
the prompt in an instruction through the tokenizer's chat template (instruct models), the model replies, and
the code is the first fenced block of the reply (`extract_code`). Generation stops at any of the
tokenizer's `eos_ids` (an instruct model's end-of-turn token included). `tok` is any
grpo_jax.tokenization.Tokenizer (the procedural CodeTokenizer or a real one).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import numpy as np

from grpo_jax.codegen import rewards as rewards_lib
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Verdict
from grpo_jax.tokenization.batch import decode_completions

# sample_fn(prompt [b, P], prompt_mask [b, P], n, greedy) -> (tokens [b, n, T], mask [b, n, T])
SampleFn = Callable[[np.ndarray, np.ndarray, int, bool], tuple[np.ndarray, np.ndarray]]


class TurnsFn(Protocol):
    """turns(problems [b], prompt, prompt_mask, tokens [b, n, T], mask, n, greedy) -> (the turn at which each
    of the b * n samples passed (0: none), each sample's later turns: a list of dicts), for multi-turn
    evaluation; `.max_turns` (grpo_jax.rollout.multiturn.EvalTurns)"""

    max_turns: int

    def __call__(
        self,
        problems: Sequence[Problem],
        prompt: np.ndarray,
        pmask: np.ndarray,
        tokens: np.ndarray,
        mask: np.ndarray,
        n: int,
        greedy: bool,
        /,
    ) -> tuple[np.ndarray, list]: ...


DEFAULT_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function in a single ```python code "
    "block.\n\n```python\n{prompt}```"
)


PROGRAM_INSTRUCTION = "{prompt}\nReply with the Python code in a single ```python code block."


class PromptFormat(NamedTuple):
    """How a problem is shown to the model: kind "plain" (the prompt as it is) or "chat" (`instruction` —
    `program_instruction` for whole-program problems such as MBPP — with {prompt} filled in, as the user turn
    of the tokenizer's chat template, after an optional system turn)."""

    kind: str = "plain"
    instruction: str = DEFAULT_INSTRUCTION
    system: str = ""
    program_instruction: str = PROGRAM_INSTRUCTION


PLAIN = PromptFormat()
BUCKET = 64  # prompt-length granularity of evaluation batches with prompt_len=None
_FENCE = re.compile(r"```[ \t]*(?:python3?|py)?[ \t]*\n(.*?)(?:```|\Z)", re.S | re.I)


def render_prompt(tok, problem: Problem, fmt: PromptFormat = PLAIN) -> str:
    """The text the model is shown for `problem`."""
    if fmt.kind == "plain":
        return problem.prompt
    if fmt.kind != "chat":
        raise ValueError(f"PromptFormat.kind={fmt.kind!r}: valid: plain, chat")
    return tok.apply_chat_template(render_messages(problem, fmt), add_generation_prompt=True)


def render_messages(problem: Problem, fmt: PromptFormat) -> list[dict[str, str]]:
    """The chat messages of `problem` (chat format): the optional system turn and the user turn."""
    messages = [{"role": "system", "content": fmt.system}] if fmt.system else []
    template = fmt.instruction if problem.completion_mode == "append" else fmt.program_instruction
    messages.append({"role": "user", "content": template.replace("{prompt}", problem.prompt)})
    return messages


def extract_code(reply: str) -> str:
    """The code of a chat reply: the first fenced block (```python ... ```; an unclosed fence runs to the
    end), or the whole reply when it has no fence."""
    m = _FENCE.search(reply)
    return m.group(1) if m else reply


def fenced_blocks(reply: str) -> list[str]:
    """The bodies of every fenced code block of a chat reply, as extract_code finds the first (an unclosed
    last fence runs to the end)."""
    return _FENCE.findall(reply)


def completion_for(problem: Problem, reply: str, fmt: PromptFormat = PLAIN) -> str:
    """The completion that `problem.program_for` turns into a program. Chat: the extracted code; for an
    append-mode problem it follows the prompt on a new line, so a whole redefined function (a new `def` at
    column 0) replaces the prompt's docstring-only one and an indented body continues it."""
    if fmt.kind == "plain":
        return reply
    code = extract_code(reply)
    return "\n" + code if problem.completion_mode == "append" else code


def reference_body(problem: Problem) -> str:
    """The reference completion: Problem.reference minus Problem.prompt (append-mode problems only)."""
    if problem.completion_mode != "append" or not problem.reference.startswith(problem.prompt):
        raise ValueError(f"problem {problem.task_id}: its reference does not extend its prompt")
    return problem.reference[len(problem.prompt) :]


def encode_prompts(
    tok, problems: Sequence[Problem], prompt_len: int, fmt: PromptFormat = PLAIN
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompt tokens and mask, both int32 [B, P]; ValueError names a prompt that does not fit."""
    if prompt_len <= 0:
        raise ValueError(f"prompt_len={prompt_len} must be positive")
    ids = np.full((len(problems), prompt_len), tok.pad_id, np.int32)
    mask = np.zeros((len(problems), prompt_len), np.int32)
    for i, p in enumerate(problems):
        row = tok.encode(render_prompt(tok, p, fmt))
        if len(row) > prompt_len:
            raise ValueError(
                f"prompt of {p.task_id} has {len(row)} tokens, more than prompt_len={prompt_len} "
                "(raise prompt_len)"
            )
        ids[i, prompt_len - len(row) :] = row
        mask[i, prompt_len - len(row) :] = 1
    return ids, mask


def sft_target(problem: Problem, fmt: PromptFormat = PLAIN) -> str:
    """The supervised reply: plain, the reference body (the whole program for program-mode problems, MBPP);
    chat, the whole reference in a ```python block."""
    if fmt.kind == "chat":
        return f"```python\n{problem.reference.rstrip()}\n```"
    return problem.reference if problem.completion_mode == "program" else reference_body(problem)


def sft_examples(
    tok, problems: Sequence[Problem], prompt_len: int, completion_len: int, fmt: PromptFormat = PLAIN
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt [B, P], prompt_mask [B, P], completion [B, T], completion_mask [B, T]), all int32.

    The completion is the reference (`sft_target`) followed by EOS, right-padded with pad_id; its mask is 1 on
    the target tokens and on the EOS. ValueError names a problem whose target + EOS does not fit."""
    prompt, pmask = encode_prompts(tok, problems, prompt_len, fmt)
    comp = np.full((len(problems), completion_len), tok.pad_id, np.int32)
    cmask = np.zeros((len(problems), completion_len), np.int32)
    for i, p in enumerate(problems):
        row = tok.encode(sft_target(p, fmt)) + [tok.eos_id]
        if len(row) > completion_len:
            raise ValueError(
                f"SFT target of {p.task_id} has {len(row)} tokens with EOS, more than "
                f"completion_len={completion_len} (raise completion_len)"
            )
        comp[i, : len(row)] = row
        cmask[i, : len(row)] = 1
    return prompt, pmask, comp, cmask


def score_completions(
    executor: Executor,
    problems: Sequence[Problem],
    completions: Sequence[str],
    group: int,
    deadline_s: float | None = None,
    fmt: PromptFormat = PLAIN,
    stop_on_failure: bool = False,
) -> tuple[list[Verdict], np.ndarray]:
    """Grade completions (the model's replies) in the sandbox: (verdicts [N], all-pass rewards [B, G]).

    completions are problem-major: len(completions) == len(problems) * group. stop_on_failure: each
    program's tests end at its first failure (jobs_for; the rewards are the same)."""
    if group < 1 or len(completions) != len(problems) * group:
        raise ValueError(
            f"score_completions: {len(completions)} completions for {len(problems)} problems x group={group}"
        )
    programs = [completion_for(problems[i // group], c, fmt) for i, c in enumerate(completions)]
    jobs = jobs_for(problems, programs, stop_on_failure=stop_on_failure)
    verdicts = executor.run(jobs, deadline_s=deadline_s)
    r = rewards_lib.all_pass_rewards(verdicts).reshape(len(problems), group)
    return verdicts, r


def plan_batches(
    tok,
    problems: Sequence[Problem],
    prompt_len: int | None,
    batch: int,
    fmt: PromptFormat,
    max_batch_tokens: int | None = None,
) -> list[tuple[list[int], int, int]]:
    """The sampler batches of an evaluation: (problem indices, prompt length, rows) each, rows >= indices
    (the last batch of a shape is padded by repeating a problem, so the sampler sees one static shape).

    prompt_len given: groups of `batch` in order, every prompt padded to prompt_len. prompt_len None: problems
    are batched in order of prompt length and each batch is padded to its own length (a multiple of BUCKET),
    so one long prompt pads no other batch; with max_batch_tokens = T, a batch of prompts padded to length L
    holds at most max(1, min(T // L, T^2 // (batch L^2))) of them (fewer than `batch` for long prompts: the
    sampler's caches and activations grow with rows x L, the prefill's attention scores with rows x L^2; a
    batch of `batch` prompts of length T / batch meets both bounds)."""
    order = list(range(len(problems)))
    if prompt_len is not None:
        return [(order[i : i + batch], prompt_len, batch) for i in range(0, len(order), batch)]
    lengths = [len(tok.encode(render_prompt(tok, p, fmt))) for p in problems]
    order.sort(key=lambda i: lengths[i])

    def bucket(n_tokens: int) -> int:
        return -(-n_tokens // BUCKET) * BUCKET

    def rows_for(plen: int) -> int:  # the batch's rows (one static shape per prompt length)
        t = max_batch_tokens
        return batch if not t else max(1, min(batch, t // plen, t * t // (batch * plen * plen)))

    plan, start = [], 0
    while start < len(order):  # prompts in order of length: the last one taken sets the batch's length
        end = start + 1
        while end < len(order) and end - start < rows_for(bucket(lengths[order[end]])):
            end += 1
        ids = order[start:end]
        plen = bucket(max(lengths[i] for i in ids))
        plan.append((ids, plen, rows_for(plen)))
        start = end
    return plan


def _batched_samples(
    sample_fn: SampleFn,
    tok,
    problems: Sequence[Problem],
    plan: list[tuple[list[int], int, int]],
    n: int,
    greedy: bool,
    fmt: PromptFormat,
    turns: TurnsFn | None = None,
) -> tuple[list[str], np.ndarray | None, list | None]:
    """Problem-major completion texts (n per problem) and, with `turns`, the turn at which each sample passed
    [len(problems) * n] and each sample's later turns, sampled in the batches of `plan` (plan_batches)."""
    texts: list[str] = [""] * (len(problems) * n)
    passed_turn = None if turns is None else np.zeros(len(problems) * n, np.int64)
    later: list | None = None if turns is None else [[] for _ in texts]
    for ids, plen, rows in plan:
        chunk = [problems[i] for i in ids]
        real = len(chunk)
        chunk += [chunk[-1]] * (rows - real)
        prompt, pmask = encode_prompts(tok, chunk, plen, fmt)
        tokens, mask = sample_fn(prompt, pmask, n, greedy)
        out = decode_completions(tok, np.asarray(tokens)[:real], np.asarray(mask)[:real])
        pt, lt = (None, None) if turns is None else turns(chunk, prompt, pmask, tokens, mask, n, greedy)
        for j, i in enumerate(ids):
            texts[i * n : (i + 1) * n] = out[j * n : (j + 1) * n]
            if pt is not None and lt is not None and passed_turn is not None and later is not None:
                passed_turn[i * n : (i + 1) * n] = pt[j * n : (j + 1) * n]
                later[i * n : (i + 1) * n] = lt[j * n : (j + 1) * n]
    return texts, passed_turn, later


def evaluate(
    sample_fn: SampleFn,
    executor: Executor,
    tok,
    problems: Sequence[Problem],
    *,
    n_samples: int,
    ks: Sequence[int],
    prompt_len: int | None,
    batch: int,
    deadline_s: float | None = None,
    fmt: PromptFormat = PLAIN,
    details: dict | None = None,
    turns: TurnsFn | None = None,
    max_batch_tokens: int | None = None,
    plan: list[tuple[list[int], int, int]] | None = None,
    stop_on_failure: bool = False,
) -> dict[str, float]:
    """Held-out metrics as a flat dict of floats.

    "pass@1": fraction of problems whose greedy completion passes (n = 1);
    "pass@k" for k in ks: unbiased estimate (Chen et al. 2021) from n_samples temperature samples per problem
    (k <= n_samples); "pass@1/sampled": the same estimator at k = 1 (mean per-sample pass rate);
    "level{L}/pass@1" (greedy) and "level{L}/pass_rate" (sampled) per level; "status/{s}" counts over the
    sampled completions; "n_problems". n_samples = 0 (with ks empty) evaluates greedy pass@1 only.
    prompt_len None: each batch at its own prompt length, at most max_batch_tokens prompt positions per batch
    when given (plan_batches); `plan`: those batches when the caller has planned them already (used for the
    greedy and the sampled pass alike, as the plan computed here is). stop_on_failure: each program's tests
    end at its first failure (the pass/fail metrics are the same; "status/…" then counts each failed
    program's first failing test's status).
    details: a dict to receive what the metrics were computed from (nothing else changes):
    "greedy" = (texts [B], verdicts [B]) and, when sampled, "sampled" = (texts [B * n_samples], verdicts),
    problem-major; texts are the model's replies (completion_for turns one into the graded completion);
    with `turns`, "greedy_turn" / "sampled_turn", the turn at which each passed (0: none), and
    "greedy_later" / "sampled_later", each sample's later turns (TurnsFn).
    turns: multi-turn execution feedback (grpo_jax.rollout.multiturn.EvalTurns): the same metrics after each
    turn t as "turn{t}/pass@1" (greedy) and "turn{t}/pass@k" (sampled), with "fix_rate" (greedy: of the
    problems that failed turn 1, the fraction a later turn passed); the plain keys stay turn 1's.
    """
    ks = [int(k) for k in ks]
    if any(k < 1 or k > n_samples for k in ks):
        raise ValueError(f"evaluate: every k in {ks} must be in [1, n_samples={n_samples}]")
    problems = list(problems)
    if not problems:
        raise ValueError("evaluate: no problems")
    out: dict[str, float] = {"n_problems": float(len(problems))}
    if plan is None:  # one plan (prompts tokenized once) for both passes
        plan = plan_batches(tok, problems, prompt_len, batch, fmt, max_batch_tokens)

    greedy_texts, greedy_turn, greedy_later = _batched_samples(
        sample_fn, tok, problems, plan, 1, True, fmt, turns
    )
    grade = functools.partial(
        score_completions, deadline_s=deadline_s, fmt=fmt, stop_on_failure=stop_on_failure
    )
    greedy_verdicts, greedy_r = grade(executor, problems, greedy_texts, 1)
    if details is not None:
        details["greedy"] = (greedy_texts, greedy_verdicts)
        if greedy_turn is not None:
            details["greedy_turn"], details["greedy_later"] = greedy_turn, greedy_later
    greedy_ok = greedy_r[:, 0]
    out["pass@1"] = float(greedy_ok.mean())
    if greedy_turn is not None and turns is not None:
        out.update(_turn_metrics(greedy_turn, 1, [1], turns.max_turns))
        out["fix_rate"] = fix_rate(greedy_turn)

    levels = sorted({p.level for p in problems})
    level_of = np.asarray([p.level for p in problems])
    for lv in levels:
        out[f"level{lv}/pass@1"] = float(greedy_ok[level_of == lv].mean())

    if n_samples > 0 and ks:
        texts, turn, later = _batched_samples(sample_fn, tok, problems, plan, n_samples, False, fmt, turns)
        if turn is not None and turns is not None:
            out.update(_turn_metrics(turn, n_samples, [k for k in ks if k > 1], turns.max_turns))
        verdicts, r = grade(executor, problems, texts, n_samples)
        if details is not None:
            details["sampled"] = (texts, verdicts)
            if turn is not None:
                details["sampled_turn"], details["sampled_later"] = turn, later
        correct = r.sum(axis=1).astype(int)
        out["pass@1/sampled"] = float(np.mean([pass_at_k(n_samples, c, 1) for c in correct]))
        for k in ks:
            out[f"pass@{k}"] = (
                out["pass@1"] if k == 1 else float(np.mean([pass_at_k(n_samples, c, k) for c in correct]))
            )
        for lv in levels:
            out[f"level{lv}/pass_rate"] = float(r[level_of == lv].mean())
        for s, c in rewards_lib.failure_counts(verdicts).items():
            out[f"status/{s}"] = float(c)
    return out


def fix_rate(passed_turn: np.ndarray) -> float:
    """Of the samples that failed turn 1 (passed_turn != 1: the turn at which each passed, 0 for none), the
    fraction a later turn passed; 0 when none failed."""
    failed = passed_turn != 1
    return float(np.mean(passed_turn[failed] > 1)) if failed.any() else 0.0


def _turn_metrics(passed_turn: np.ndarray, n: int, ks: Sequence[int], max_turns: int) -> dict[str, float]:
    """ "turn{t}/pass@k", t = 1..max_turns, from the turn at which each of n samples per problem passed (0:
    none)."""
    out = {}
    pt = passed_turn.reshape(-1, n)
    for t in range(1, max_turns + 1):
        correct = ((pt >= 1) & (pt <= t)).sum(1)
        for k in ks:
            out[f"turn{t}/pass@{k}"] = float(np.mean([pass_at_k(n, int(c), k) for c in correct]))
    return out
