"""Execution feedback for multi-turn code RL: what a programmer would see after running a failed program on
the problem's VISIBLE tests, appended to the conversation as the next turn (host side, no JAX).

    jobs = public_jobs(problems, programs)            # each program on its problem's public tests only
    msg = feedback_message(problem, public_verdict)   # the message text (FEEDBACK_* templates below)
    ids = continuation_ids(tok, fmt, problem, msg, ended_with=EOS, budget=F)   # tokens after the reply

Hidden tests never reach the model: the message is built from a run on `Problem.public_tests` alone (a
separate sandbox job, stopped at the first failing test), and the only thing it says about the graded (hidden)
tests is that the program did not pass them. A problem without public tests (MBPP, HumanEval as shipped here)
gets the errors of running its program with no test (a syntax error, an exception at import time) or the bare
fact that it failed.

The message (documented templates, each shown field cut to FIELD_CHARS characters), by what the public run
shows first:
  * the program does not compile or run:  "Your program failed to run: <error>"
  * a call test fails:                    "Your program failed this example:", ">>> <call>",
                                          "Expected: <value>", then "Got: <value>" (or "Error: <exception>",
                                          "Time limit exceeded"), one per line
  * a stdin/stdout test fails:            "Your program failed this example.", "Input:", <stdin>,
                                          "Expected output:", <text>, "Your output:", <text> (or the error)
  * the examples pass, hidden tests fail: "Your program passes the examples but fails other tests."
then FEEDBACK_ASK. In the chat format the message is the next user turn of the model's chat template
(`continuation_ids`: the text the template puts between the model's reply and its next reply); in the plain
format (a base model continuing a prompt) it is a block of `# ` comment lines followed by the problem's prompt
again, so the next reply continues the function as the first one did.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_jax.codegen.pipeline import PromptFormat, render_messages
from grpo_jax.problem import Problem
from grpo_jax.sandbox.types import Job, Limits, Status, Verdict

FIELD_CHARS = 300  # the most characters of one shown field (an input, an output, an error)
FEEDBACK_ASK = "Fix the program."
FEEDBACK_ASK_CHAT = (
    "Fix the program and reply with the complete corrected code in a single ```python code block."
)
_MARK = "\x00REPLY\x00"  # stands for the model's reply when the chat template is rendered


def public_jobs(
    problems: Sequence[Problem], programs: Sequence[str], limits: Limits | None = None
) -> list[Job]:
    """One Job per (problem, program): the program on the problem's public tests only, stopping at the first
    failure (no child check, which holds hidden asserts; a problem without public tests runs its program
    bare)."""
    if len(problems) != len(programs):
        raise ValueError(f"public_jobs: {len(programs)} programs for {len(problems)} problems")
    return [
        Job(
            program=prog,
            tests=tuple(p.public_tests),
            setup_code=p.setup_code if p.public_tests else "",
            limits=limits,
            time_limit_s=p.time_limit_s,
            stop_on_failure=True,
        )
        for p, prog in zip(problems, programs, strict=True)
    ]


def _field(x: object) -> str:
    s = x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x)
    return s if len(s) <= FIELD_CHARS else s[:FIELD_CHARS] + "..."


def feedback_message(problem: Problem, public: Verdict) -> str:
    """The feedback text for a program that failed its graded tests, from its run on the public tests
    (`public_jobs`); see the module docstring for the forms."""
    if public.status is Status.SYNTAX_ERROR or (not public.tests and not public.passed):
        return f"Your program failed to run: {_field(public.detail or public.status.value)}\n{FEEDBACK_ASK}"
    failed = next(((i, r) for i, r in enumerate(public.tests) if not r.passed), None)
    if failed is None:
        what = "passes the examples but fails other tests" if problem.public_tests else "fails the tests"
        return f"Your program {what}.\n{FEEDBACK_ASK}"
    i, r = failed
    tc = problem.public_tests[i]
    if tc.kind == "stdout":
        shown = f"Input:\n{_field(tc.stdin)}\nExpected output:\n{_field(tc.expected)}"
        head = f"Your program failed this example.\n{shown}"
        seen = "Your output:\n" + _field(r.got)
    else:
        head = (
            f"Your program failed this example:\n>>> {_field(tc.call)}\nExpected: {_field(repr(tc.expected))}"
        )
        seen = "Got: " + _field(r.got)
    if r.status is Status.TIMEOUT:
        seen = "Time limit exceeded"
    elif r.status is not Status.WRONG_ANSWER:
        seen = "Error: " + _field(r.error or r.status.value)
    return f"{head}\n{seen}\n{FEEDBACK_ASK}"


def continuation_text(tok, fmt: PromptFormat, problem: Problem, message: str) -> str:
    """The text between the model's reply and its next reply: in the chat format, what the model's chat
    template renders after an assistant turn for the user turn `message` and the next assistant turn's
    opening; in the plain format, `message` as `# ` comment lines and the problem's prompt again."""
    if fmt.kind == "plain":
        lines = "".join(f"# {ln}\n" for ln in message.splitlines())
        return f"\n{lines}{problem.prompt}"
    ask = message.replace(FEEDBACK_ASK, FEEDBACK_ASK_CHAT)
    messages = render_messages(problem, fmt) + [
        {"role": "assistant", "content": _MARK},
        {"role": "user", "content": ask},
    ]
    text = tok.apply_chat_template(messages, add_generation_prompt=True)
    if text.count(_MARK) != 1:
        raise ValueError("the chat template does not render an assistant turn verbatim; multi-turn needs one")
    return text.split(_MARK, 1)[1]


def check_feedback_budget(tok, fmt: PromptFormat, problems: Sequence[Problem], budget: int) -> None:
    """ValueError naming --feedback_tokens when the feedback turn of one of `problems` cannot fit `budget`
    tokens even with an empty message (its template turn and the restated prompt: continuation_ids would
    refuse it at the first failed reply). Run before a run or an evaluation starts; the turn grows with the
    prompt, so the 8 longest prompts (by characters) are measured."""
    longest = sorted(problems, key=lambda p: len(p.prompt), reverse=True)[:8]
    need = [(len(tok.encode(continuation_text(tok, fmt, p, FEEDBACK_ASK))), p.task_id) for p in longest]
    n, task_id = max(need, default=(0, ""))
    if n > budget:
        raise ValueError(
            f"--feedback_tokens={budget}: the feedback turn of {task_id} needs {n} tokens even with an empty "
            f"message; raise it to at least {n}"
        )


def continuation_ids(
    tok, fmt: PromptFormat, problem: Problem, message: str, *, ended_with: int | None, budget: int
) -> list[int]:
    """Token ids to append after a reply and before the next reply, at most `budget` ids. `ended_with`: the
    reply's last token when it ended the turn (an end-of-turn id), which then stands for the continuation's
    own leading copy of it; None for a reply cut at the length limit. The message is shortened (its end cut,
    '...' marking it) until it fits; ValueError if even an empty message does not fit the budget."""

    def ids_for(msg: str) -> list[int]:
        ids = tok.encode(continuation_text(tok, fmt, problem, msg))
        if ended_with is not None and ids and ids[0] == ended_with:
            ids = ids[1:]
        return ids

    ids = ids_for(message)
    if len(ids) <= budget:
        return ids
    lo, hi = 0, len(message)  # the longest prefix that fits: lo fits (checked below), hi does not
    if len(ids_for(FEEDBACK_ASK)) > budget:
        raise ValueError(
            f"the feedback turn of {problem.task_id} needs {len(ids_for(FEEDBACK_ASK))} tokens even with an "
            f"empty message, more than --feedback_tokens={budget} (raise it)"
        )
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if len(ids_for(message[:mid] + "...\n" + FEEDBACK_ASK)) <= budget:
            lo = mid
        else:
            hi = mid
    return ids_for(message[:lo] + "...\n" + FEEDBACK_ASK) if lo else ids_for(FEEDBACK_ASK)
