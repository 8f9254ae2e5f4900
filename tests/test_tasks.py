"""Tests for the procedural task suite (grpo_jax/codegen/tasks.py)."""

from __future__ import annotations

import doctest
import functools

import pytest

from grpo_jax.codegen import tasks
from grpo_jax.problem import Problem

PROMPT_MAX_CHARS = {0: 150, 1: 150, 2: 260, 3: 260, 4: 300}
BODY_MAX_CHARS = {0: 40, 1: 40, 2: 60, 3: 60, 4: 70}


@functools.cache
def _split(split: str, n: int, seed: int = 0) -> tuple[Problem, ...]:
    return tuple(tasks.make_split(split, levels=tasks.LEVELS, n_per_level=n, seed=seed))


def _strict_equal(got, expected) -> bool:
    if type(got) is not type(expected):
        return False
    if isinstance(expected, list | tuple):
        return len(got) == len(expected) and all(
            _strict_equal(a, b) for a, b in zip(got, expected, strict=True)
        )
    return got == expected


def _plain(value) -> bool:
    if value is None or type(value) in (int, bool, str):
        return True
    if type(value) in (list, tuple):
        return all(_plain(v) for v in value)
    return False


def test_determinism_by_seed():
    a = [tasks.generate(lv, i, seed=3) for lv in tasks.LEVELS for i in range(20)]
    b = [tasks.generate(lv, i, seed=3) for lv in tasks.LEVELS for i in range(20)]
    assert a == b
    c = [tasks.generate(lv, i, seed=4) for lv in tasks.LEVELS for i in range(20)]
    assert sum(x.prompt != y.prompt for x, y in zip(a, c, strict=True)) > 90
    assert tasks.make_split("heldout", levels=(2,), n_per_level=5, seed=1) == [
        tasks.generate(2, i, seed=1, split="heldout") for i in range(5)
    ]


def test_every_level_and_template_present():
    train = _split("train", 400)
    assert {p.level for p in train} == set(tasks.LEVELS)
    assert {p.level for p in _split("heldout", 100)} == set(tasks.LEVELS)
    for lv in tasks.LEVELS:
        assert len(tasks.templates_for_level(lv)) >= 8
    seen = {tasks.problem_signature(p.level, i % 400)[0] for i, p in enumerate(train)}
    assert seen == {t.name for t in tasks.all_templates()}


def test_problem_fields():
    for p in _split("train", 50) + _split("heldout", 20):
        assert p.source == "synthetic" and p.completion_mode == "append"
        lv, split, idx = p.level, p.split, int(p.task_id.rsplit("/", 1)[1])
        assert p.task_id == f"synthetic/L{lv}/{split}/{idx}"
        assert p.prompt.startswith(f"def {p.entry_point}(")
        assert p.prompt.endswith('\n    """\n')
        assert p.reference.startswith(p.prompt)
        body = tasks.reference_body(p)
        assert body.startswith("    return ") and body.endswith("\n") and body.count("\n") == 1
        assert p.program_for(body) == p.reference
        assert 5 <= len(p.tests) <= 8
        assert len({t.call for t in p.tests}) == len(p.tests)
        assert p.description and p.description in p.prompt
        for t in p.tests:
            assert _plain(t.expected)
            assert t.source == f"assert {t.call} == {t.expected!r}"
            assert t.call.startswith(f"{p.entry_point}(")
    assert tasks.generate(1, 7, seed=5).task_id == "synthetic/L1/train/7/s5"


def test_references_pass_their_tests_and_examples_are_correct():
    problems = _split("train", 300) + _split("heldout", 60)
    for p in problems:
        namespace: dict = {}
        exec(compile(p.reference, p.task_id, "exec"), namespace)
        for t in p.tests:
            got = eval(t.call, namespace)
            assert _strict_equal(got, t.expected), (p.task_id, t.source, got)
        # The docstring examples hold (doctest compares the repr text).
        docstring = namespace[p.entry_point].__doc__
        test = doctest.DocTestParser().get_doctest(docstring, dict(namespace), p.task_id, None, 0)
        assert len(test.examples) == (2 if p.level <= 1 else 3)
        runner = doctest.DocTestRunner(verbose=False)
        runner.run(test, out=lambda s: None)
        assert runner.failures == 0, p.prompt
        # Examples never reuse a hidden test's input.
        shown = {ex.source.strip() for ex in test.examples}
        assert not shown & {t.call for t in p.tests}, p.task_id


def test_edge_cases_in_tests():
    for p in _split("train", 100):
        calls = [t.call for t in p.tests]
        name = tasks.problem_signature(p.level, int(p.task_id.rsplit("/", 1)[1]))[0]
        args = tasks._BY_NAME[name].args
        if args == ("xs",):
            assert f"{p.entry_point}([])" in calls
        elif args == ("s",):
            assert f"{p.entry_point}('')" in calls
        else:
            assert f"{p.entry_point}(0)" in calls or f"{p.entry_point}(0, 0)" in calls
            assert any("-" in c for c in calls)


def test_splits_disjoint_by_signature_and_prompt():
    for t in tasks.all_templates():
        train, held = set(tasks.signatures(t.name, "train")), set(tasks.signatures(t.name, "heldout"))
        assert not train & held
        assert train | held == set(tasks.signatures(t.name))
        if t.consts:  # every template with constants is represented in both splits
            assert train and held, t.name
        else:
            assert not held, t.name
    n_train, n_held = 600, 200
    train = _split("train", n_train)
    held = _split("heldout", n_held)
    sig_train = {tasks.problem_signature(p.level, i % n_train) for i, p in enumerate(train)}
    sig_held = {tasks.problem_signature(p.level, i % n_held, split="heldout") for i, p in enumerate(held)}
    assert all(tasks.split_of(s) == "train" for s in sig_train)
    assert all(tasks.split_of(s) == "heldout" for s in sig_held)
    assert not sig_train & sig_held
    assert not {p.prompt for p in train} & {p.prompt for p in held}
    assert not {p.description for p in train} & {p.description for p in held}
    # The held-out split covers many signatures (not a handful repeated).
    assert len(sig_held) > 100


def test_description_identifies_signature():
    # Different signatures never share a description (so no prompt can be in both splits).
    seen: dict[str, tuple] = {}
    for t in tasks.all_templates():
        for names in tasks.ARG_NAMES[t.args]:
            for values in t.constant_space():
                description, _ = t.render(names, values)
                assert seen.setdefault(description, (t.name, *values)) == (t.name, *values), description


def test_prompt_and_body_lengths():
    for p in _split("train", 300) + _split("heldout", 60):
        assert len(p.prompt) <= PROMPT_MAX_CHARS[p.level], (p.level, len(p.prompt), p.prompt)
        assert len(tasks.reference_body(p)) <= BODY_MAX_CHARS[p.level], p.reference


def test_suite_config():
    cfg = tasks.TaskSuiteConfig(levels=(0, 3), seed=2, train_per_level=3, heldout_per_level=2)
    suite = tasks.make_suite(cfg)
    assert [p.level for p in suite["train"]] == [0, 0, 0, 3, 3, 3]
    assert [p.split for p in suite["heldout"]] == ["heldout"] * 4
    with pytest.raises(ValueError, match="levels"):
        tasks.TaskSuiteConfig(levels=(0, 9))
    with pytest.raises(ValueError, match="split"):
        tasks.generate(0, 0, split="test")
    with pytest.raises(ValueError, match="level"):
        tasks.generate(7, 0)
