"""Sample-and-grade a loaded policy on a problem set and write the evaluation's directory: the body of
`experiments.evaluate --checkpoint / --init_from` (the policy is loaded by grpo_jax.train.policy).

    results = run(o, loaded, executor, log=print)      # o: inputs.PolicyEval (checked), loaded: LoadedPolicy

Every setting not given in `o` is the loaded run's own (a checkpoint) or the main job's default (a pretrained
model), so `--checkpoint=W --problems=heldout` evaluates exactly as the main job's held-out evaluation did:
the same engine, key, batches, sampler and grading (grpo_jax.eval.evaluation).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import os
import time
from typing import Any, NamedTuple

from grpo_jax import rng as rng_lib
from grpo_jax.codegen.timelimits import with_reference_time_limits
from grpo_jax.eval import evaluation, results
from grpo_jax.eval.inputs import EvalInputError, PolicyEval, check_ks, load_problem_set
from grpo_jax.eval.progress import ChunkedExecutor, EvalProgress
from grpo_jax.policies import sampling
from grpo_jax.rollout.engines import make_engine
from grpo_jax.tokenization import stop_ids


class LoadedPolicy(NamedTuple):
    """A policy and how the main job would evaluate it."""

    tok: Any
    model: Any  # TransformerConfig
    params: Any  # the effective parameters (LoRA merged, as the main job evaluates them)
    host: Any  # device arrays -> this host (runtime.distributed.Context.host)
    fmt: Any  # codegen.pipeline.PromptFormat
    rollout: Any  # config.RolloutConfig: the sampling defaults and the engine
    eval: Any  # config.EvalConfig
    prompt_len: int  # the run's prompt width (held-out batches; the token budget of other batches)
    heldout: list | None  # the run's held-out problems (None: a pretrained model)
    run_key: tuple | None  # (the run's evaluation stream, its step) or None
    info: dict  # what the policy is (checkpoint and step, or init_from; the parameters' SHA-256)


def rollout_for(o: PolicyEval, loaded: LoadedPolicy):
    """The loaded run's RolloutConfig with the flags given in `o` in place of its own."""
    given = dict(
        temperature=o.temperature,
        top_k=o.top_k,
        top_p=o.top_p,
        max_new_tokens=o.max_new_tokens,
        max_turns=o.max_turns,
        feedback_tokens=o.feedback_tokens,
        engine=o.engine,
        engine_slots=o.engine_slots,
        engine_chunk=o.engine_chunk,
    )
    try:
        return dataclasses.replace(loaded.rollout, **{k: v for k, v in given.items() if v is not None})
    except ValueError as e:
        raise EvalInputError(str(e)) from None


def sampling_key(o: PolicyEval, loaded: LoadedPolicy):
    """(key, where it came from): the run's own evaluation stream at its step without --seed (the main job's
    key of that problem set), else one of --seed (0 for a pretrained model)."""
    name = "heldout" if o.problems == "heldout" else os.path.basename(o.problems)
    if o.seed is None and loaded.run_key is not None:
        key, step = loaded.run_key
        return rng_lib.derive(key, step, name), "the run's evaluation stream"
    seed = 0 if o.seed is None else o.seed
    return rng_lib.derive(rng_lib.streams(seed)["eval"], "evaluate", name), f"seed {seed}"


class Settings(NamedTuple):
    """What `run` samples with: the rollout settings, samples per task, ks, batch, engine and the spec."""

    ro: Any
    n: int
    ks: tuple[int, ...]
    batch: int
    engine: Any
    spec: evaluation.EvalSpec


def settings(o: PolicyEval, loaded: LoadedPolicy, problems) -> Settings:
    """The evaluation's sampling: the flags of `o` over the loaded run's own settings."""
    n = loaded.eval.samples if o.num_samples is None else o.num_samples
    ks = tuple(o.ks) if o.ks is not None else tuple(sorted({1, n})) if n else ()
    check_ks(ks, n)
    batch = o.batch or loaded.eval.batch
    ro = rollout_for(o, loaded)
    if ro.max_turns > 1:  # a feedback turn that cannot fit: one line now, not a traceback mid-evaluation
        from grpo_jax.codegen.feedback import check_feedback_budget

        try:
            check_feedback_budget(loaded.tok, loaded.fmt, problems, ro.feedback_tokens)
        except ValueError as e:
            raise EvalInputError(str(e)) from None
    engine = make_engine(
        ro.engine,
        loaded.model,
        max_new=ro.max_new_tokens,
        eos_ids=stop_ids(loaded.tok),
        pad_id=loaded.tok.pad_id,
        weights_dtype=sampling.policy_weights_dtype(loaded.model),
        slots=ro.engine_slots,
        chunk=ro.engine_chunk,
    )
    heldout = o.problems == "heldout"
    spec = evaluation.EvalSpec(
        n_samples=n,
        ks=ks,
        batch=batch,
        max_new_tokens=ro.max_new_tokens,
        temperature=ro.temperature,
        top_k=ro.top_k,
        top_p=ro.top_p,
        # the held-out set as the main job evaluates it; the other sets bucketed by length
        prompt_len=evaluation.heldout_prompt_len(engine, loaded.prompt_len) if heldout else None,
        max_batch_tokens=evaluation.batch_tokens(engine, batch, loaded.prompt_len),
        max_turns=ro.max_turns,
        feedback_tokens=ro.feedback_tokens,
        turn_discount=ro.turn_discount,
        deadline_s=o.deadline,
        stop_on_failure=o.stop_on_failure,
    )
    return Settings(ro, n, ks, batch, engine, spec)


def run(o: PolicyEval, loaded: LoadedPolicy, executor, log=print, progress_write=None, problems=None) -> dict:
    """Evaluate `loaded` as `o` says (see the module docstring); write o.out_dir atomically; the results dict
    (also results.json). `problems`: (problems, task ids) already loaded (default: load_problem_set)."""
    t_start = time.perf_counter()
    if o.problems == "heldout":
        if loaded.heldout is None:  # check_policy_eval: --problems=heldout needs --checkpoint
            raise EvalInputError(
                "--problems=heldout is a run's own held-out split: it needs --checkpoint=WORKDIR"
            )
        problems = list(loaded.heldout)[: o.limit]
        task_ids = [p.task_id for p in problems]
    else:
        problems, task_ids = problems or load_problem_set(o, executor)
    st = settings(o, loaded, problems)
    seconds = {"load": time.perf_counter() - t_start}
    if o.time_limits == "reference":
        problems, rep = with_reference_time_limits(executor, problems, floor_s=o.floor_s, factor=o.factor)
        log(
            f"time limits: {rep['min_s']:.2f}–{rep['max_s']:.2f} s per problem ({rep['measured']} references "
            f"measured, {rep['cached']} cached, {rep['failed_reference']} without a passing reference)"
        )
    key, key_from = sampling_key(o, loaded)
    policy = evaluation.Policy(loaded.params, loaded.tok, loaded.fmt, loaded.host)
    batches = evaluation.plan(policy, problems, st.spec)
    progress = EvalProgress(len(batches), progress_write)
    ro = st.ro
    log(
        f"evaluating {len(problems)} tasks of {o.problems}: greedy + {st.n} samples/task at temperature "
        f"{ro.temperature} (top_k {ro.top_k}, top_p {ro.top_p}), {ro.max_new_tokens} new tokens, "
        f"batch {st.batch}, prompts {loaded.fmt.kind}, {ro.engine} engine, key from {key_from}"
    )
    details: dict = {}
    chunked = ChunkedExecutor(executor, progress)
    kw = dict(progress=progress, details=details, batches=batches)
    evaluation.evaluate(policy, st.engine, chunked, problems, key, st.spec, **kw)
    seconds.update(progress.seconds)
    records = results.task_records(
        problems, task_ids, details, st.n, st.ks, loaded.fmt, turns=ro.max_turns > 1
    )
    out = summary(o, loaded, st, records, details, key_from, executor.tier, len(problems))
    seconds["total"] = time.perf_counter() - t_start
    out["seconds"] = {k: round(v, 2) for k, v in seconds.items()}
    greedy_rows, sample_rows, per_task = records
    files = {
        "results.json": json.dumps(out, indent=1) + "\n",
        "per_task.jsonl": results.jsonl(per_task),
        "samples.jsonl": results.jsonl(sample_rows),
        "greedy.jsonl": results.jsonl(greedy_rows),
    }
    results.write_dir_atomic(o.out_dir, files)
    return out


def summary(
    o: PolicyEval, loaded: LoadedPolicy, st: Settings, records, details, key_from, tier, tasks
) -> dict:
    """results.json: the policy, problems and sampling, pass@k with intervals (per turn too), the counts."""
    greedy_rows, sample_rows, per_task = records
    ro, seed, multi = st.ro, o.seed or 0, st.ro.max_turns > 1
    counts = [(r["n"], r["c"]) for r in per_task]
    metrics = results.summarize_tasks(counts, [r["greedy_passed"] for r in per_task], st.ks, seed=seed)
    return {
        "policy": loaded.info,
        "problems": {
            "spec": o.problems,
            "split": o.split or {"mbpp": "test", "codeio": "heldout"}.get(o.problems),
            "limit": o.limit,
            "tasks": tasks,
        },
        "sampling": {
            "num_samples": st.n,
            "ks": list(st.ks),
            "temperature": ro.temperature,
            "top_k": ro.top_k,
            "top_p": ro.top_p,
            "max_new_tokens": ro.max_new_tokens,
            "batch": st.batch,
            "max_turns": ro.max_turns,
            "feedback_tokens": ro.feedback_tokens if multi else None,
            "prompt_format": loaded.fmt.kind,
            "prompt_len": st.spec.prompt_len,
            "seed": o.seed,
            "key": key_from,
            "engine": ro.engine,
            "engine_slots": ro.engine_slots if ro.engine == "continuous" else None,
        },
        "metrics": metrics,
        "turns": results.turn_summaries(details, st.n, st.ks, ro.max_turns, seed=seed) if multi else None,
        "statuses": dict(collections.Counter(r["status"] for r in sample_rows)),
        "greedy_statuses": dict(collections.Counter(r["status"] for r in greedy_rows)),
        "grading": dict(collections.Counter(r["grading"] for r in per_task)),
        "stop_on_failure": o.stop_on_failure,  # statuses: each failed program's first failing test's
        "tier": tier,
        "out_dir": o.out_dir,
    }
