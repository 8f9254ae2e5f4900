"""The run's rewards: `--rewards` resolved to functions (built-in or a user's by import path) and weights.

    rewards = resolve("tests:1.0,format:0.1", max_len=512, length_cache=128)   # RewardError if bad
    parts = rewards.compute(samples)           # [N, F] float32, one column per reward, in --rewards order

A user's function is imported here, at the start of the run (a missing module or function, or a signature
that does not take (problem, reply, program, grade), is one RewardError before anything is written); it is
called on plain data (grpo_jax.rewards.types); one that raises or returns anything but a finite number is one
RewardError naming the function and the problem.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import math
import numbers
from collections.abc import Callable, Sequence

import numpy as np

from grpo_jax.errors import RunConfigError
from grpo_jax.rewards import builtin, spec
from grpo_jax.rewards.types import Sample


class RewardError(RunConfigError):
    """A reward function cannot be used or failed: one line, exit status 2 (experiments/codegen.py); the
    workdir keeps its last checkpoint, so the fixed run resumes."""


@dataclasses.dataclass(frozen=True)
class Reward:
    name: str  # a built-in name or "module:function"
    weight: float
    fn: Callable  # builtin: Context -> [N]; user: (problem, reply, program, grade) -> float
    user: bool


def load_user(name: str) -> Callable:
    """The callable `module:function`, checked to take four positional arguments; RewardError otherwise."""
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # ImportError, or the module itself failed on import
        raise RewardError(  # noqa: B904 (one line: the cause is in the message)
            f"--rewards: cannot import {module_name!r} for reward {name!r}: {type(e).__name__}: {e}"
        )
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"--rewards: {module_name!r} has no callable {attr!r} (reward {name!r})")
    try:
        inspect.signature(fn).bind(None, None, None, None)
    except TypeError:
        raise RewardError(
            f"--rewards: {name} must take (problem, reply, program, grade) and return a float; its signature "
            f"is {name.partition(':')[2]}{inspect.signature(fn)}"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): it is called and checked then
        pass
    return fn


class RewardSet:
    """The weighted rewards of a run (see the module docstring)."""

    def __init__(
        self,
        rewards: Sequence[Reward],
        aggregation: str,
        max_len: int,
        length_cache: int,
        eps: float = 1e-4,
        success_threshold: float = 1.0,
    ):
        self.rewards, self.aggregation = tuple(rewards), aggregation
        self.max_len, self.length_cache, self.eps = max_len, length_cache, eps
        self.success_threshold = success_threshold  # a sample succeeds at a test reward >= this

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(r.name for r in self.rewards)

    @property
    def weights(self) -> np.ndarray:
        return np.asarray([r.weight for r in self.rewards], np.float32)

    @property
    def trivial(self) -> bool:
        """Only the test reward, weight 1, summed: the training reward is the grader's, bit for bit."""
        return (
            self.names == ("tests",) and self.weights[0] == 1.0 and self.aggregation == "sum_then_normalize"
        )

    def compute(self, samples: Sequence[Sample]) -> np.ndarray:
        """[N, F] float32: reward f of sample i (RewardError on a failing user function)."""
        ctx = builtin.Context(samples, self.max_len, self.length_cache)
        cols = [self._column(r, ctx) for r in self.rewards]
        return np.stack(cols, axis=1).astype(np.float32) if cols else np.zeros((len(samples), 0), np.float32)

    def _column(self, r: Reward, ctx: builtin.Context) -> np.ndarray:
        if not r.user:
            return np.asarray(r.fn(ctx), np.float64).reshape(len(ctx.samples))
        out = np.empty(len(ctx.samples), np.float64)
        for i, s in enumerate(ctx.samples):
            try:
                v = r.fn(s.problem, s.reply, s.program, s.grade)
            except Exception as e:
                raise RewardError(
                    f"reward {r.name} raised {type(e).__name__}: {e} (problem {s.problem.task_id})"
                ) from e
            if not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
                raise RewardError(
                    f"reward {r.name} returned {v!r} for problem {s.problem.task_id}: a reward must be a "
                    "finite float"
                )
            out[i] = float(v)
        return out


def resolve(
    text: str,
    aggregation: str = "sum_then_normalize",
    *,
    max_len: int,
    length_cache: int,
    eps: float = 1e-4,
    success_threshold: float = 1.0,
) -> RewardSet:
    """The RewardSet of a --rewards value (spec.parse), user functions imported and checked; `eps` is added to
    the stds of the normalisations (the objective's --adv_eps)."""
    try:
        items = spec.parse(text)
    except spec.SpecError as e:
        raise RewardError(f"--rewards={text}: {e}") from None
    if aggregation not in spec.AGGREGATIONS:
        raise RewardError(f"--reward_aggregation={aggregation}: valid: {', '.join(spec.AGGREGATIONS)}")
    rewards = []
    for name, w in items:
        if name in builtin.FUNCTIONS:
            rewards.append(Reward(name, w, builtin.FUNCTIONS[name], user=False))
        else:
            rewards.append(Reward(name, w, load_user(name), user=True))
    return RewardSet(rewards, aggregation, max_len, length_cache, eps, success_threshold)


def from_config(cfg) -> RewardSet:
    """The RewardSet of a RunConfig (its rewards section, L_max = max_new_tokens x max_turns, --adv_eps,
    --success_threshold)."""
    rw, ro = cfg.rewards, cfg.rollout
    max_len = ro.max_new_tokens * ro.max_turns
    return resolve(
        rw.functions,
        rw.aggregation,
        max_len=max_len,
        length_cache=rw.cache_len(max_len),
        eps=cfg.objective.adv_eps,
        success_threshold=cfg.objective.success_threshold,
    )
