"""Host side of code-generation training: problems <-> token arrays, sandbox scoring, held-out evaluation.

NumPy only (no JAX): the sampler is injected into `evaluate` as a plain function, so this module can be
used from any process, and the JAX process calls it between its jitted pieces ("tokens out, rewards in").

Shapes: B problems, G completions per problem, P prompt tokens (left-padded), T completion tokens,
N = B * G completions flattened problem-major (the G completions of problem b are rows b*G .. b*G+G-1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from grpo_jax.codegen import rewards as rewards_lib
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.codegen.tokenizer import CodeTokenizer
from grpo_jax.problem import Problem
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Verdict

# sample_fn(prompt [b, P], prompt_mask [b, P], n, greedy) -> (tokens [b, n, T], mask [b, n, T])
SampleFn = Callable[[np.ndarray, np.ndarray, int, bool], tuple[np.ndarray, np.ndarray]]


def reference_body(problem: Problem) -> str:
    """The reference completion: Problem.reference minus Problem.prompt (append-mode problems only)."""
    if problem.completion_mode != "append" or not problem.reference.startswith(problem.prompt):
        raise ValueError(f"problem {problem.task_id}: its reference does not extend its prompt")
    return problem.reference[len(problem.prompt) :]


def encode_prompts(
    tok: CodeTokenizer, problems: Sequence[Problem], prompt_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompt tokens and mask, both int32 [B, P]; ValueError names a prompt that does not fit."""
    if prompt_len <= 0:
        raise ValueError(f"prompt_len={prompt_len} must be positive")
    ids = np.full((len(problems), prompt_len), tok.pad_id, np.int32)
    mask = np.zeros((len(problems), prompt_len), np.int32)
    for i, p in enumerate(problems):
        row = tok.encode(p.prompt)
        if len(row) > prompt_len:
            raise ValueError(
                f"prompt of {p.task_id} has {len(row)} tokens, more than prompt_len={prompt_len} "
                "(raise prompt_len)"
            )
        ids[i, prompt_len - len(row) :] = row
        mask[i, prompt_len - len(row) :] = 1
    return ids, mask


def sft_examples(
    tok: CodeTokenizer, problems: Sequence[Problem], prompt_len: int, completion_len: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(prompt [B, P], prompt_mask [B, P], completion [B, T], completion_mask [B, T]), all int32.

    The completion is the reference body followed by EOS, right-padded with pad_id; its mask is 1 on the body
    tokens and on the EOS. ValueError names a problem whose body + EOS does not fit in completion_len."""
    prompt, pmask = encode_prompts(tok, problems, prompt_len)
    comp = np.full((len(problems), completion_len), tok.pad_id, np.int32)
    cmask = np.zeros((len(problems), completion_len), np.int32)
    for i, p in enumerate(problems):
        row = tok.encode(reference_body(p)) + [tok.eos_id]
        if len(row) > completion_len:
            raise ValueError(
                f"reference body of {p.task_id} has {len(row)} tokens with EOS, more than "
                f"completion_len={completion_len} (raise completion_len)"
            )
        comp[i, : len(row)] = row
        cmask[i, : len(row)] = 1
    return prompt, pmask, comp, cmask


def decode_completions(tok: CodeTokenizer, tokens: np.ndarray, mask: np.ndarray) -> list[str]:
    """Text of each row of tokens [N, T] (or [B, G, T], flattened row-major): the masked tokens up to (not
    including) the first EOS, special tokens skipped."""
    tokens = np.asarray(tokens)
    mask = np.asarray(mask)
    tokens = tokens.reshape(-1, tokens.shape[-1])
    mask = mask.reshape(-1, mask.shape[-1])
    out = []
    for row, m in zip(tokens, mask, strict=True):
        ids = row[m > 0]
        eos = np.flatnonzero(ids == tok.eos_id)
        if eos.size:
            ids = ids[: eos[0]]
        out.append(tok.decode(ids.tolist(), skip_special=True))
    return out


def score_completions(
    executor: Executor,
    problems: Sequence[Problem],
    completions: Sequence[str],
    group: int,
    deadline_s: float | None = None,
) -> tuple[list[Verdict], np.ndarray]:
    """Grade completions in the sandbox: (verdicts [N], all-pass rewards float32 [B, G]).

    completions are problem-major: len(completions) == len(problems) * group."""
    if group < 1 or len(completions) != len(problems) * group:
        raise ValueError(
            f"score_completions: {len(completions)} completions for {len(problems)} problems x group={group}"
        )
    verdicts = executor.run(jobs_for(problems, completions), deadline_s=deadline_s)
    r = rewards_lib.all_pass_rewards(verdicts).reshape(len(problems), group)
    return verdicts, r


def _batched_samples(
    sample_fn: SampleFn,
    tok: CodeTokenizer,
    problems: Sequence[Problem],
    prompt_len: int,
    batch: int,
    n: int,
    greedy: bool,
) -> list[str]:
    """Problem-major completion texts (n per problem); the last batch is padded by repeating a problem so
    the sampler sees one static shape."""
    texts: list[str] = []
    for start in range(0, len(problems), batch):
        chunk = list(problems[start : start + batch])
        real = len(chunk)
        chunk += [chunk[-1]] * (batch - real)
        prompt, pmask = encode_prompts(tok, chunk, prompt_len)
        tokens, mask = sample_fn(prompt, pmask, n, greedy)
        tokens = np.asarray(tokens)[:real]
        mask = np.asarray(mask)[:real]
        texts += decode_completions(tok, tokens, mask)
    return texts


def evaluate(
    sample_fn: SampleFn,
    executor: Executor,
    tok: CodeTokenizer,
    problems: Sequence[Problem],
    *,
    n_samples: int,
    ks: Sequence[int],
    prompt_len: int,
    batch: int,
    deadline_s: float | None = None,
) -> dict[str, float]:
    """Held-out metrics as a flat dict of floats.

    "pass@1": fraction of problems whose greedy completion passes (n = 1);
    "pass@k" for k in ks: unbiased estimate (Chen et al. 2021) from n_samples temperature samples per problem
    (k <= n_samples); "pass@1/sampled": the same estimator at k = 1 (mean per-sample pass rate);
    "level{L}/pass@1" (greedy) and "level{L}/pass_rate" (sampled) per level; "status/{s}" counts over the
    sampled completions; "n_problems".
    """
    ks = [int(k) for k in ks]
    if any(k < 1 or k > n_samples for k in ks):
        raise ValueError(f"evaluate: every k in {ks} must be in [1, n_samples={n_samples}]")
    problems = list(problems)
    if not problems:
        raise ValueError("evaluate: no problems")
    out: dict[str, float] = {"n_problems": float(len(problems))}

    greedy_texts = _batched_samples(sample_fn, tok, problems, prompt_len, batch, 1, True)
    _, greedy_r = score_completions(executor, problems, greedy_texts, 1, deadline_s)
    greedy_ok = greedy_r[:, 0]
    out["pass@1"] = float(greedy_ok.mean())

    levels = sorted({p.level for p in problems})
    level_of = np.asarray([p.level for p in problems])
    for lv in levels:
        out[f"level{lv}/pass@1"] = float(greedy_ok[level_of == lv].mean())

    if n_samples > 0 and ks:
        texts = _batched_samples(sample_fn, tok, problems, prompt_len, batch, n_samples, False)
        verdicts, r = score_completions(executor, problems, texts, n_samples, deadline_s)
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
