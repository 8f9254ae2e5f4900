"""--sft_data: the supervised warm start trains on the reference solutions of the problems of other dataset
inputs (files read as --train_data is, or the words mbpp / codeio) instead of the source's SFT problems.
One tiny main-job run in-process (tests/mainjob.py, a procedural source) warm-starts on three small files
written here and trains on exactly the problems that have a reference, a prompt within --prompt_len and a
target within --max_new_tokens, in input order; the bad inputs (no reference anywhere, a missing file, a bad
row, no SFT) are one error each, before anything is written; --sft_from treats --sft_data as an SFT input."""

from __future__ import annotations

import dataclasses
import json

import mainjob
import pytest

from grpo_jax import cli
from grpo_jax.codegen import datasets, pipeline
from grpo_jax.config import is_sft_input
from grpo_jax.data.problems import load_problems, sft_data_problems
from grpo_jax.errors import RunConfigError

# HumanEval rows (function completion: short prompts and targets for the tiny model's --prompt_len=48 and
# --max_new_tokens=12 in its code tokenizer)
H = 'def {f}(x):\n    """{doc}"""\n'


def humaneval_row(name: str, doc: str, body: str) -> dict:
    return {
        "task_id": f"H/{name}",
        "prompt": H.format(f=name, doc=doc),
        "entry_point": name,
        "canonical_solution": body,
        "test": "def check(candidate):\n    assert candidate(1) is not None\n",
    }


def native_row_without_reference() -> dict:
    return {
        "task_id": "native/noref",
        "statement": "Return x minus 1.",
        "kind": "call",
        "fn_name": "dec",
        "tests": [{"args": [1], "output": 0}],
    }


def write(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def inputs(d) -> str:
    """Three inputs (two formats): 5 problems, of which only H/inc and H/dbl can be SFT targets."""
    a = write(
        d / "a.jsonl",
        [
            humaneval_row("inc", "Return x + 1.", "    return x + 1\n"),
            # 21 target tokens with EOS > --max_new_tokens=12: left out by the warm start's fit
            humaneval_row("tri", "Return 3 x.", "    y = x\n    z = y + y\n    w = z + y\n    return w\n"),
        ],
    )
    b = write(d / "b.jsonl", [native_row_without_reference()])  # no reference: left out, counted
    c = write(
        d / "c.jsonl",
        [
            # a 56-token prompt > --prompt_len=48: left out
            humaneval_row("wordy", "Return x + 5." + " And on." * 12, "    return x + 5\n"),
            humaneval_row("dbl", "Return 2 x.", "    return 2 * x\n"),
        ],
    )
    return f"{a},{b},{c}"


TINY_SFT = (mainjob.TINY, "--sft_steps=2", "--steps=0", "--eval_samples=0", "--eval_ks=")


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """(results, printed output, the task ids sft_examples was given) of one tiny run with --sft_data."""
    d = tmp_path_factory.mktemp("sft_data")
    seen: list[list] = []
    real = pipeline.sft_examples

    def spy(tok, problems, *args, **kw):
        seen.append([p.task_id for p in problems])
        return real(tok, problems, *args, **kw)

    with pytest.MonkeyPatch.context() as mp, mainjob.executor() as ex:
        mp.setattr(pipeline, "sft_examples", spy)
        results, out = mainjob.run(*TINY_SFT, f"--sft_data={inputs(d)}", workdir=d / "run", executor=ex)
    return results, out, seen, d


def test_the_warm_start_trains_on_exactly_the_sft_data_problems(sft_run):
    results, out, seen, d = sft_run
    assert seen == [["H/inc", "H/dbl"]]  # one SFT, on these two, in input order (not the procedural suite)
    assert results["sft_problems"] == 2 and results["sft_final_loss"] > 0
    sft_data = f"{d / 'a.jsonl'},{d / 'b.jsonl'},{d / 'c.jsonl'}"
    assert f"tasks: 2 SFT ({sft_data}) / 40 RL training problems (levels (0,) / (0,))" in out
    assert "--sft_data: 1 of 5 problems have no reference solution and are left out" in out
    assert "SFT (--sft_data): 1 of 4 prompts are longer than --prompt_len=48 tokens and left out" in out
    assert "SFT: 1 of 3 reference solutions (with EOS) are longer than --max_new_tokens=12 tokens" in out
    saved = json.loads((d / "run" / "results.json").read_text())
    assert saved["sft_problems"] == 2 and saved["config"]["sft"]["data"] == sft_data


def test_without_sft_data_the_source_s_sft_problems_are_used(tmp_path):
    cfg, _ = mainjob.config(*TINY_SFT, workdir=tmp_path / "w")
    p = load_problems(cfg)
    assert len(p.sft) == 40 and all(q.task_id.startswith("synthetic/L0/train/") for q in p.sft)


def _refused(tmp_path, sft_data: str) -> str:
    with pytest.raises(RunConfigError) as e, mainjob.executor() as ex:
        mainjob.run(*TINY_SFT, f"--sft_data={sft_data}", workdir=tmp_path / "run", executor=ex)
    assert not (tmp_path / "run").exists()  # refused before anything is written
    return str(e.value)


def test_inputs_without_any_reference_solution_are_one_error(tmp_path):
    path = write(tmp_path / "noref.jsonl", [native_row_without_reference()])
    msg = _refused(tmp_path, path)
    assert msg.startswith(f"--sft_data={path}: none of its 1 problems has a reference solution")


def test_a_missing_file_and_a_bad_row_are_one_error_naming_them(tmp_path):
    good = write(tmp_path / "good.jsonl", [humaneval_row("inc", "Return x + 1.", "    return x + 1\n")])
    missing = tmp_path / "missing.jsonl"
    assert str(missing) in _refused(tmp_path, f"{good},{missing}")
    bad_row = {k: v for k, v in native_row_without_reference().items() if k != "fn_name"}
    bad = write(tmp_path / "bad.jsonl", [native_row_without_reference(), bad_row])
    msg = _refused(tmp_path, f"{good},{bad}")
    assert str(bad) in msg and "2" in msg and "fn_name" in msg, msg


def test_sft_data_without_sft_steps_is_an_error_naming_both_flags(tmp_path):
    for args in (("--sft_steps=0",), ("--init_from=smollm2-135m-instruct",)):  # given, or auto for a model
        with pytest.raises(cli.FlagError) as e:
            mainjob.config("--sft_data=mbpp", *args, workdir=tmp_path / "w")
        assert str(e.value).startswith("--sft_data=mbpp:") and "--sft_steps" in str(e.value), args
    with pytest.raises(cli.FlagError, match="an empty input"):
        mainjob.config("--sft_data=mbpp,,codeio", workdir=tmp_path / "w")
    cfg, _ = mainjob.config(
        "--sft_data=mbpp", "--init_from=smollm2-135m-instruct", "--sft_steps=3", workdir="w"
    )
    assert cfg.sft.data == "mbpp" and cfg.sft.steps == 3


def test_the_words_mbpp_and_codeio_are_their_train_splits_concatenated(tmp_path, monkeypatch):
    calls = []
    fake = datasets.load_humaneval()[:3]  # stands in for the CodeI/O cache (built with the sandbox)
    fake[1] = dataclasses.replace(fake[1], reference="")

    def load_codeio(split, limit=None, executor=None):
        calls.append((split, limit))
        return fake

    monkeypatch.setattr("grpo_jax.codegen.codeio.load_codeio", load_codeio)
    cfg, _ = mainjob.config(TINY_SFT[0], "--sft_data=mbpp,codeio", workdir=tmp_path / "w")
    lines: list[str] = []
    got = sft_data_problems(cfg, print_fn=lines.append)
    mbpp = datasets.load_mbpp(split="train")
    assert calls == [("train", None)]
    assert [p.task_id for p in got] == [p.task_id for p in mbpp] + [fake[0].task_id, fake[2].task_id]
    assert lines == [f"--sft_data: 1 of {len(mbpp) + 3} problems have no reference solution and are left out"]


def test_sft_from_refuses_a_warm_start_of_other_sft_data(tmp_path):
    from grpo_jax.config import RunConfig, SFTConfig
    from grpo_jax.train.resume import check_sft_source

    for path in ("sft.data", "tasks.data_format", "tasks.max_problems", "tasks.difficulty"):
        assert is_sft_input(path), path
    src = tmp_path / "warm"
    (src / "checkpoints" / "0").mkdir(parents=True)
    saved = RunConfig(workdir=str(src), sft=SFTConfig(steps=4, data="mbpp"))
    (src / "run.json").write_text(json.dumps({"config": saved.to_json()}))
    arm = lambda data: RunConfig(  # noqa: E731
        workdir=str(tmp_path / "arm"), sft=SFTConfig(steps=4, data=data, from_workdir=str(src))
    )
    check_sft_source(arm("mbpp"))
    with pytest.raises(RunConfigError, match="sft.data: 'mbpp' there, 'mbpp,codeio' here"):
        check_sft_source(arm("mbpp,codeio"))


def test_data_format_applies_to_a_file_in_sft_data_only(tmp_path):
    cfg, _ = mainjob.config("--sft_data=p.jsonl", "--data_format=humaneval", workdir=tmp_path / "w")
    assert cfg.tasks.data_format == "humaneval"
    with pytest.raises(cli.FlagError, match=r"^--data_format=humaneval: only used with"):
        mainjob.config("--sft_data=mbpp", "--data_format=humaneval", workdir=tmp_path / "w")


def test_source_mbpp_plus_codeio_trains_on_both_and_eval_codeio_adds_its_held_out_split(
    tmp_path, monkeypatch
):
    """--source=mbpp+codeio: SFT and RL on MBPP's train split then CodeI/O's, MBPP's test split held out
    (--heldout_per_level of it); --eval_codeio=N: the first N CodeI/O held-out problems as an extra set,
    graded on their hidden tests."""
    fake = [
        dataclasses.replace(p, split=s, task_id=f"cio/{i}")
        for i, (p, s) in enumerate(
            zip(datasets.load_humaneval()[:4], ("train", "heldout", "train", "heldout"), strict=True)
        )
    ]

    def load_codeio(split, limit=None, executor=None):
        return [p for p in fake if split == "all" or p.split == split]

    monkeypatch.setattr("grpo_jax.codegen.codeio.load_codeio", load_codeio)
    cfg, _ = mainjob.config(
        "--source=mbpp+codeio",
        "--heldout_per_level=7",
        "--eval_codeio=1",
        "--init_from=smollm2-135m-instruct",
        workdir=tmp_path / "w",
    )
    got = load_problems(cfg)
    mbpp_train, mbpp_test = datasets.load_mbpp(split="train"), datasets.load_mbpp(split="test")
    want = [p.task_id for p in mbpp_train] + ["cio/0", "cio/2"]
    assert [p.task_id for p in got.rl] == want and [p.task_id for p in got.sft] == want
    assert [p.task_id for p in got.heldout] == [p.task_id for p in mbpp_test[:7]]
    assert [p.task_id for p in got.extra["codeio"]] == ["cio/1"]
    assert not got.extra["codeio"][0].graded_public
    with pytest.raises(Exception, match="codeio_tasks"):  # a CodeI/O setting needs a CodeI/O source
        mainjob.config("--source=mbpp", "--codeio_tasks=5", workdir=tmp_path / "w2")
