"""The main job on problems read from files (--train_data / --eval_data, every contest format of
grpo_jax.data) and on the offline CodeI/O set (--source=codeio): each a one-step run of the tiny
model in-process (tests/mainjob.py) whose rollout is graded by the sandbox's stdin/stdout and call-based
tests; task ids reach the logs exactly as the file writes them; a bad file is one error naming file and line.
The verdicts themselves (right and wrong solutions of every fixture) are tests/test_formats.py's."""

import importlib.util
import json
import math
from pathlib import Path

import mainjob
import pytest

from grpo_jax import cli, data
from grpo_jax.train.build import RunConfigError

DATA = "--flagfile=experiments/flagfiles/tiny_data_test.flags"
FIX = Path(__file__).resolve().parent / "fixtures" / "formats"
ONE_STEP = ("--steps=1", "--sft_steps=0", "--eval_samples=0", "--eval_ks=", "--prompts_per_step=2")


@pytest.fixture(scope="module")
def ex():
    with mainjob.executor() as e:
        yield e


def _samples(wd) -> list[dict]:
    return [json.loads(x) for x in (Path(wd) / "samples.jsonl").read_text().splitlines()]


@pytest.mark.parametrize(
    "name",
    [
        *(
            f"{f}.jsonl"
            for f in ("apps", "taco", "codecontests", "livecodebench", "native", "humaneval", "mbpp")
        ),
        # the 2026 schemas, in the containers they are kept in: parquet shards, parquet, save_to_disk
        "codecontests_parquet",
        "codeforces.parquet",
        "kodcode.parquet",
        "synthetic1.parquet",
        "deepcoder_disk",
    ],
)
def test_the_main_job_trains_from_a_file_of_each_format(ex, tmp_path, name):
    train = FIX / name
    kinds = {p.test_kind for p in data.load(train)}
    assertion_style = name.split(".")[0] in ("humaneval", "mbpp", "kodcode")
    assert kinds == ({"assert"} if assertion_style else kinds & {"stdio", "call"}) and kinds, kinds
    # held-out: the JSONL formats' runs on the CodeContests parquet shards, the 2026 schemas' on their input
    held_file = FIX / "codecontests_parquet" if name.endswith(".jsonl") else train
    n_held = len(data.load(held_file))
    one_problem = len(data.load(train)) == 1  # the HumanEval and MBPP fixtures: one problem each
    results, out = mainjob.run(
        DATA,
        *ONE_STEP,
        *(["--prompts_per_step=1"] if one_problem else []),
        f"--train_data={train}",
        f"--eval_data={held_file}",
        workdir=tmp_path / "run",
        executor=ex,
    )
    assert results["steps"] == 1
    train_ids = {p.task_id for p in data.load(train)}
    assert f"RL training problems ({train})" in out and f"{n_held} held-out" in out
    step = mainjob.metrics(tmp_path / "run")[1]
    assert math.isfinite(step["loss"]) and 0.0 <= step["reward"] <= 1.0
    rows = _samples(tmp_path / "run")
    assert rows and {r["task_id"] for r in rows} <= train_ids  # ids as the file writes them
    # every sampled program was graded by the sandbox (one verdict each; the tiny model writes no solution)
    assert all(
        r["status"] in {"passed", "wrong_answer", "runtime_error", "syntax_error", "timeout"} for r in rows
    )
    held = json.loads((tmp_path / "run" / "results.json").read_text())
    assert held["grpo"]["n_problems"] == n_held


def test_held_out_file_problems_are_graded_on_their_hidden_tests_only(tmp_path):
    cfg, _ = mainjob.config(
        DATA, f"--train_data={FIX / 'native.jsonl'}", "--heldout_per_level=2", workdir=tmp_path / "w"
    )
    from grpo_jax.data.problems import load_problems as problem_sets

    p = problem_sets(cfg)
    assert len(p.heldout) == 2 and len(p.rl) == 3
    assert not {q.task_id for q in p.heldout} & {q.task_id for q in p.rl}  # held out = kept out of training
    for q in p.heldout:
        assert q.public_tests and q.tests == q.hidden_tests and not any(t in q.public_tests for t in q.tests)
    # training grades on public + hidden (--grade_tests=all, the default); private: hidden only
    assert all(q.tests[: len(q.public_tests)] == q.public_tests for q in p.rl)
    cfg, _ = mainjob.config(
        DATA, f"--train_data={FIX / 'native.jsonl'}", "--grade_tests=private", workdir=tmp_path / "w"
    )
    assert all(q.tests == q.hidden_tests for q in problem_sets(cfg).rl)


@pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym==0.1.25 (pip --no-deps) not installed",
)
def test_the_main_job_trains_on_codeio(ex, tmp_path, monkeypatch):
    monkeypatch.setenv("GRPO_JAX_CACHE_DIR", str(tmp_path / "cache"))  # the CodeI/O tests built here
    results, out = mainjob.run(
        DATA,
        *ONE_STEP,
        "--source=codeio",
        "--codeio_tasks=40",
        "--prompt_len=1536",
        workdir=tmp_path / "run",
        executor=ex,
    )
    assert results["steps"] == 1 and "CodeI/O train split" in out
    rows = _samples(tmp_path / "run")
    assert rows and all(r["task_id"].startswith("codeio/") for r in rows)
    assert math.isfinite(mainjob.metrics(tmp_path / "run")[1]["loss"])


def test_a_bad_problem_file_is_one_error_naming_file_line_and_field(ex, tmp_path):
    bad = tmp_path / "bad.jsonl"
    good = (FIX / "apps.jsonl").read_text().splitlines()
    row = json.loads(good[1])
    row["input_output"] = "{not json"
    bad.write_text("\n".join([good[0], json.dumps(row)]) + "\n")
    with pytest.raises(RunConfigError, match=r"bad\.jsonl:2: input_output"):
        mainjob.run(DATA, *ONE_STEP, f"--train_data={bad}", workdir=tmp_path / "run", executor=ex)
    assert not (tmp_path / "run").exists()  # nothing written
    with pytest.raises(cli.FlagError, match="--source=file needs --train_data"):
        mainjob.config(DATA, "--source=file", workdir=tmp_path / "never")
    with pytest.raises(cli.FlagError, match="--train_data=.*only used with --source=file"):
        mainjob.config(DATA, "--source=mbpp", f"--train_data={bad}", workdir=tmp_path / "never")


def test_the_runs_grader_scores_right_and_wrong_replies_of_every_format(ex):
    """The main job's Grader on chat replies (the first ```python block is the program) to every fixture
    problem that has a hand-written right and wrong solution: reward 1 and 0, per-test results to match."""
    from grpo_jax.codegen.pipeline import PromptFormat
    from grpo_jax.config import SandboxConfig
    from grpo_jax.rollout.grader import Grader

    sols = [json.loads(x) for x in (FIX / "solutions.jsonl").read_text().splitlines()]
    by_file: dict = {}
    for s in sols:
        by_file.setdefault(s["file"], {})[s["task_id"]] = s
    problems, texts = [], []
    for name, wanted in sorted(by_file.items()):
        for p in data.load(FIX / name):
            if p.task_id in wanted:
                problems.append(p)
                for code in (wanted[p.task_id]["correct"], wanted[p.task_id]["wrong"]):
                    texts.append(f"Here is my solution.\n```python\n{code}```\nIt reads the input.")
    assert len(problems) >= 15 and {p.test_kind for p in problems} == {"stdio", "call", "assert"}
    grader = Grader(ex, SandboxConfig(), None, PromptFormat("chat"), group=2, num_tests=64)
    verdicts, rewards = grader.score(problems, texts)
    wrong = [(p.task_id, v.status) for p, v in zip(problems, verdicts[0::2], strict=True) if not v.passed]
    assert not wrong, wrong
    assert rewards.tolist() == [[1.0, 0.0]] * len(problems), [
        (p.task_id, r) for p, r in zip(problems, rewards, strict=True)
    ]


def test_a_run_on_mbpp_builds_with_the_suites_default_levels(tmp_path):
    """--source=mbpp (one level of problems) once failed in the curriculum's set-up, which took the procedural
    suite's default --rl_levels=0,1 and found level 1 empty."""
    from grpo_jax.train.build import build

    cfg, _ = mainjob.config(
        DATA, "--source=mbpp", "--prompt_len=1024", "--sft_steps=0", workdir=tmp_path / "w"
    )
    run = build(cfg, None, print_fn=lambda *a: None)
    try:
        assert len(run.problems.rl) == 374 and run.rollout.source.num_levels == 1
    finally:
        run.close()


def test_mbpp_prompts_longer_than_prompt_len_are_left_out_before_anything_runs(tmp_path):
    """--source=mbpp: MBPP's statements run to thousands of tokens (test split), and a held-out prompt that
    did not fit once failed the run with a traceback minutes in, at its first evaluation. Now the training
    and held-out problems that do not fit are left out at build time with a count, as for dataset files."""
    from grpo_jax.codegen.pipeline import render_prompt
    from grpo_jax.data.problems import load_problems as problem_sets
    from grpo_jax.train.build import fit_prompts, model_and_tokenizer

    cfg, _ = mainjob.config(
        DATA,
        "--source=mbpp",
        "--prompt_len=400",
        "--heldout_per_level=100",
        "--sft_steps=0",
        workdir=tmp_path / "w",
    )
    tok, _, _ = model_and_tokenizer(cfg)
    before = problem_sets(cfg)
    lines: list[str] = []
    after = fit_prompts(cfg, tok, before, lines.append)
    assert lines == [
        "training problems: 22 of 374 prompts are longer than --prompt_len=400 tokens and left out",
        "held-out problems: 10 of 100 prompts are longer than --prompt_len=400 tokens and left out",
    ]
    n = lambda q: len(tok.encode(render_prompt(tok, q, cfg.tasks.prompt)))  # noqa: E731
    for old, new in ((before.rl, after.rl), (before.heldout, after.heldout)):
        kept = {q.task_id for q in new}
        assert all(n(q) <= 400 for q in new)
        assert all(n(q) > 400 for q in old if q.task_id not in kept)
    assert [q.task_id for q in after.sft] == [q.task_id for q in after.rl]


def test_stop_on_failure_gives_the_same_rewards_and_ends_each_programs_tests_at_its_first_failure(ex):
    """--sandbox_stop_on_failure (and experiments.evaluate --stop_on_failure): the main job's Grader and
    pipeline.evaluate grade the fixtures' right and wrong solutions to the same rewards, each wrong program's
    tests ending at the test where it first failed when all were run."""
    from grpo_jax.codegen.pipeline import PromptFormat
    from grpo_jax.config import SandboxConfig
    from grpo_jax.rollout.grader import Grader

    sols = [json.loads(x) for x in (FIX / "solutions.jsonl").read_text().splitlines()]
    problems, texts = [], []
    for s in sols:
        p = {q.task_id: q for q in data.load(FIX / s["file"])}[s["task_id"]]
        problems.append(p)
        texts += [f"```python\n{s[k]}```" for k in ("correct", "wrong")]
    fmt = PromptFormat("chat")
    kinds = {p.test_kind for p in problems}
    assert kinds == {"stdio", "call", "assert"}
    graded = {}
    for stop in (False, True):
        grader = Grader(ex, SandboxConfig(stop_on_failure=stop), None, fmt, group=2, num_tests=64)
        graded[stop] = grader.score(problems, texts)
    (v_all, r_all), (v_stop, r_stop) = graded[False], graded[True]
    assert r_all.tolist() == r_stop.tolist() == [[1.0, 0.0]] * len(problems)
    cut = 0
    for a, b in zip(v_all, v_stop, strict=True):
        assert a.passed == b.passed
        first = next((i for i, t in enumerate(a.tests) if not t.passed), None)
        if first is None or not a.tests:  # passed, or ended before any test (the same both ways)
            assert len(b.tests) == len(a.tests)
        else:
            assert len(b.tests) == first + 1 and not b.tests[-1].passed
            cut += len(a.tests) - len(b.tests)
    assert cut >= 5  # tests not run at all


def test_stop_on_failure_is_refused_with_per_test_advantages(tmp_path):
    with pytest.raises(cli.FlagError, match=r"--sandbox_stop_on_failure=true: multi-scale advantages"):
        mainjob.config(DATA, "--sandbox_stop_on_failure", "--multiscale_w_tests=0.5", workdir=tmp_path / "w")
    cfg, _ = mainjob.config(DATA, "--sandbox_stop_on_failure", workdir=tmp_path / "w")
    assert cfg.sandbox.stop_on_failure
