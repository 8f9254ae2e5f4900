"""CodeI/O problems (grpo_jax.codegen.codeio): the static checks, every drop reason on small synthetic rows
shaped like the wheel's, the fixed split, a real task's literal tests and expected values, and the cache
(a second load runs nothing in the sandbox)."""

from __future__ import annotations

import ast
import importlib.util

import pytest

from grpo_jax.codegen import codeio
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits

needs_wheel = pytest.mark.skipif(
    importlib.util.find_spec("reasoning_gym") is None,
    reason="reasoning-gym wheel not installed (pip install --no-deps -r requirements-nodeps.txt)",
)

GEN_AB = (
    "def generate_inputs(rng: Random) -> dict:\n"
    "    return {'a': rng.randint(0, 99), 'b': rng.randint(0, 99)}\n"
)
GEN_X = "def generate_input(rng: Random) -> dict:\n    return {'x': rng.randint(0, 10**6)}\n"
GEN_WORDS = (
    "def generate_inputs(rng: Random) -> dict:\n"
    "    return {'words': ['w%d_%d' % (rng.randint(0, 10**6), i) for i in range(40)]}\n"
)

GEN_SET_WORDS = (
    "def generate_inputs(rng: Random) -> dict:\n"
    "    return {'words': list({'w%d_%d' % (rng.randint(0, 10**6), i) for i in range(40)})}\n"
)


def row(name: str, code: str, gen: str = GEN_X) -> dict:
    return {
        "task_id": f"synthetic/{name}",
        "task_description": f"task {name}",
        "input_output_spec": "Input: ...\nOutput: ...",
        "code_sample": code,
        "input_generator": gen,
    }


ROWS = [
    # kept: tuples in the output (JSON-equal to lists), an unused non-stdlib import that is stripped
    row(
        "good",
        "import numpy as np\n\ndef main_solution(a, b):\n    return {'sum': a + b, 'pair': (a, b)}\n",
        GEN_AB,
    ),
    row("numpy", "import numpy as np\n\ndef main_solution(x):\n    return int(np.sum([x]))\n"),
    row("random", "import random\n\ndef main_solution(x):\n    return x + random.random()\n"),
    row("set_order", "def main_solution(words):\n    return list(set(words))\n", GEN_WORDS),
    row("gen_set_order", "def main_solution(words):\n    return len(words)\n", GEN_SET_WORDS),
    row(
        "gen_raises",
        "def main_solution(x):\n    return x\n",
        "def generate_inputs(rng):\n    raise ValueError\n",
    ),
    row(
        "constant",
        "def main_solution(x):\n    return x\n",
        "def generate_inputs(rng):\n    return {'x': 1}\n",
    ),
    row("ref_raises", "def main_solution(x):\n    return 1 // 0\n"),
    row("loops", "def main_solution(x):\n    while True:\n        pass\n"),
    row("set_out", "def main_solution(x):\n    return {x, x + 1}\n"),
    row("nan_out", "def main_solution(x):\n    return float('nan')\n"),
    row("int_keys", "def main_solution(x):\n    return {x: 1}\n"),
    row("huge_out", "def main_solution(x):\n    return 'y' * 20000\n"),
    row("no_main", "def solve(x):\n    return x\n"),
    row("syntax", "def main_solution(x) return x\n"),
]
EXPECTED_REASON = {
    "numpy": "non_stdlib_import",
    "random": "nondeterministic",
    "set_order": "nondeterministic",
    "gen_set_order": "generator_nondeterministic",
    "gen_raises": "generator_failed",
    "constant": "few_inputs",
    "ref_raises": "reference_failed",
    "loops": "reference_timeout",
    "set_out": "output_not_plain",
    "nan_out": "output_not_plain",
    "int_keys": "output_not_plain",
    "huge_out": "too_large",
    "no_main": "unparsable",
    "syntax": "unparsable",
}


@pytest.fixture(scope="module")
def ex():
    with Executor(num_workers=2, limits=Limits(wall_s=1.0, cpu_s=1)) as e:
        yield e


class NoSandbox:
    """An executor that must not be used (the cache must answer)."""

    num_workers = 2

    def evaluate(self, *a, **k):
        raise AssertionError("the sandbox ran although the cache was there")

    run = evaluate


def test_static_checks():
    unused = "import numpy as np\nimport math\n\ndef main_solution(x):\n    return math.sqrt(x)\n"
    code, gen, gen_name, sig = codeio.clean_sources(unused, GEN_X)
    assert code == "import math\n\ndef main_solution(x):\n    return math.sqrt(x)\n"
    assert (gen, gen_name, sig) == (GEN_X, "generate_input", "def main_solution(x):")
    # used (here by the generator), inside a function, a star import, mixed with a stdlib module: not stripped
    for code in (
        "import numpy as np\ndef main_solution(x):\n    return x\n",
        "def main_solution(x):\n    import scipy\n    return x\n",
        "from numpy import *\ndef main_solution(x):\n    return x\n",
        "import math, numpy\ndef main_solution(x):\n    return x\n",
    ):
        gen = (
            "def generate_inputs(rng):\n    return {'x': int(np.ones(1)[0])}\n" if "as np" in code else GEN_X
        )
        assert codeio.clean_sources(code, gen) == (None, "non_stdlib_import"), code
    assert codeio.clean_sources("def main_solution(a=1, *b, c: int = 2):\n    pass\n", GEN_X)[3] == (
        "def main_solution(a=1, *b, c: int=2):"
    )


def test_split_and_ids_are_fixed():
    assert codeio.task_id_of("def main_solution(x):\n    return x\n") == "codeio/8b0bde2babba"
    got = {
        t: codeio.split_of(t) for t in ("codeio/c1deaaaae7ad", "codeio/0332ca05db72", "codeio/a34cfa0ee740")
    }
    assert got == {
        "codeio/c1deaaaae7ad": "train",
        "codeio/0332ca05db72": "heldout",
        "codeio/a34cfa0ee740": "heldout",
    }
    share = sum(codeio.split_of(f"codeio/{i:012x}") == "heldout" for i in range(2000)) / 2000
    assert 0.08 < share < 0.12


def test_drop_reasons_on_synthetic_rows(ex):
    kept, report = codeio.build_rows(ROWS, ex, workers=1)
    assert [r["task_id"] for r in kept] == ["synthetic/good"]
    want = {k: 0 for k in codeio.REASONS}
    for reason in EXPECTED_REASON.values():
        want[reason] += 1
    assert report["dropped"] == want
    got = {t: reason for reason, ts in report["dropped_tasks"].items() for t in ts}
    assert got == {f"synthetic/{k}": v for k, v in EXPECTED_REASON.items()}
    # the kept task: 5 distinct inputs, outputs computed in the sandbox and equal to the formula
    rec = kept[0]
    assert "numpy" not in rec["reference"] and rec["signature"] == "def main_solution(a, b):"
    assert len(rec["tests"]) == codeio.N_TESTS == 5
    assert len({t["call"] for t in rec["tests"]}) == 5
    p = codeio.problem_from_record(rec)
    for t in p.tests:
        kw = ast.literal_eval(t.call[len("main_solution(**") : -1])
        assert t.expected == {"sum": kw["a"] + kw["b"], "pair": [kw["a"], kw["b"]]}
        assert t.kind == "json_eq"
    # a tuple-returning candidate and a list-returning one both pass; a wrong one does not
    cands = [
        "def main_solution(a, b):\n    return {'sum': a + b, 'pair': [a, b]}\n",
        "def main_solution(a, b):\n    return {'sum': a + b, 'pair': (a, b)}\n",
        "def main_solution(a, b):\n    return {'sum': a - b, 'pair': [a, b]}\n",
    ]
    assert [v.passed for v in ex.run(jobs_for([p] * 3, cands))] == [True, True, False]
    # the same build again: the same inputs (seeded per task and index)
    again, _ = codeio.build_rows(ROWS[:1], ex)
    assert again[0]["tests"] == rec["tests"]


def test_self_check_drops_a_reference_that_fails_its_tests(ex):
    kept, _ = codeio.build_rows(ROWS[:1], ex)
    rec = dict(kept[0], tests=[dict(t) for t in kept[0]["tests"]])
    rec["tests"][2]["expected"] = {"i": 7}
    codeio._self_check(ex, [rec])
    assert (rec["kept"], rec["reason"]) == (False, "self_check_failed")


@needs_wheel
def test_real_tasks_cache_and_reuse(ex, tmp_path, monkeypatch):
    assert len(codeio.source_rows()) == 3243  # 3001 distinct in codeio.jsonl.gz + 242 new in codeio-hq
    probs = codeio.load_codeio("all", cache_dir=tmp_path, limit=3, executor=ex)
    assert [p.task_id for p in probs] == ["codeio/c1deaaaae7ad", "codeio/430aac70d69b", "codeio/0332ca05db72"]
    assert [p.split for p in probs] == ["train", "train", "heldout"]
    sand = probs[0]
    assert (sand.source, sand.completion_mode, sand.entry_point, sand.test_kind) == (
        "codeio",
        "program",
        "main_solution",
        "call",
    )
    assert len(sand.tests) == 5 and sand.public_tests == sand.tests[:1] and sand.graded_public
    assert "def main_solution(V_ms, W_ms, V_ds, W_ds, g_s, g_w):" in sand.prompt
    assert "numpy" not in sand.reference  # its unused `import numpy as np` is stripped
    # the example (the shortest test) and its value, as the sandboxed generator and reference made them
    assert sand.tests[0].call == (
        "main_solution(**{'V_ms': 480.8095797991605, 'W_ms': 280.182091781327, 'V_ds': 385.4751016854775, "
        "'W_ds': 430.8605377237062, 'g_s': 2.778804683735854, 'g_w': 1.0068799241481734})"
    )
    assert sand.tests[0].expected == {
        "total_porosity": 67.75,
        "void_ratio": 210.09,
        "moisture_content": -34.97,
        "degree_of_saturation": -45.94,
    }
    v_ms = [ast.literal_eval(t.call[len("main_solution(**") : -1])["V_ms"] for t in sand.tests]
    assert v_ms == [
        480.8095797991605,
        121.26461412045674,
        441.95083883367073,
        188.07595818597537,
        348.80417141168095,
    ]
    for t in sand.tests:  # every expected value is the task's formulas (written out here) on its input
        k = ast.literal_eval(t.call[len("main_solution(**") : -1])
        v_s = k["W_ds"] / k["g_s"]
        v_v = k["V_ms"] - v_s
        assert t.expected == {
            "total_porosity": round(v_v / k["V_ms"] * 100, 2),
            "void_ratio": round(v_v / v_s * 100, 2),
            "moisture_content": round((k["W_ms"] - k["W_ds"]) / k["W_ds"] * 100, 2),
            "degree_of_saturation": round((k["W_ms"] - k["W_ds"]) / k["g_w"] / v_v * 100, 2),
        }
    assert [p.task_id for p in codeio.load_codeio("heldout", cache_dir=tmp_path, limit=3, executor=ex)] == [
        "codeio/0332ca05db72"
    ]
    # the cache answers: no executor is made and the given one is never used
    monkeypatch.setattr("grpo_jax.sandbox.executor.Executor", None)
    again = codeio.load_codeio("all", cache_dir=tmp_path, limit=3, executor=NoSandbox())
    assert again == probs
    assert codeio.load_codeio("all", cache_dir=tmp_path, limit=3) == probs
    header, _ = codeio.read_cache(codeio.cache_path(tmp_path, limit=3))
    assert (header["tasks"], header["kept"], header["wheel_version"], header["builder_version"]) == (
        3,
        3,
        "0.1.25",
        codeio.BUILDER_VERSION,
    )
