"""Rewards as named, weighted functions (grpo_jax.rewards): the --rewards syntax, the built-ins' values,
ruff's static analysis of program text (never executed), the combination into the training reward
(multi_reward_advantages: sum then normalise, GDPO's normalise then sum), the per-reward figures, and a
user's function by import path (plain data in, one RewardError for each way it can be wrong)."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.codegen import pipeline
from grpo_jax.core import advantages as A
from grpo_jax.problem import Problem
from grpo_jax.rewards import builtin, registry, spec, static
from grpo_jax.rewards.metrics import reward_metrics
from grpo_jax.rewards.types import Grade, RewardProblem, Sample
from grpo_jax.rollout.grader import combine
from grpo_jax.sandbox.types import Status, Verdict
from grpo_jax.sandbox.types import TestResult as Result
from tests import reward_fixtures

# ----------------------------------------------------------------------------------------------------------
# the --rewards syntax
# ----------------------------------------------------------------------------------------------------------


def test_parse_names_weights_and_user_paths():
    assert spec.parse("tests") == (("tests", 1.0),)
    assert spec.parse("tests:1.0, format:0.1,lint:-0.5") == (("tests", 1.0), ("format", 0.1), ("lint", -0.5))
    assert spec.parse("tests,mypkg.rewards:style:0.2") == (("tests", 1.0), ("mypkg.rewards:style", 0.2))
    assert spec.parse("mypkg.rewards:style") == (("mypkg.rewards:style", 1.0),)
    assert spec.is_default("tests") and spec.is_default("tests:1") and not spec.is_default("tests:2")


@pytest.mark.parametrize(
    "bad, says",
    [
        ("", "empty item"),
        ("tests,,format", "empty item"),
        ("formt", "unknown reward 'formt'"),
        ("tests:1:2", "unknown reward 'tests:1'"),
        ("tests:1e999", "finite"),
        ("tests,tests:0.5", "given twice"),
        ("my-pkg:f", "unknown reward"),
    ],
)
def test_parse_refuses_with_the_reason(bad, says):
    with pytest.raises(spec.SpecError, match=says):
        spec.parse(bad)


def test_builtin_names_are_the_functions():
    assert tuple(spec.BUILTIN) == tuple(builtin.FUNCTIONS)


# ----------------------------------------------------------------------------------------------------------
# static analysis and the built-ins
# ----------------------------------------------------------------------------------------------------------


def test_ruff_reports_syntax_and_diagnostics_without_running_the_program(tmp_path):
    marker = tmp_path / "ran"
    programs = [
        "def f(:\n    pass\n",  # does not parse
        "import os\ndef g(x):\n    return y\n",  # unused import + undefined name
        "def h(x):\n    return x\n",  # clean
        f"open({str(marker)!r}, 'w').write('x')\nimport sys\nsys.exit(3)\n",  # would write a file if run
    ]
    got = static.analyse(programs)
    assert got == [
        static.Report(False, 0),
        static.Report(True, 2),
        static.Report(True, 0),
        static.Report(True, 1),  # E402: an import not at the top
    ]
    assert not marker.exists()


def _sample(
    reply="", program="", passed=True, tests=(True,), total=1, length=10, chat=True, tests_reward=None
):
    grade = Grade(
        passed, "passed" if passed else "wrong_answer", tuple(tests), ("x",) * len(tests), total, ""
    )
    prob = RewardProblem("t/0", "prompt", "", "f", "def f():\n    return 1\n", 0, "synthetic")
    r = float(passed) if tests_reward is None else tests_reward
    return Sample(prob, reply, program, grade, r, length, chat)


def test_builtin_values():
    one = "Here:\n```python\ndef f():\n    return 1\n```\n"
    two = one + "and\n```python\nx = 1\n```\n"
    s = [
        _sample(one, "def f():\n    return 1\n", length=10),
        _sample(
            two, "def f():\n    return 1\n", passed=False, tests=(True, False, False), total=4, length=14
        ),
        _sample("no fence", "def f(:\n", passed=False, tests=(), total=2, length=16),
        _sample("no fence", "import os\nx = y\n", chat=False, length=20),
    ]
    ctx = builtin.Context(s, max_len=16, length_cache=8)
    np.testing.assert_array_equal(builtin.tests(ctx), [1, 0, 0, 1])
    np.testing.assert_allclose(builtin.tests_fraction(ctx), [1, 0.25, 0, 1])
    np.testing.assert_array_equal(builtin.format_reward(ctx), [1, 0, 0, 1])  # plain format: parsing suffices
    np.testing.assert_allclose(builtin.lint(ctx), [1, 1, 0, 1 / 3])
    # DAPO: 0 up to 16 - 8 = 8 tokens, (8 - n) / 8 down to -1 at 16, -1 beyond
    np.testing.assert_allclose(builtin.length(ctx), [-0.25, -0.75, -1.0, -1.0])
    want = A.soft_overlong_punishment(jnp.asarray([10, 14, 16, 20]), max_len=16, cache_len=8)
    np.testing.assert_allclose(builtin.length(ctx), np.asarray(want), rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------
# the combination and the figures
# ----------------------------------------------------------------------------------------------------------


def _set(text, aggregation="sum_then_normalize"):
    return registry.resolve(text, aggregation, max_len=16, length_cache=4)


# one group of 4: tests [1, 0, 0, 1], format [1, 1, 0, 0]
PARTS = np.array([[[1, 1], [0, 1], [0, 0], [1, 0]]], np.float32)


def test_sum_then_normalize_is_the_weighted_sum():
    got = combine(PARTS, _set("tests:1.0,format:0.5"))
    np.testing.assert_allclose(got, [[1.5, 0.5, 0.0, 1.0]])


def test_normalize_then_sum_with_batch_std_is_gdpo_exactly():
    """GDPO: each reward z-scored in its group (std ddof 1 + eps), weighted sum; the trainer's batch_std
    advantage of that sum equals multi_reward_advantages' own advantage."""
    rs = _set("tests:1.0,format:0.5", "normalize_then_sum")
    parts = np.array([[[1, 1], [0, 1], [0, 0], [1, 0]], [[1, 0], [1, 1], [0, 1], [1, 1]]], np.float32)
    got = combine(parts, rs)
    z = 0.5 / (math.sqrt(1 / 3) + 1e-4)  # a {1, 1, 0, 0} group's z-score magnitude
    np.testing.assert_allclose(got[0], [1.5 * z, -0.5 * z, -1.5 * z, 0.5 * z], rtol=1e-5)
    adv = A.compute_advantages(jnp.asarray(got), method="batch_std", ddof=1, eps=1e-4)
    want, _ = A.multi_reward_advantages(
        jnp.asarray(parts), jnp.asarray([1.0, 0.5]), aggregation="normalize_then_sum"
    )
    np.testing.assert_allclose(np.asarray(adv), np.asarray(want), atol=1e-6)


def test_reward_metrics_literal():
    m = reward_metrics(PARTS, np.array([1.0, 0.5]), ["tests", "mod:fn"], "sum_then_normalize", eps=0.0)
    assert m["reward/tests/mean"] == 0.5 and m["reward/mod.fn/mean"] == 0.5
    assert m["reward/tests/std"] == 0.5
    # components w_k (r_k - mean): tests ±0.5 each (sum |.| = 2), format ±0.25 (sum 1): shares 2/3, 1/3
    assert m["reward/tests/adv_share"] == pytest.approx(2 / 3)
    assert m["reward/mod.fn/adv_share"] == pytest.approx(1 / 3)


# ----------------------------------------------------------------------------------------------------------
# a user's function
# ----------------------------------------------------------------------------------------------------------

PLAIN = (str, int, float, bool, type(None))


def _plain(x) -> bool:
    if isinstance(x, PLAIN):
        return True
    if isinstance(x, tuple):
        return all(_plain(v) for v in x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return all(_plain(getattr(x, f.name)) for f in dataclasses.fields(x))
    return False


def test_a_user_reward_gets_plain_data_only():
    """The grader's path: a Problem and a sandbox Verdict become RewardProblem / Grade of strings, numbers
    and tuples; the function never sees a live object (nor the program as anything but text)."""
    prob = Problem(task_id="t/1", prompt="def f():\n", entry_point="f", reference="def f():\n    return 1\n")
    v = Verdict(Status.WRONG_ANSWER, False, (Result(True, Status.PASSED), Result(False, Status.WRONG_ANSWER)))
    reply = "    return 2\n"
    program = prob.program_for(pipeline.completion_for(prob, reply))
    s = Sample(RewardProblem.of(prob), reply, program, Grade.of(v, 3), 0.0, 4, False)
    reward_fixtures.SEEN.clear()
    parts = _set("tests,tests.reward_fixtures:record:0.2").compute([s])
    np.testing.assert_array_equal(parts, [[0.0, 0.5]])
    (args,) = reward_fixtures.SEEN
    assert all(_plain(a) for a in args)
    assert type(args[1]) is str and type(args[2]) is str and args[2] == "def f():\n    return 2\n"
    assert args[3].tests == (True, False) and args[3].tests_total == 3 and args[3].status == "wrong_answer"


@pytest.mark.parametrize(
    "name, says",
    [
        ("tests.no_such_module:f", "cannot import 'tests.no_such_module'"),
        ("tests.reward_fixtures:missing", "has no callable 'missing'"),
        (
            "tests.reward_fixtures:two_args",
            r"must take \(problem, reply, program, grade\).*two_args\(problem, reply\)",
        ),
    ],
)
def test_an_unusable_user_reward_is_one_error_at_resolve(name, says):
    with pytest.raises(registry.RewardError, match=says):
        _set(f"tests,{name}")


@pytest.mark.parametrize(
    "name, says",
    [
        ("raises", r"reward tests.reward_fixtures:raises raised ZeroDivisionError: boom \(problem t/0\)"),
        ("nan", r"returned nan for problem t/0: a reward must be a finite float"),
        ("text", r"returned '1.0' for problem t/0"),
    ],
)
def test_a_failing_user_reward_names_itself_and_the_problem(name, says):
    rs = _set(f"tests.reward_fixtures:{name}")
    with pytest.raises(registry.RewardError, match=says):
        rs.compute([_sample()])


def test_the_example_rewards_documented_in_docs():
    rs = _set("experiments.reward_examples:brevity,experiments.reward_examples:no_print")
    s = [_sample(program="def f():\n    return 1\n"), _sample(program="x" * 46 + "print(1)", passed=False)]
    np.testing.assert_allclose(rs.compute(s), [[1.0, 1.0], [0.0, 0.0]])
