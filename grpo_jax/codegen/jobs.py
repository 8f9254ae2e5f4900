"""Problems + completions -> sandbox jobs (host side, no JAX).

The bridge between the problem type (`grpo_jax.problem`) and the sandbox (`grpo_jax.sandbox`), kept here so
that the sandbox never imports the problem type.
"""

from __future__ import annotations

from collections.abc import Sequence

from grpo_jax.problem import Problem
from grpo_jax.sandbox.types import Job, Limits


def jobs_for(
    problems: Sequence[Problem],
    completions: Sequence[str],
    limits: Limits | None = None,
    stop_on_failure: bool = False,
) -> list[Job]:
    """One Job per (problem, completion) pair. `completions` may also be a multiple of len(problems): then
    each problem is repeated for its consecutive group of completions (GRPO groups). `stop_on_failure`
    (Job.stop_on_failure): a program's tests end at its first failure (the pass/fail verdict is the same; the
    tests after it are reported as not run)."""
    problems = list(problems)
    completions = list(completions)
    if not problems:
        if completions:
            raise ValueError("completions given but no problems")
        return []
    if len(completions) % len(problems) != 0:
        raise ValueError(f"{len(completions)} completions for {len(problems)} problems")
    g = len(completions) // len(problems)
    jobs = []
    for j, c in enumerate(completions):
        p = problems[j // g]
        jobs.append(
            Job(
                program=p.program_for(c),
                tests=tuple(p.tests),
                child_check=p.child_check,
                setup_code=p.setup_code,
                limits=limits,
                time_limit_s=p.time_limit_s,
                stop_on_failure=stop_on_failure,
            )
        )
    return jobs
