"""What an evaluation of a policy is asked to do, checked before anything is loaded: the policy (a main-job
checkpoint or a pretrained model), the problem set, the sampling and the output directory (`PolicyEval`, the
flags of `experiments.evaluate`), and the problem set itself (`load_problem_set`, task ids as their file wrote
them). A bad input is one EvalInputError naming what is wrong and what is valid. No JAX: the checks run
before the sandbox starts."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from grpo_jax import data
from grpo_jax.codegen import datasets

# grpo_jax.policies.continuous.ROLLOUT_ENGINES, copied so that this module imports no JAX (tested equal)
ROLLOUT_ENGINES = ("static", "continuous")


class EvalInputError(ValueError):
    """A bad input of an evaluation (a flag, a path, a file): its message names what is wrong and what is
    valid; `experiments.evaluate` prints it as one line and exits 2."""


UsageError = EvalInputError  # the name the checks below were written with

PROBLEM_NAMES = "humaneval, mbpp, heldout (with --checkpoint: the run's own held-out split), codeio"
INIT_FROM_DEFAULTS: dict[str, Any] = {"max_new_tokens": 512}  # the rest: the main job's defaults (RunConfig)


@dataclasses.dataclass(frozen=True)
class PolicyEval:
    """What the sample-and-grade mode evaluates and how (the flags, checked; None = the default: the run's
    own setting for --checkpoint, the main job's default for --init_from)."""

    problems: str
    out_dir: str
    checkpoint: str | None = None  # WORKDIR[:STEP]
    init_from: str | None = None  # an HF directory, a .gguf file or a known name
    split: str | None = None  # MBPP split (None: test)
    limit: int | None = None  # the first N tasks
    num_samples: int | None = None
    ks: tuple[int, ...] | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    batch: int | None = None
    max_turns: int | None = None
    feedback_tokens: int | None = None
    seed: int | None = None
    prompt_format: str = "auto"
    workers: int | None = None
    timeout: float = 4.0
    deadline: float | None = None
    time_limits: str = "reference"
    floor_s: float = 0.5
    factor: float = 5.0
    stop_on_failure: bool = False
    engine: str | None = None  # the rollout engine (None: the run's own; static for --init_from)
    engine_slots: int | None = None
    engine_chunk: int | None = None


def parse_checkpoint(spec: str) -> tuple[str, int]:
    """(workdir, step) of --checkpoint=WORKDIR[:STEP] (default step: the latest complete checkpoint), checked
    on disk without opening anything; UsageError saying what is wrong and what is valid."""
    flag = f"--checkpoint={spec}"
    workdir, step = spec, None
    head, sep, tail = spec.rpartition(":")
    if sep and head and tail.isdigit() and not os.path.isdir(spec):
        workdir, step = head, int(tail)
    if not os.path.isdir(workdir):
        raise UsageError(
            f"{flag}: {workdir} is not a directory; give the --workdir of a main-job run "
            "(python -m experiments.codegen), as WORKDIR or WORKDIR:STEP"
        )
    if not os.path.isfile(os.path.join(workdir, "run.json")):
        raise UsageError(
            f"{flag}: no run.json in {workdir}, so not the workdir of a main-job run "
            "(python -m experiments.codegen --workdir=...); give such a workdir, as WORKDIR or WORKDIR:STEP"
        )
    ckpts = os.path.join(workdir, "checkpoints")
    steps = sorted(
        int(d) for d in (os.listdir(ckpts) if os.path.isdir(ckpts) else ()) if d.isdigit()
    )  # orbax renames a step's directory to its number when the step is complete
    if not steps:
        raise UsageError(f"{flag}: no complete checkpoint in {ckpts}")
    if step is None:
        return workdir, steps[-1]
    if step not in steps:
        raise UsageError(f"{flag}: no checkpoint at step {step} in {workdir} (complete steps: {steps})")
    return workdir, step


def resolve_init_from(name: str) -> str:
    """A known checkpoint name (grpo_jax.pretrained.api.KNOWN) may be given by a unique prefix
    ("smollm2" -> "smollm2-135m-instruct"); anything else is kept as it is."""
    from grpo_jax.pretrained.api import KNOWN

    key = name.strip().lower()
    if key in KNOWN or os.path.exists(name):
        return name
    matches = [k for k in KNOWN if k.startswith(key)]
    return matches[0] if key and len(matches) == 1 else name


def check_out_dir(out_dir: str) -> None:
    if os.path.exists(out_dir) and (not os.path.isdir(out_dir) or os.listdir(out_dir)):
        raise UsageError(f"--out_dir={out_dir}: already exists and is not empty; give a new directory")
    parent = os.path.dirname(os.path.abspath(out_dir))
    if not os.path.isdir(parent):
        raise UsageError(f"--out_dir={out_dir}: its parent directory {parent} does not exist")


def check_policy_eval(o: PolicyEval) -> None:
    """Everything about the flags that can be checked before a model is loaded; UsageError if not."""
    if bool(o.checkpoint) == bool(o.init_from):
        raise UsageError(
            "give one of --checkpoint=WORKDIR[:STEP] (a main-job run) or --init_from=PATH|NAME "
            "(a Hugging Face directory, a .gguf file or a known name such as smollm2-135m-instruct)"
        )
    if not o.problems:
        raise UsageError(f"--problems is required ({PROBLEM_NAMES}, or a .jsonl/.jsonl.gz problems file)")
    if o.problems == "heldout" and not o.checkpoint:
        raise UsageError("--problems=heldout is a run's own held-out split: it needs --checkpoint=WORKDIR")
    if o.problems not in ("humaneval", "mbpp", "heldout", "codeio") and not os.path.isfile(o.problems):
        raise UsageError(
            f"--problems={o.problems}: no such file "
            f"(give {PROBLEM_NAMES}, or a .jsonl/.jsonl.gz problems file)"
        )
    if o.split is not None:
        if o.problems not in ("mbpp", "codeio"):
            raise UsageError(f"--split={o.split}: applies to --problems=mbpp (and codeio) only")
        if o.problems == "mbpp" and o.split not in datasets.MBPP_SPLITS:
            raise UsageError(f"--split={o.split}: MBPP's splits are {', '.join(datasets.MBPP_SPLITS)}")
    if not o.out_dir:
        raise UsageError("--out_dir is required (a new directory for results.json, per_task.jsonl, samples)")
    check_out_dir(o.out_dir)
    lows = (("limit", 1), ("num_samples", 0), ("top_k", 0), ("max_new_tokens", 1), ("batch", 1))
    for name, low in (
        *lows,
        ("max_turns", 1),
        ("feedback_tokens", 1),
        ("engine_slots", 1),
        ("engine_chunk", 1),
    ):
        v = getattr(o, name)
        if v is not None and v < low:
            raise UsageError(f"--{name}={v}: must be >= {low}")
    if o.temperature is not None and not o.temperature > 0:
        raise UsageError(
            f"--temperature={o.temperature}: must be > 0 (the greedy sample is always taken too)"
        )
    if o.top_p is not None and not 0 < o.top_p <= 1:
        raise UsageError(f"--top_p={o.top_p}: must be in (0, 1] (1 = off)")
    if o.engine is not None and o.engine not in ROLLOUT_ENGINES:
        raise UsageError(f"--rollout_engine={o.engine}: valid: {', '.join(ROLLOUT_ENGINES)}")
    if o.prompt_format not in ("auto", "plain", "chat"):
        raise UsageError(f"--prompt_format={o.prompt_format}: valid: auto, plain, chat")
    if o.timeout <= 0:
        raise UsageError(f"--timeout={o.timeout}: must be > 0 seconds")
    if o.floor_s <= 0 or o.factor <= 0:
        raise UsageError("--time_limit_floor and --time_limit_factor must be > 0")
    if o.ks is not None and o.num_samples is not None:
        check_ks(o.ks, o.num_samples)
    if o.checkpoint:
        parse_checkpoint(o.checkpoint)
    elif o.init_from:  # one of the two (checked above)
        from grpo_jax.pretrained.api import resolve

        try:
            resolve(resolve_init_from(o.init_from))
        except FileNotFoundError as e:
            raise UsageError(f"--init_from={o.init_from}: {str(e).split(': ', 1)[-1]}") from None


def check_ks(ks, n: int) -> None:
    if n == 0 and ks:
        raise UsageError(
            f"--k={','.join(map(str, ks))}: pass@k needs samples; --num_samples=0 is greedy only"
        )
    if any(k > n for k in ks):
        raise UsageError(f"--k={','.join(map(str, ks))}: every k must be <= --num_samples={n}")


def raw_task_ids(problems, rows: list[dict]) -> list:
    """Each problem's task_id exactly as its file wrote it (MBPP's 11, not the loader's "Mbpp/11"); a problem
    whose id is not found in `rows` keeps its own."""
    written: dict[str, Any] = {}
    for r in rows:
        tid = r.get("task_id")
        if tid is not None and not isinstance(tid, (dict, list, bool)):
            written.setdefault(str(tid), tid)
            written.setdefault(datasets.mbpp_task_id(tid), tid)
    return [written.get(p.task_id, p.task_id) for p in problems]


def load_problem_set(o: PolicyEval, executor=None) -> tuple[list, list]:
    """(problems, their task ids as written in the problems file) for --problems, --split, --limit (not
    heldout: that is the run's). `executor`: the sandbox codeio builds its cache in (first use only)."""
    rows: list[dict] = []
    if o.problems == "codeio":
        from grpo_jax.codegen import codeio

        try:  # its held-out split unless --split says otherwise, graded on the hidden tests
            problems = codeio.load_codeio(split=o.split or "heldout", executor=executor)
        except (ValueError, FileNotFoundError) as e:
            raise UsageError(f"--problems=codeio: {e}") from None
        problems = [p.with_grade_tests("private") for p in problems]
    elif o.problems == "mbpp":
        problems = datasets.load_mbpp(split=o.split or "test")
        rows = datasets.read_jsonl(datasets.MBPP_PATH)
    elif o.problems == "humaneval":
        problems = datasets.load_humaneval()
        rows = datasets.read_jsonl(datasets.humaneval_path())
    else:
        try:  # evaluation grades on the hidden tests (the public ones may be in the prompt)
            problems = data.load(o.problems, grade_tests="private", max_problems=o.limit or None)
        except (ValueError, OSError, EOFError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise UsageError(f"--problems={o.problems}: {e}") from None
        try:
            rows = datasets.read_jsonl(o.problems) if os.path.isfile(o.problems) else []
        except (ValueError, OSError, EOFError, UnicodeDecodeError):
            rows = []  # a format the loader reads but that is not JSON lines: the loader's ids
    problems = list(problems)[: o.limit]
    if not problems:
        raise UsageError(f"--problems={o.problems}: no problems")
    return problems, raw_task_ids(problems, rows)
