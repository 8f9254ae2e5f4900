"""Host-side codegen pipeline: prompt / SFT encoding, decoding, sandbox scoring, evaluation (no JAX)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_jax.codegen import pipeline
from grpo_jax.codegen.tasks import make_split
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits, Status
from grpo_jax.tokenization import decode_completions
from grpo_jax.tokenization.code import CodeTokenizer

TOK = CodeTokenizer()
PROBLEMS = make_split("train", levels=(0, 2), n_per_level=3, seed=0)


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as e:
        yield e


def test_encode_prompts_left_padded_round_trip():
    ids, mask = pipeline.encode_prompts(TOK, PROBLEMS, 128)
    assert ids.shape == mask.shape == (len(PROBLEMS), 128) and ids.dtype == mask.dtype == np.int32
    for row, m, p in zip(ids, mask, PROBLEMS, strict=True):
        n = int(m.sum())
        assert m[-1] == 1 and np.all(m[: 128 - n] == 0) and np.all(m[128 - n :] == 1)  # left padded
        assert np.all(row[m == 0] == TOK.pad_id)
        assert TOK.decode(row[m > 0].tolist()) == p.prompt


def test_encode_prompts_too_long_names_the_task():
    with pytest.raises(ValueError, match=PROBLEMS[3].task_id):
        pipeline.encode_prompts(TOK, PROBLEMS, 45)


def test_sft_examples_layout():
    prompt, pmask, comp, cmask = pipeline.sft_examples(TOK, PROBLEMS, 128, 24)
    assert comp.shape == cmask.shape == (len(PROBLEMS), 24)
    np.testing.assert_array_equal(prompt, pipeline.encode_prompts(TOK, PROBLEMS, 128)[0])
    np.testing.assert_array_equal(pmask, pipeline.encode_prompts(TOK, PROBLEMS, 128)[1])
    for row, m, p in zip(comp, cmask, PROBLEMS, strict=True):
        body = p.reference[len(p.prompt) :]
        assert body.startswith("    return ")
        n = int(m.sum())
        assert np.all(m[:n] == 1) and np.all(m[n:] == 0)  # right padded
        assert row[n - 1] == TOK.eos_id and np.sum(row[:n] == TOK.eos_id) == 1  # one EOS, last masked token
        assert np.all(row[n:] == TOK.pad_id)
        assert TOK.decode(row[: n - 1].tolist()) == body
        # the decoder recovers exactly the body
        assert decode_completions(TOK, row[None], m[None]) == [body]
    with pytest.raises(ValueError, match="completion_len"):
        pipeline.sft_examples(TOK, PROBLEMS, 128, 4)


def test_decode_cuts_at_eos_and_skips_specials():
    a = TOK.encode("    return x + 1") + [TOK.eos_id] + TOK.encode(" junk")
    b = [TOK.bos_id] + TOK.encode("    return 0")
    t = 24
    tokens = np.full((2, t), TOK.pad_id, np.int32)
    mask = np.zeros((2, t), np.int32)
    tokens[0, : len(a)], mask[0, : len(a)] = a, 1
    tokens[1, : len(b)], mask[1, : len(b)] = b, 1
    tokens[1, len(b)] = TOK.encode("9")[0]  # outside the mask: ignored
    assert decode_completions(TOK, tokens, mask) == ["    return x + 1", "    return 0"]
    # [B, G, T] input is flattened problem-major
    assert decode_completions(TOK, tokens[None], mask[None]) == ["    return x + 1", "    return 0"]


def test_score_completions_through_the_sandbox(ex):
    p = PROBLEMS[0]  # a level-0 problem
    body = p.reference[len(p.prompt) :]
    completions = [body, "    return 12345\n", "    return (\n", body]
    verdicts, r = pipeline.score_completions(ex, [p, PROBLEMS[1]], completions[:2] + completions[2:], 2)
    assert r.shape == (2, 2) and r.dtype == np.float32
    assert [v.status for v in verdicts[:3]] == [Status.PASSED, Status.WRONG_ANSWER, Status.SYNTAX_ERROR]
    # the 4th completion is p's body graded against PROBLEMS[1] (a different task): it is scored, 0 or 1
    np.testing.assert_array_equal(r[0], [1.0, 0.0])
    assert r[1, 0] == 0.0
    with pytest.raises(ValueError, match="group"):
        pipeline.score_completions(ex, [p], completions, 3)


def test_evaluate_with_an_injected_sampler(ex):
    """A fake sampler: greedy answers the reference for even-indexed problems; sampling answers the
    reference on samples 0 and 1 of every problem and garbage otherwise."""
    problems = PROBLEMS
    bodies = {p.prompt: TOK.encode(p.reference[len(p.prompt) :]) + [TOK.eos_id] for p in problems}
    order = {p.prompt: i for i, p in enumerate(problems)}
    t = 24

    def sample_fn(prompt, pmask, n, greedy):
        b = prompt.shape[0]
        tokens = np.full((b, n, t), TOK.pad_id, np.int32)
        mask = np.zeros((b, n, t), np.int32)
        for i in range(b):
            text = TOK.decode(prompt[i][pmask[i] > 0].tolist())
            for j in range(n):
                good = order[text] % 2 == 0 if greedy else j < 2
                row = bodies[text] if good else TOK.encode("    return None") + [TOK.eos_id]
                tokens[i, j, : len(row)], mask[i, j, : len(row)] = row, 1
        return tokens, mask

    out = pipeline.evaluate(sample_fn, ex, TOK, problems, n_samples=4, ks=[1, 2, 4], prompt_len=128, batch=4)
    assert out["n_problems"] == 6
    assert out["pass@1"] == pytest.approx(3 / 6)  # greedy
    assert out["level0/pass@1"] == pytest.approx(2 / 3) and out["level2/pass@1"] == pytest.approx(1 / 3)
    assert out["pass@1/sampled"] == pytest.approx(0.5)  # 2 of 4 samples pass everywhere
    assert out["pass@2"] == pytest.approx(1 - (1 / 6))  # 1 - C(2,2)/C(4,2)
    assert out["pass@4"] == pytest.approx(1.0)
    assert out["level0/pass_rate"] == pytest.approx(0.5)
    assert out["status/passed"] == 12 and out["status/passed"] + out["status/wrong_answer"] == 24
    with pytest.raises(ValueError, match="n_samples"):
        pipeline.evaluate(sample_fn, ex, TOK, problems, n_samples=2, ks=[4], prompt_len=128, batch=4)


# ------------------------------------------------------------------------------------------ chat prompting

CHAT = pipeline.PromptFormat(kind="chat")


class _ChatTok:
    """A stand-in with the Tokenizer interface's chat part (the real SmolLM2 one is in test_tokenizers)."""

    def apply_chat_template(self, messages, add_generation_prompt=True):
        body = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return body + ("<assistant>" if add_generation_prompt else "")


@pytest.mark.parametrize(
    "reply, code",
    [
        ("Sure:\n```python\ndef f(x):\n    return x\n```\nThis works.", "def f(x):\n    return x\n"),
        ("```py\nx = 1\n```", "x = 1\n"),
        ("```\nx = 2\n```\n```python\nx = 3\n```", "x = 2\n"),  # the first block
        ("```python\ndef g():\n    return 1", "def g():\n    return 1"),  # cut off: to the end
        ("def h():\n    return 2", "def h():\n    return 2"),  # no fence: the whole reply
        ("```Python3  \nprint(1)\n```", "print(1)\n"),
    ],
)
def test_extract_code(reply, code):
    assert pipeline.extract_code(reply) == code


def test_render_prompt_puts_the_problem_in_the_instruction():
    p = PROBLEMS[0]
    text = pipeline.render_prompt(_ChatTok(), p, CHAT)
    assert text.startswith("<user>Complete the following Python function.") and text.endswith("<assistant>")
    assert p.prompt in text
    sys_fmt = pipeline.PromptFormat(kind="chat", system="Be terse.")
    assert pipeline.render_prompt(_ChatTok(), p, sys_fmt).startswith("<system>Be terse.</system><user>")
    assert pipeline.render_prompt(_ChatTok(), p) == p.prompt  # plain: the prompt as it is
    with pytest.raises(ValueError, match="chat template"):
        pipeline.render_prompt(TOK, p, CHAT)  # the procedural tokenizer has none: a clear error


def test_chat_replies_are_graded_by_their_code(ex):
    """A reply that redefines the whole function passes; one with only a body passes (it continues the
    prompt's docstring-only function); prose around the block is ignored; a wrong one fails."""
    p = PROBLEMS[0]
    body = pipeline.reference_body(p)
    whole = p.reference
    replies = [
        f"Here it is:\n```python\n{whole}```\nIt returns the right value.",
        f"```python\n{body}```",
        "```python\ndef solve(n):\n    return None\n```",
        "I cannot do that.",
    ]
    verdicts, r = pipeline.score_completions(ex, [p], replies, 4, fmt=CHAT)
    assert r.tolist() == [[1.0, 1.0, 0.0, 0.0]], [v.status for v in verdicts]


def test_decode_stops_at_any_eos_id():
    class Tok(CodeTokenizer):
        eos_ids = (TOK.eos_id, TOK.encode("!")[0])

    tok = Tok()
    ids = tok.encode("ab") + tok.encode("!") + tok.encode("cd")
    tokens = np.asarray([ids])
    assert decode_completions(tok, tokens, np.ones_like(tokens)) == ["ab"]
    assert decode_completions(TOK, tokens, np.ones_like(tokens)) == ["ab!cd"]


def test_length_bucketed_batches_keep_to_a_prompt_token_budget():
    """prompt_len None: prompts in order of length, each batch padded to its own length (a multiple of
    BUCKET = 64); with max_batch_tokens T a batch padded to L holds at most max(1, min(T // L,
    T^2 // (batch L^2))) rows (the prefill's attention grows with L^2), one static shape per length. Without
    it: groups of `batch`, as before."""
    import dataclasses

    lengths = [300, 10, 140, 70, 20, 150, 80, 130]
    problems = [dataclasses.replace(PROBLEMS[0], task_id=f"p{n}", prompt="x" * n) for n in lengths]
    shapes, seen = [], []

    def sample_fn(prompt, pmask, n, greedy):
        shapes.append(prompt.shape)
        seen.append(sorted(int(m.sum()) for m in pmask))
        return np.zeros((prompt.shape[0], n, 4), np.int32), np.zeros((prompt.shape[0], n, 4), np.int32)

    def run(budget):
        shapes.clear()
        seen.clear()
        plan = pipeline.plan_batches(TOK, problems, None, 4, pipeline.PLAIN, max_batch_tokens=budget)
        texts, _, _ = pipeline._batched_samples(sample_fn, TOK, problems, plan, 1, True, pipeline.PLAIN)
        assert len(texts) == len(problems)
        return list(shapes), list(seen)

    # with later turns: each sample's turn and later-turn record follow it through the length-ordered,
    # padded batches back to its problem-major place (a fake TurnsFn tags them by the prompt's length)
    def turns(chunk, prompt, pmask, tokens, mask, n, greedy):
        tags = [len(p.prompt) for p in chunk for _ in range(n)]
        return np.asarray(tags), [[{"turn": 2, "tag": t, "row": i}] for i, t in enumerate(tags)]

    plan = pipeline.plan_batches(TOK, problems, None, 4, pipeline.PLAIN, max_batch_tokens=256)
    _, passed_turn, later = pipeline._batched_samples(
        sample_fn, TOK, problems, plan, 2, False, pipeline.PLAIN, turns
    )
    want = [n for n in lengths for _ in range(2)]
    assert passed_turn.tolist() == want and [x[0]["tag"] for x in later] == want

    assert pipeline.BUCKET == 64
    got, rows = run(256)
    # L = 128: 256 // 128 = 2 rows by positions, 256^2 // (4 * 128^2) = 1 by attention
    assert got == [(4, 64), (1, 128), (1, 128), (1, 192), (1, 192), (1, 192), (1, 320)]
    assert rows == [[10, 20, 20, 20], [70], [80], [130], [140], [150], [300]]
    got, rows = run(512)  # L = 128: min(4, 512 // 128, 512^2 // (4 * 128^2)) = 4 rows; L = 192: min(2, 1)
    assert got == [(4, 128), (1, 192), (1, 192), (1, 192), (1, 320)]
    assert rows == [[10, 20, 70, 80], [130], [140], [150], [300]]
    got, _ = run(None)
    assert got == [(4, 128), (4, 320)]
