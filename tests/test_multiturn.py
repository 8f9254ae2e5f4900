"""Multi-turn execution feedback (--max_turns): the feedback message from the visible tests only, the packed
trajectory with its loss mask, rewards and group advantages over trajectories (literal values), a hidden-test
marker that never reaches the model, and the refusals of mechanisms that do not take trajectories.

The model is replaced by a scripted sampler (it returns given replies and records every context it is shown);
the problems, tokenizer, sandbox and grading are the real ones."""

import collections
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import cli
from grpo_jax.codegen import feedback, pipeline, tasks
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.advantages import group_zscore
from grpo_jax.problem import Problem, TestCase
from grpo_jax.rollout.grader import GradeLimits, Grader
from grpo_jax.rollout.multiturn import MultiTurn, bucket, trajectory_rewards, turn_metrics
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits, Status, Verdict
from grpo_jax.sandbox.types import TestResult as Result
from grpo_jax.tokenization import CodeTokenizer
from grpo_jax.train import step as step_lib
from grpo_jax.types import SampleOutput, batch_from_samples

TOK = CodeTokenizer()
MARK = "ZQXHIDDEN"


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as e:
        yield e


def test_bucket_and_trajectory_rewards_literal():
    assert [bucket(n, 16) for n in (0, 1, 2, 3, 5, 8, 9, 16)] == [1, 1, 2, 4, 8, 8, 16, 16]
    assert bucket(9, 12) == 12
    r = trajectory_rewards(np.array([True, False, True, True]), np.array([1, 2, 2, 3]), 0.5)
    np.testing.assert_array_equal(r, np.array([1.0, 0.0, 0.5, 0.25], np.float32))
    np.testing.assert_array_equal(
        trajectory_rewards(np.array([True, True]), np.array([1, 3]), 1.0), [1.0, 1.0]
    )


def test_group_advantage_over_trajectories_literal():
    """G = 4 trajectories: passed at turn 1, passed at turn 2 (discount 0.5), failed twice, passed at turn 2:
    rewards [1, 0.5, 0, 0.5], mean 0.5, sample std sqrt(1/6) = 0.40825: advantages (r - 0.5) / (0.40825 +
    1e-4)."""
    r = trajectory_rewards(np.array([True, True, False, True]), np.array([1, 2, 2, 2]), 0.5)
    adv = np.asarray(group_zscore(jnp.asarray(r)[None]))[0]
    np.testing.assert_allclose(adv, [1.22444, 0.0, -1.22444, 0.0], atol=1e-4)


def _call_problem(public, hidden, **kw):
    return Problem(
        task_id="t/1",
        prompt="def f(x):\n",
        entry_point="f",
        reference="def f(x):\n    return x + 1\n",
        tests=tuple(hidden),
        public_tests=tuple(public),
        **kw,
    )


def test_feedback_messages_literal():
    p = _call_problem([TestCase(call="f(1)", expected=2)], [TestCase(call="f(5)", expected=6)])
    wrong = Verdict(Status.WRONG_ANSWER, False, (Result(False, Status.WRONG_ANSWER, got="3"),))
    assert feedback.feedback_message(p, wrong) == (
        "Your program failed this example:\n>>> f(1)\nExpected: 2\nGot: 3\nFix the program."
    )
    err = Verdict(Status.RUNTIME_ERROR, False, (Result(False, Status.RUNTIME_ERROR, error="NameError: y"),))
    assert feedback.feedback_message(p, err).splitlines()[-2:] == ["Error: NameError: y", "Fix the program."]
    syn = Verdict(Status.SYNTAX_ERROR, False, (), detail="SyntaxError: invalid syntax (line 2)")
    assert feedback.feedback_message(p, syn) == (
        "Your program failed to run: SyntaxError: invalid syntax (line 2)\nFix the program."
    )
    ok = Verdict(Status.PASSED, True, (Result(True, Status.PASSED),))
    assert (
        feedback.feedback_message(p, ok)
        == "Your program passes the examples but fails other tests.\nFix the program."
    )
    bare = dataclasses.replace(p, public_tests=())
    assert (
        feedback.feedback_message(bare, Verdict(Status.PASSED, True))
        == "Your program fails the tests.\nFix the program."
    )
    sp = dataclasses.replace(
        p, public_tests=(TestCase(call="", kind="stdout", stdin="1 2\n", expected="3\n"),), test_kind="stdio"
    )
    wa = Verdict(Status.WRONG_ANSWER, False, (Result(False, Status.WRONG_ANSWER, got="4\n"),))
    assert feedback.feedback_message(sp, wa) == (
        "Your program failed this example.\nInput:\n1 2\n\nExpected output:\n3\n\n"
        "Your output:\n4\n\nFix the program."
    )


def test_public_run_reports_the_actual_value_and_output(ex):
    """The sandbox's wrong answers carry what the program produced (TestResult.got), for call and stdout
    tests."""
    p = _call_problem([TestCase(call="f(1)", expected=2), TestCase(call="f(2)", expected=3)], [])
    (v,) = ex.run(feedback.public_jobs([p], ["def f(x):\n    return [x] * 3\n"]))
    assert [t.got for t in v.tests] == ["[1, 1, 1]"]  # stopped at the first failure
    stdio = TestCase(call="", kind="stdout", stdin="2\n", expected="4\n")
    (v,) = ex.run(
        feedback.public_jobs([dataclasses.replace(p, public_tests=(stdio,))], ["print(int(input()) + 1)"])
    )
    assert v.tests[0].got == "3\n" and v.tests[0].status is Status.WRONG_ANSWER


def test_continuation_is_cut_to_the_budget():
    p = tasks.generate(0, 0)
    long = "Your program failed to run: " + "x" * 500 + "\nFix the program."
    ids = feedback.continuation_ids(TOK, pipeline.PLAIN, p, long, ended_with=TOK.eos_id, budget=120)
    text = TOK.decode(ids)
    assert (
        len(ids) <= 120
        and text.startswith("\n# Your program failed to run: xxx")
        and "...\n# Fix the program." in text
    )
    assert text.endswith(p.prompt)  # the plain format shows the prompt again
    with pytest.raises(ValueError, match="--feedback_tokens=10"):
        feedback.continuation_ids(TOK, pipeline.PLAIN, p, long, ended_with=TOK.eos_id, budget=10)


def test_a_feedback_budget_that_cannot_fit_is_refused_before_the_run(ex, tmp_path):
    """A feedback turn longer than --feedback_tokens even with an empty message (the plain format restates
    the prompt) is one error at start-up, not a traceback at the first failed reply."""
    import mainjob

    from grpo_jax.train.build import RunConfigError

    p = tasks.generate(0, 0)
    n = len(TOK.encode("\n# Fix the program.\n" + p.prompt))  # the plain turn of an empty message
    feedback.check_feedback_budget(TOK, pipeline.PLAIN, [p], n)  # fits exactly
    with pytest.raises(
        ValueError, match=rf"^--feedback_tokens={n - 1}: the feedback turn of {p.task_id} needs {n} "
    ):
        feedback.check_feedback_budget(TOK, pipeline.PLAIN, [p], n - 1)
    wd = tmp_path / "w"
    with pytest.raises(
        RunConfigError, match=r"^--feedback_tokens=8: the feedback turn of \S+ needs \d+ tokens"
    ):
        mainjob.run(mainjob.TINY, "--max_turns=2", "--feedback_tokens=8", workdir=wd, executor=ex)
    assert not (wd / "run.json").exists()


class ScriptedEngine:
    """Stands in for the rollout engine (grpo_jax.rollout.engines protocol): turn k's reply of row r is
    replies[k][r]; records every context shown."""

    kind = "scripted"

    def __init__(self, replies: dict[int, dict[int, str]], T: int):
        self.replies, self.T, self.contexts, self.feedback, self.turn = replies, T, [], [], 1
        self.max_new, self.eos_ids = T, (TOK.eos_id,)

    def encode(self, rows: list[str]) -> SampleOutput:
        n = len(rows)
        tok = np.zeros((n, 1, self.T), np.int32)
        mask = np.zeros((n, 1, self.T), np.float32)
        for i, text in enumerate(rows):
            ids = (TOK.encode(text) + [TOK.eos_id])[: self.T]
            tok[i, 0, : len(ids)], mask[i, 0, : len(ids)] = ids, 1.0
        lp = -0.5 * mask
        return SampleOutput(tok, lp, mask, mask.sum(-1).astype(np.int32), mask.sum(-1)[:, 0:1] >= self.T)

    def _reply(self, n):
        self.turn += 1
        script = self.replies[self.turn]
        rows = [script[min(script)] if i >= len(script) else script[sorted(script)[i]] for i in range(n)]
        return self.encode(rows), np.arange(n)  # (the "conversations": row numbers, so `select` works)

    def select(self, conv, rows):
        return np.asarray(conv)[np.asarray(rows)]

    def from_tokens(self, params, ctx, cmask, key, *, sp):
        ctx, cmask = np.asarray(ctx), np.asarray(cmask)
        self.contexts += [
            TOK.decode(row[m > 0].tolist(), skip_special=False) for row, m in zip(ctx, cmask, strict=True)
        ]
        return self._reply(len(ctx))

    def extend(self, params, rc, tokens, mask, key, *, sp):
        tokens, mask = np.asarray(tokens), np.asarray(mask)
        self.feedback += [
            TOK.decode(row[m > 0].tolist(), skip_special=False) for row, m in zip(tokens, mask, strict=True)
        ]
        return self._reply(len(tokens))


def _run(ex, problems, G, replies, *, K=2, F=120, T=24, discount=1.0, record=False):
    s = ScriptedEngine(replies, T)
    grader = Grader(ex, GradeLimits(), TOK, pipeline.PLAIN, group=G, num_tests=8)
    mt = MultiTurn(
        s,
        grader,
        TOK,
        pipeline.PLAIN,
        max_turns=K,
        feedback_tokens=F,
        max_new=T,
        discount=discount,
        record=record,
    )
    first = s.encode([replies[1][r] for r in range(len(problems) * G)])
    first = SampleOutput(
        *(np.asarray(x).reshape(len(problems), G, *np.asarray(x).shape[2:]) for x in first[:3]),
        None,
        np.asarray(first.truncated).reshape(len(problems), G),
    )
    prompt, pmask = pipeline.encode_prompts(TOK, problems, 160)
    grades = grader.grade(problems, first.tokens, first.mask)
    out, g, counts, _ = mt.run(None, problems, prompt, pmask, first, grades, jax.random.key(0))
    return s, out, g, counts


def test_trajectory_packing_mask_and_rewards_literal(ex):
    """Row 0 passes at turn 1 (its trajectory is that reply), rows 1 and 2 fail and get one feedback turn: row
    1 is fixed at turn 2, row 2 is not. The packed completion is reply 1 | feedback | reply 2 with no gap; the
    loss mask is 1 exactly on the model's tokens; logp is the sampler's there and 0 elsewhere."""
    p = tasks.generate(0, 3)
    good, bad = pipeline.reference_body(p), "    return 12345\n"
    replies = {1: {0: good, 1: bad, 2: bad}, 2: {1: good, 2: bad}}
    s, out, g, counts = _run(ex, [p], 3, replies, record=True)
    n_good, n_bad = len(TOK.encode(good)) + 1, len(TOK.encode(bad)) + 1  # + EOS
    tokens, mask, logp = (np.asarray(x)[0] for x in (out.tokens, out.mask, out.logp))
    assert tokens.shape == (3, 2 * 24 + 120)
    np.testing.assert_array_equal(mask[0], np.r_[np.ones(n_good), np.zeros(168 - n_good)])
    for r, second in ((1, n_good), (2, n_bad)):
        row = mask[r]
        first_zero = int(np.argmin(row))
        assert first_zero == n_bad and row[:n_bad].all()
        start2 = first_zero + int(np.argmax(row[first_zero:] > 0))  # the feedback turn's length
        assert (
            0 < start2 - n_bad <= 120
            and row[start2 : start2 + second].all()
            and not row[start2 + second :].any()
        )
        np.testing.assert_array_equal(logp[r], -0.5 * row)
        assert TOK.decode(tokens[r, n_bad:start2].tolist()).startswith("\n# Your program failed")
        # turn 2 was shown exactly the prompt, reply 1 and the feedback
        assert s.contexts[r - 1] == TOK.decode(
            np.r_[TOK.encode(p.prompt), tokens[r, :start2]].tolist(), skip_special=False
        )
    np.testing.assert_array_equal(g.rewards, [[1.0, 1.0, 0.0]])
    np.testing.assert_array_equal(np.asarray(out.lengths), [[n_good, n_bad + n_good, 2 * n_bad]])
    m = turn_metrics([counts])
    assert m["multiturn/pass_after_turn1"] == pytest.approx(1 / 3) and m[
        "multiturn/pass_after_turn2"
    ] == pytest.approx(2 / 3)
    assert m["multiturn/fix_rate"] == 0.5 and m["multiturn/turns_mean"] == pytest.approx(5 / 3)
    # the train step's loss mask is the trajectory's model-token mask (feedback and padding never trained on)
    batch = batch_from_samples(
        jnp.asarray(np.zeros((1, 4), np.int32)), jnp.ones((1, 4), jnp.int32), out, g.rewards
    )
    _, _, _, loss_mask = step_lib.prepare(batch, ObjectiveConfig())
    np.testing.assert_array_equal(np.asarray(loss_mask)[0], mask)
    # the later turns as text (the evaluator's samples.jsonl): the feedback exactly as packed, each reply, its
    # grade; none for the row that passed turn 1
    later = counts["later"]
    assert later[0] == []
    for r, reply, ok in ((1, good, True), (2, bad, False)):
        (turn2,) = later[r]
        start2 = n_bad + int(np.argmax(mask[r, n_bad:] > 0))
        assert turn2["turn"] == 2 and turn2["reply"] == reply and turn2["passed"] is ok
        assert turn2["feedback"] == TOK.decode(tokens[r, n_bad:start2].tolist(), skip_special=False)
        assert turn2["status"] == ("passed" if ok else "wrong_answer")
    # the discount: row 1 passed at turn 2; without record no text is kept
    _, _, g2, c2 = _run(ex, [p], 3, replies, discount=0.5)
    np.testing.assert_array_equal(g2.rewards, [[1.0, 0.5, 0.0]])
    assert "later" not in c2


def test_hidden_tests_never_reach_the_model(ex):
    """A marker planted in every hidden test (call tests: the call and the expected value; stdin/stdout tests:
    the input and the expected output) is absent from every context of every turn, for programs that fail a
    public test, that pass the public tests but fail a hidden one, that crash, and that do not compile."""
    call = _call_problem(
        [TestCase(call="f(1)", expected=2)],
        [TestCase(call=f"f('{MARK}')", expected=f"{MARK}1"), TestCase(call="f(7)", expected=MARK)],
    )
    stdio = dataclasses.replace(
        call,
        task_id="t/2",
        completion_mode="program",
        test_kind="stdio",
        public_tests=(TestCase(call="", kind="stdout", stdin="1\n", expected="2\n"),),
        tests=(TestCase(call="", kind="stdout", stdin=f"{MARK}\n", expected=f"{MARK}!\n"),),
    )
    programs = {
        0: "    return x + 1\n",  # passes the public test, fails the hidden ones
        1: "    return x * 5\n",  # fails the public test
        2: "    raise ValueError(x)\n",
        3: "    return (\n",
    }
    replies = {1: programs, 2: programs, 3: programs}
    s, _, g, _ = _run(ex, [call], 4, replies, K=3)
    scripts = {0: "print(int(input()) + 1)", 1: "print(0)", 2: "raise ValueError(input())", 3: "print(("}
    s2, _, g2, _ = _run(ex, [stdio], 4, {1: scripts, 2: scripts, 3: scripts}, K=3)
    # turn 2 re-encodes the conversation (no first-turn cache here), turn 3 continues it from the feedback
    shown = s.contexts + s2.contexts + s.feedback + s2.feedback + g.texts + g2.texts
    assert len(s.contexts) >= 4 and len(s2.contexts) >= 4 and len(s.feedback) >= 4 and len(s2.feedback) >= 4
    assert all(MARK not in c for c in shown)
    assert any("passes the examples but fails other tests" in c for c in s.contexts + s2.contexts)
    assert any("passes the examples but fails other tests" in c for c in s.feedback + s2.feedback)
    assert any("# >>> f(1)\n# Expected: 2\n# Got: 5\n" in c for c in s.contexts)


def test_mechanisms_without_trajectories_are_refused(tmp_path):
    base = [
        "codegen",
        "--flagfile=experiments/flagfiles/tiny_test.flags",
        f"--workdir={tmp_path}",
        "--max_turns=2",
    ]
    for extra, path in (
        ("--algorithm=ppo", "--algorithm"),
        ("--pool_capacity=2", "--pool_capacity"),
        ("--replay_fraction=0.25", "--replay_fraction"),
    ):
        with pytest.raises(Exception, match=f"{path}.*not with --max_turns=2"):
            cli.resolve([*base, extra, "--tis_cap=2"])
    for bad in ("--max_turns=0", "--feedback_tokens=0", "--turn_discount=1.5"):
        with pytest.raises(Exception, match=bad.split("=")[0]):
            cli.resolve([*base[:-1], bad])


def test_chat_feedback_turn_is_the_templates_own_rendering():
    """SmolLM2's chat template: prompt + reply (ending in its end-of-turn token) + the continuation decode to
    exactly the template's rendering of [user, assistant reply, user feedback] with the next assistant
    opening."""
    from conftest import smollm2_gguf_path

    from grpo_jax.tokenization import load_tokenizer

    tok = load_tokenizer(smollm2_gguf_path())
    fmt = pipeline.PromptFormat(kind="chat")
    p = tasks.generate(0, 3)
    msg = "Your program failed to run: NameError: y\nFix the program."
    reply = "```python\ndef solve(a, b):\n    return y\n```"
    end = tok.encode("<|im_end|>")
    assert len(end) == 1
    ids = tok.encode(pipeline.render_prompt(tok, p, fmt)) + tok.encode(reply) + end
    ids += feedback.continuation_ids(tok, fmt, p, msg, ended_with=end[0], budget=128)
    want = pipeline.render_messages(p, fmt) + [
        {"role": "assistant", "content": reply},
        {"role": "user", "content": msg.replace(feedback.FEEDBACK_ASK, feedback.FEEDBACK_ASK_CHAT)},
    ]
    assert tok.decode(ids, skip_special=False) == tok.apply_chat_template(want, add_generation_prompt=True)


def test_two_turn_run_with_async_grading_resumes_bit_identically_after_sigkill(ex, tmp_path):
    """The main job with --max_turns=2 (and asynchronous grading: the checkpoint holds the graded next batch
    of trajectories): it logs the per-turn figures and samples whole trajectories; killed with SIGKILL after
    its step-4 checkpoint, the same command resumes and ends bit-identical to the uninterrupted run."""
    import json

    import mainjob

    args = (mainjob.TINY, "--max_turns=2", "--feedback_tokens=96", "--async_rewards", "--tis_cap=2")
    ref, _ = mainjob.run(*args, workdir=tmp_path / "ref", executor=ex)
    m = mainjob.metrics(tmp_path / "ref")
    assert sorted(m) == [1, 2, 3, 4, 5, 6]
    for key in (
        "multiturn/turns_mean",
        "multiturn/fix_rate",
        "multiturn/pass_after_turn2",
        "multiturn/reply_len_turn1",
    ):
        assert key in m[6], key
    assert 1.0 <= m[6]["multiturn/turns_mean"] <= 2.0
    # the sampler's log-probs of turn 2 (continued from turn 1's KV cache) are the trainer's on the packed
    # trajectory: mean |difference| over the model's tokens ~1e-7, as single-turn (turn-2 positions shifted by
    # one gave 6e-6 with this tiny random model; tests/test_continuation.py checks each token)
    assert m[1]["logp_mismatch"] < 1e-6  # (later steps are one update off-policy: async grading)
    assert min(m[s]["time/reward_s"] for s in m) > 0  # every turn's grading and feedback runs are timed
    samples = [json.loads(x) for x in (tmp_path / "ref" / "samples.jsonl").read_text().splitlines()]
    assert any("# Fix the program." in s["completion"] for s in samples)  # whole trajectories are logged
    # the checkpoint evaluator runs the run's own turns: turn 1's figures are the plain ones, turn 2 >= turn 1
    from experiments import evaluate as ev

    o = ev.PolicyEval(problems="heldout", out_dir=str(tmp_path / "ev"), checkpoint=str(tmp_path / "ref"))
    res = ev.evaluate_policy(o, ex, log=lambda _: None)
    assert res["sampling"]["max_turns"] == 2 and set(res["turns"]) == {"turn1", "turn2", "fix_rate"}
    assert res["turns"]["turn1"]["greedy/pass@1"] == res["metrics"]["greedy/pass@1"]
    assert res["turns"]["turn1"]["pass@2"] == res["metrics"]["pass@2"]
    assert res["turns"]["turn2"]["pass@1"] >= res["turns"]["turn1"]["pass@1"]
    with pytest.raises(ev.UsageError, match=r"^--feedback_tokens=8: the feedback turn of "):
        ev.evaluate_policy(
            dataclasses.replace(o, feedback_tokens=8, out_dir=str(tmp_path / "ev8")), ex, log=lambda _: None
        )
    # samples.jsonl: turn 1's reply and grade, and the later turns of the samples that failed it; passed
    # after turn 2 per sample agrees with the turn-2 figure
    rows = [json.loads(x) for x in (tmp_path / "ev" / "samples.jsonl").read_text().splitlines()]
    assert all((r["later_turns"] == []) == r["passed"] for r in rows)
    assert all([t["turn"] for t in r["later_turns"]] == [2] for r in rows if not r["passed"])
    assert all("# Your program failed" in r["later_turns"][0]["feedback"] for r in rows if not r["passed"])
    # each feedback restates its own task's prompt (the samples' order is kept across tasks)
    restated = [
        (r["program"], r["later_turns"][0]["feedback"].split("# Fix the program.\n", 1)[1])
        for r in rows
        if not r["passed"] and "# Fix the program.\n" in r["later_turns"][0]["feedback"]
    ]
    assert restated and all(program.startswith(prompt) and prompt for program, prompt in restated)
    after2 = [r["passed"] or r["later_turns"][0]["passed"] for r in rows]
    assert np.mean(after2) == pytest.approx(res["turns"]["turn2"]["pass@1"])
    c2 = collections.Counter(r["task_id"] for r, ok in zip(rows, after2, strict=True) if ok)
    tasks2 = {r["task_id"] for r in rows}  # pass@2 after turn 2 from each task's own samples (n = 2)
    assert np.mean([pass_at_k(2, c2[t], 2) for t in tasks2]) == pytest.approx(res["turns"]["turn2"]["pass@2"])
    wd = tmp_path / "killed"
    got = mainjob.killed_and_resumed(*args, workdir=wd, step=4)
    assert got["final_params_sha256"] == ref["final_params_sha256"]
    assert sorted(mainjob.metrics(wd)) == [1, 2, 3, 4, 5, 6]


def test_pass_at_k_after_each_turn_literal():
    """Two problems x 4 samples; the turn at which each passed (0: never): [1, 0, 2, 2] and [0, 0, 0, 1].
    After turn 1: 1 and 1 of 4 pass; after turn 2: 3 and 1 of 4. pass@2 = 1 - C(n - c, 2) / C(n, 2)."""
    from grpo_jax.eval.results import turn_summaries

    pt = np.array([1, 0, 2, 2, 0, 0, 0, 1])
    m = pipeline._turn_metrics(pt, 4, [1, 2], 2)
    assert m["turn1/pass@1"] == 0.25 and m["turn2/pass@1"] == 0.5
    assert m["turn1/pass@2"] == pytest.approx(0.5) and m["turn2/pass@2"] == pytest.approx((1.0 + 0.5) / 2)
    d = {"greedy_turn": np.array([2, 0]), "sampled_turn": pt}
    s = turn_summaries(d, 4, [1, 2], 2)
    assert s["turn1"]["greedy/pass@1"] == 0.0 and s["turn2"]["greedy/pass@1"] == 0.5
    assert s["turn2"]["pass@2"] == pytest.approx(0.75)
    assert s["fix_rate"] == {"greedy": 0.5, "sampled": pytest.approx(2 / 6)}


def test_mbpp_feedback_shows_a_failing_assert_of_its_prompt(ex):
    """MBPP's prompt lists its test asserts, so they are public: a wrong program's feedback quotes the first
    failing one, which is text the prompt already holds."""
    from grpo_jax.codegen.datasets import load_mbpp

    p = next(q for q in load_mbpp(split="test") if q.public_tests and q.child_check is None)
    (v,) = ex.run(feedback.public_jobs([p], [f"def {p.entry_point}(*args):\n    return None\n"]))
    msg = feedback.feedback_message(p, v)
    tc = p.public_tests[0]
    assert (
        msg.startswith(f"Your program failed this example:\n>>> {tc.call}\nExpected: ") and "Got: None" in msg
    )
    assert tc.source in p.prompt
