"""Example user rewards for `--rewards=module:function` (docs/REWARDS.md): plain functions of
(problem, reply, program, grade) -> float, called in the trainer process on plain data.

    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags \\
        --rewards=tests,experiments.reward_examples:brevity:0.1
"""

from __future__ import annotations


def brevity(problem, reply: str, program: str, grade) -> float:
    """min(1, len(reference) / len(program)) for a program that passes, else 0: among passing programs, the
    shorter earns more (a solution as short as the reference gets 1)."""
    if not grade.passed or not program:
        return 0.0
    return min(1.0, len(problem.reference) / len(program))


def no_print(problem, reply: str, program: str, grade) -> float:
    """1 when the reply prints nothing (no `print(` in the program text), else 0: call-based problems grade
    return values, and a print is usually left-over debugging."""
    return 0.0 if "print(" in program else 1.0
