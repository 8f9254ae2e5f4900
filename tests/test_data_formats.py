"""The 2026 dataset schemas and containers of grpo_jax.data (docs/DATA_FORMATS.md): CodeContests as the
Hub's parquet shards, Open-R1 Codeforces (stdio, input_mode=file, checker problems; interactive problems and
checkers that do not compile left out with a count), KodCode (pytest test code), SYNTHETIC-1 (PrimeIntellect
verifiable-coding-problems), DeepCoder-Preview (both test layouts, a save_to_disk directory); the call-based
grading rule of APPS / LiveCodeBench (a top-level function under a `class Solution` starter passes); bad
inputs (one error naming the file and row); bounded reads (--max_problems, --difficulty); the registry that
every list of formats comes from.

Fixtures: tests/fixtures/formats (hand-made problems in the datasets' layouts, written by make_2026.py);
solutions_2026.jsonl holds a right and a wrong program per problem, graded here by the real sandbox.
"""

from __future__ import annotations

import json
import os
import pickle
import re
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from grpo_jax import data
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.data import registry
from grpo_jax.data.common import DatasetError

FIX = Path(__file__).resolve().parent / "fixtures" / "formats"
SOLUTIONS = [json.loads(x) for x in (FIX / "solutions_2026.jsonl").read_text().splitlines()]
REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def ex():
    import mainjob

    with mainjob.executor() as e:
        yield e


def _by_id(name: str, **kw) -> dict:
    return {p.task_id: p for p in data.load(FIX / name, **kw)}


# ------------------------------------------------------------------------------------------------------------
# Detection and field mapping
# ------------------------------------------------------------------------------------------------------------
def test_each_container_and_schema_is_detected_and_read():
    got = {}
    for name in ("codecontests_parquet", "codeforces.parquet", "kodcode.parquet", "synthetic1.parquet"):
        got[name] = sorted({p.source for p in data.load(FIX / name)})
    got["deepcoder_disk"] = sorted({p.source for p in data.load(FIX / "deepcoder_disk")})
    assert got == {
        "codecontests_parquet": ["codecontests"],
        "codeforces.parquet": ["codeforces"],
        "kodcode.parquet": ["kodcode"],
        "synthetic1.parquet": ["synthetic1"],
        "deepcoder_disk": ["deepcoder"],
    }
    # the parquet shards hold the JSONL fixture's rows (struct columns as the Hub's): the same problems, in
    # shard order (shard 0 has rows 0, 2, ..., shard 1 rows 1, 3, ...)
    jsonl = data.load(FIX / "codecontests.jsonl")
    parquet = data.load(FIX / "codecontests_parquet")
    assert sorted(parquet, key=lambda p: p.task_id) == sorted(jsonl, key=lambda p: p.task_id)
    assert data.load(str(FIX / "codecontests_parquet" / "*.parquet")) == parquet  # a glob
    assert data.load(FIX / "codecontests_parquet" / "train-00001-of-00002.parquet") == [parquet[1]]


def test_codeforces_fields():
    skipped: Counter = Counter()
    p = {q.task_id: q for q in data.load(FIX / "codeforces.parquet", skipped=skipped, visible_tests=None)}
    assert sorted(p) == ["9100/A", "9100/B", "9100/C"]
    assert skipped == Counter(
        {
            "interaction_format: an interactive problem": 1,
            "generated_checker: does not compile (SyntaxError)": 1,
        }
    )
    a, b, c = p["9100/A"], p["9100/B"], p["9100/C"]
    assert a.test_kind == "stdio" and len(a.public_tests) == 1 and len(a.hidden_tests) == 2
    assert [t.stdin for t in a.hidden_tests] == ["2\n5 6\n", "3\n1000000000 1000000000 1000000000\n"]
    assert a.prompt.startswith("Sum\n\nPrint the sum of n integers.\n\nInput\n\nSee the statement.")
    assert "Input:\n```\n3\n1 2 3\n```\nOutput:\n```\n6\n```" in a.prompt  # the example, shown
    assert {(t.input_file, t.output_file) for t in b.tests} == {("input.txt", "output.txt")}
    assert "input.txt" in b.prompt and "output.txt" in b.prompt
    assert all(t.checker.startswith("import sys") for t in c.tests) and not any(t.checker for t in a.tests)
    assert [t.expected for t in c.hidden_tests] == ["1 6\n", "1 9\n"]
    # --difficulty on ratings: an inclusive range, and labels
    assert sorted(_by_id("codeforces.parquet", difficulty="900-1200")) == ["9100/B", "9100/C"]
    assert sorted(_by_id("codeforces.parquet", difficulty="800")) == ["9100/A"]


def test_synthetic1_and_deepcoder_fields():
    s = _by_id("synthetic1.parquet")
    assert s["synth_9300"].reference == "input()\nprint(max(map(int, input().split())))\n"  # fence removed
    assert [t.stdin for t in s["synth_9300"].tests] == ["3\n1 5 2\n", "2\n-4 -7\n"]
    add = s["synth_9301"]  # verification_info as a Python literal; TACO's one-element output wrapping undone
    assert add.test_kind == "call" and [(t.call, t.expected) for t in add.tests] == [
        ("add(*[1, 2])", 3),
        ("add(*[-1, 1])", 0),
    ]
    assert sorted(_by_id("synthetic1.parquet", difficulty="medium")) == ["synth_9301"]
    d = _by_id("deepcoder_disk")
    assert [t.expected for t in d["deepcoder/0"].tests] == ["9\n", "100\n"]
    lcb = d["deepcoder/1"]  # LiveCodeBench layout: one JSON argument a line, Solution() for the starter
    assert [(t.call, t.expected) for t in lcb.tests] == [
        ("Solution().countEven(*[[1, 2, 4]])", 2),
        ("Solution().countEven(*[[]])", 0),
    ]
    assert [(t.call, t.expected) for t in d["deepcoder/2"].tests] == [
        ("mul(*[2, 3])", 6),
        ("mul(*[0, 9])", 0),
    ]


def test_kodcode_fields():
    k = _by_id("kodcode.parquet")
    assert sorted(k) == ["Apps_9202_I", "Leetcode_9200_I", "Prefill_9201_C"]
    two = k["Leetcode_9200_I"]
    assert two.entry_point == "two_sum" and two.completion_mode == "program" and two.source == "kodcode"
    assert "`two_sum`" in two.prompt and "from solution import" in two.prompt
    assert len(two.tests) == 3 and two.child_check is None  # three plain asserts: all graded in the parent
    assert k["Prefill_9201_C"].child_check  # pytest.raises runs in the checker process
    assert sorted(_by_id("kodcode.parquet", difficulty="easy,HARD")) == ["Apps_9202_I", "Leetcode_9200_I"]


# ------------------------------------------------------------------------------------------------------------
# Right and wrong programs through the real sandbox
# ------------------------------------------------------------------------------------------------------------
def test_right_solutions_pass_and_wrong_ones_fail_in_the_sandbox(ex):
    problems = []
    for s in SOLUTIONS:
        problems.append(_by_id(s["file"])[s["task_id"]])
    progs = [c for s in SOLUTIONS for c in (s["correct"], s["wrong"])]
    verdicts = ex.run(jobs_for([p for p in problems for _ in (0, 1)], progs))
    bad = [
        (s["task_id"], which, v.status.value, v.detail[:80])
        for i, s in enumerate(SOLUTIONS)
        for which, v, want in (("correct", verdicts[2 * i], True), ("wrong", verdicts[2 * i + 1], False))
        if v.passed != want
    ]
    assert not bad, bad
    assert len(SOLUTIONS) == 11
    # per-test verdicts: the checker accepts "0 7" where the correct output is "1 6"; the wrong "1 1" fails
    # every test; the file-mode program that prints instead of writing output.txt fails every test
    i = [s["task_id"] for s in SOLUTIONS].index("9100/C")
    assert [t.passed for t in verdicts[2 * i].tests] == [True, True, True]
    assert [t.status.value for t in verdicts[2 * i + 1].tests] == ["wrong_answer"] * 3
    j = [s["task_id"] for s in SOLUTIONS].index("9100/B")
    assert [t.status.value for t in verdicts[2 * j + 1].tests] == ["wrong_answer"] * 3


def test_call_based_tests_find_the_function_as_apps_and_livecodebench_do(ex):
    """`Solution().f` when the program defines `class Solution`, else the top-level `f`, whatever the starter
    code's form (the LiveCodeBench fixture's starter is a `class Solution` stub)."""
    lcb = _by_id("livecodebench.jsonl")
    p = next(q for q in lcb.values() if q.test_kind == "call" and "class Solution" in q.starter_code)
    fn = p.entry_point
    assert fn == "twoSum"
    body = (
        "    seen = {}\n    for i, x in enumerate(nums):\n        if target - x in seen:\n"
        "            return [seen[target - x], i]\n        seen[x] = i\n"
    )
    top = "def twoSum(nums, target):\n" + "".join("    " + x[4:] + "\n" for x in body.splitlines())
    method = "class Solution:\n    def twoSum(self, nums, target):\n" + "".join(
        "    " + x + "\n" for x in body.splitlines()
    )
    neither = "def two_sum(nums, target):\n    return [0, 1]\n"
    d = _by_id("deepcoder_disk")["deepcoder/2"]  # a plain `mul(...)` problem answered with a class
    cls_only = "class Solution:\n    def mul(self, a, b):\n        return a * b\n"
    v = ex.run(jobs_for([p, p, p, d], [top, method, neither, cls_only]))
    assert [x.passed for x in v] == [True, True, False, True], [(x.status, x.detail) for x in v]
    assert v[2].status.value == "runtime_error"


# ------------------------------------------------------------------------------------------------------------
# Bad inputs: one error naming the file (and row)
# ------------------------------------------------------------------------------------------------------------
def _rows_parquet(path: Path, rows: list[dict], row_group_size: int | None = None) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def _cf_row(i: int, **kw) -> dict:
    row = {
        "id": f"77/{i}",
        "title": "T",
        "description": "Print n.",
        "examples": [{"input": "1\n", "output": "1\n"}],
        "official_tests": [{"input": "2\n", "output": "2\n"}],
        "input_mode": "stdio",
        "generated_checker": None,
        "interaction_format": None,
        "rating": 800 + 100 * i,
    }
    row.update(kw)
    return row


def test_a_corrupt_or_truncated_parquet_is_one_error_naming_the_file(tmp_path):
    good = _rows_parquet(tmp_path / "good.parquet", [_cf_row(i) for i in range(5)])
    raw = good.read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(raw[: len(raw) // 2])
    (tmp_path / "garbage.parquet").write_bytes(b"PAR1" + os.urandom(300) + b"PAR1")
    for name in ("trunc.parquet", "garbage.parquet"):
        with pytest.raises(DatasetError) as e:
            data.load(tmp_path / name)
        msg = str(e.value)
        assert msg.startswith(f"{tmp_path / name}: file: unreadable parquet") and "\n" not in msg, msg
        assert "valid: a parquet file" in msg


def test_a_bad_row_names_its_row_group_and_row(tmp_path):
    rows = [_cf_row(i) for i in range(7)]
    rows[5] = _cf_row(5, official_tests=[{"input": "2\n", "output": None}])
    f = _rows_parquet(tmp_path / "cf.parquet", rows, row_group_size=3)
    assert pq.ParquetFile(f).num_row_groups == 3
    with pytest.raises(DatasetError, match=re.escape(f"{f}: row group 1, row 2: official_tests[0]: not {{")):
        data.load(f)
    errors: list = []
    assert len(data.load(f, errors=errors)) == 6 and [e.where for e in errors] == [f"{f}: row group 1, row 2"]
    # --max_problems: the read stops after N problems, before the bad row
    assert [p.task_id for p in data.load(f, max_problems=4)] == ["77/0", "77/1", "77/2", "77/3"]


def test_unknown_schema_lists_the_known_ones_and_the_columns_seen(tmp_path):
    f = _rows_parquet(tmp_path / "x.parquet", [{"prompt_text": "a", "answer": "b"}])
    with pytest.raises(DatasetError) as e:
        data.load(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: fields: an unknown schema (fields seen: answer, prompt_text); neither ")
    for fmt in registry.FORMATS.values():
        assert fmt.title in msg
    assert "--data_format / fmt= one of humaneval, mbpp," in msg


def test_rows_missing_tests_or_with_tests_of_neither_form(tmp_path):
    rows = [{"problem": "p", "tests": json.dumps({"inputs": ["1"], "outputs": ["1"]})}]
    rows.append({"problem": "q", "tests": json.dumps("just a string")})
    f = _rows_parquet(tmp_path / "dc.parquet", rows)
    with pytest.raises(DatasetError, match=re.escape(f"{f}: row group 0, row 1: tests: a JSON str; valid: ")):
        data.load(f)
    s1 = _rows_parquet(
        tmp_path / "s1.parquet",
        [{"problem_id": "a", "prompt": "p", "verification_info": json.dumps({"language": "python"})}],
    )
    with pytest.raises(DatasetError, match="verification_info: no test_cases list"):
        data.load(s1)
    cc = _rows_parquet(
        tmp_path / "cc.parquet",
        [{"name": "n", "description": "d", "public_tests": None, "private_tests": None}],
    )
    with pytest.raises(DatasetError, match="tests: no hidden tests"):
        data.load(cc)


def test_a_datasetdict_directory_asks_for_a_split(tmp_path):
    d = tmp_path / "dd"
    d.mkdir()
    (d / "dataset_dict.json").write_text(json.dumps({"splits": ["train", "test"]}))
    with pytest.raises(
        DatasetError, match=re.escape(f"{d}: path: a DatasetDict directory (splits: train, test)")
    ):
        data.load(d)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetError, match="a directory with no .parquet / .arrow file"):
        data.load(empty)
    with pytest.raises(DatasetError, match="the glob matches no file"):
        data.load(str(tmp_path / "nothing-*.parquet"))


class _Boom:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_an_arrow_extension_type_pickle_in_a_file_is_never_loaded(tmp_path):
    """CVE-2023-47248: pyarrow < 14.0.1 unpickled `arrow.py_extension_type` metadata on read. A column that
    names that type with a payload that would run a command reads as its storage type, and nothing runs."""
    marker = tmp_path / "ran"
    field = pa.field(
        "description",
        pa.string(),
        metadata={
            b"ARROW:extension:name": b"arrow.py_extension_type",
            b"ARROW:extension:metadata": pickle.dumps(_Boom(str(marker))),
        },
    )
    rows = [_cf_row(0), _cf_row(1)]
    table = pa.Table.from_pylist(rows)
    table = table.set_column(table.schema.get_field_index("description"), field, table["description"])
    pq.write_table(table, tmp_path / "evil.parquet")
    problems = data.load(tmp_path / "evil.parquet")
    assert [p.description.startswith("T\n\nPrint n.") for p in problems] == [True, True]
    assert not marker.exists()


# ------------------------------------------------------------------------------------------------------------
# One registry
# ------------------------------------------------------------------------------------------------------------
def test_config_choices_and_the_docs_table_come_from_the_registry():
    from grpo_jax import config

    assert config.DATA_FORMATS == ("auto", *registry.names())
    docs = (REPO / "docs" / "DATA_FORMATS.md").read_text()
    table = re.search(r"<!-- formats table: generated -->\n(.*?)\n<!-- end -->", docs, re.S)
    assert table, "docs/DATA_FORMATS.md lost its generated formats table"
    assert table.group(1) == registry.docs_table(), "paste `python -m grpo_jax.data` there"
    for fmt in registry.FORMATS.values():
        assert f"`{fmt.name}`" in docs  # each format has its section


def test_the_evaluator_grades_given_solutions_from_every_new_input(tmp_path):
    """`experiments.evaluate --problems=X --samples=S --out=R` (its grading function, in-process): every
    2026 fixture input, right programs pass and wrong ones fail, with a verdict per test."""
    from grpo_jax.eval.samples_file import grade_samples_file

    files = sorted({s["file"] for s in SOLUTIONS})
    assert files == [
        "codeforces.parquet",
        "deepcoder_disk",
        "kodcode.parquet",
        "synthetic1.parquet",
    ]
    for f in files:
        sols = [s for s in SOLUTIONS if s["file"] == f]
        samples = tmp_path / f"{f}.samples.jsonl"
        rows = [{"task_id": s["task_id"], "completion": s[k]} for s in sols for k in ("correct", "wrong")]
        samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out = tmp_path / f"{f}.results.jsonl"
        summary = grade_samples_file(
            str(FIX / f), str(samples), [1], str(out), workers=2, log=lambda *_: None, time_limits="none"
        )
        res = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["passed"] for r in res] == [True, False] * len(sols), (f, res)
        for r in res:
            if r["grading"] == "parent":  # a verdict per parent-graded test: all passed iff passed
                assert r["tests"] and all(t == "passed" for t in r["tests"]) == r["passed"], (f, r)
        assert summary["problems"] == len(sols)
    # CodeContests as parquet shards: the JSONL fixture's own solutions
    cc = [json.loads(x) for x in (FIX / "solutions.jsonl").read_text().splitlines()]
    cc = [s for s in cc if s["file"] == "codecontests.jsonl"]
    samples = tmp_path / "cc.samples.jsonl"
    rows = [{"task_id": s["task_id"], "completion": s[k]} for s in cc for k in ("correct", "wrong")]
    samples.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "cc.results.jsonl"
    grade_samples_file(
        str(FIX / "codecontests_parquet"),
        str(samples),
        [1],
        str(out),
        workers=2,
        log=lambda *_: None,
        time_limits="none",
    )
    res = [json.loads(x) for x in out.read_text().splitlines()]
    assert [r["passed"] for r in res] == [True, False] * len(cc) and len(cc) == 2
    # graded on the hidden tests only (private, then generated): the wrong program fails the generated one
    assert [r["tests"] for r in res[:2]] == [["passed"] * 2, ["passed", "wrong_answer"]]


def _bad_inputs(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """{case: (input, what its one error line must contain)}."""
    good = _rows_parquet(tmp_path / "good.parquet", [_cf_row(i) for i in range(4)])
    raw = good.read_bytes()
    (tmp_path / "trunc.parquet").write_bytes(raw[: len(raw) // 2])
    rows = [_cf_row(i) for i in range(4)]
    rows[3] = _cf_row(3, official_tests=None)
    missing = _rows_parquet(tmp_path / "missing.parquet", rows, row_group_size=2)
    # the column as JSON strings (as some revisions store it): the last row's is neither a list nor valid
    rows = [_cf_row(i, official_tests=json.dumps(_cf_row(i)["official_tests"])) for i in range(4)]
    rows[3]["official_tests"] = json.dumps({"input": "1"})
    neither = _rows_parquet(tmp_path / "neither.parquet", rows, row_group_size=2)
    unknown = _rows_parquet(tmp_path / "unknown.parquet", [{"prompt_text": "a", "answer": "b"}])
    return {
        "truncated": (tmp_path / "trunc.parquet", "trunc.parquet: file: unreadable parquet"),
        "unknown schema": (
            unknown,
            "unknown.parquet: fields: an unknown schema (fields seen: answer, prompt_text)",
        ),
        "missing tests": (missing, "missing.parquet: row group 1, row 1: official_tests: missing"),
        "tests of neither form": (
            neither,
            "neither.parquet: row group 1, row 1: official_tests: a JSON dict",
        ),
    }


def test_every_bad_input_stops_the_main_job_before_anything_is_written(ex, tmp_path):
    import mainjob

    from grpo_jax.errors import RunConfigError

    for case, (path, line) in _bad_inputs(tmp_path).items():
        wd = tmp_path / f"run_{case.replace(' ', '_')}"
        with pytest.raises(RunConfigError) as e:
            mainjob.run(
                "--flagfile=experiments/flagfiles/tiny_data_test.flags",
                "--steps=1",
                f"--train_data={path}",
                workdir=wd,
                executor=ex,
            )
        assert line in str(e.value) and "\n" not in str(e.value), (case, str(e.value))
        assert not wd.exists(), case


def test_a_bad_input_is_one_line_and_exit_status_2(tmp_path):
    """The real main job (a process: its exit status and stderr) on a truncated parquet file."""
    import mainjob

    path, line = _bad_inputs(tmp_path)["truncated"]
    p = mainjob.subprocess_run(
        "--flagfile=experiments/flagfiles/tiny_data_test.flags",
        f"--train_data={path}",
        f"--workdir={tmp_path / 'w'}",
        timeout=300,
    )
    assert p.returncode == 2, p.stderr[-2000:]
    errors = [x for x in p.stderr.splitlines() if line in x]
    assert len(errors) == 1 and not (tmp_path / "w").exists(), p.stderr[-2000:]
