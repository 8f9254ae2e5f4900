"""The main job's held-out evaluation after `step` RL steps, computed once per identity.

    evaluate(run, state, step, tag)   held-out pass@1 greedy and pass@k sampled, the extra sets' greedy pass@1

An evaluation is a function of what it evaluates: the parameters (their SHA-256), the "eval" key and the step
it is derived with, the evaluation's settings (EvalSpec), the engine that samples (kind, weights dtype), the
model config, the tokenizer and prompt format, the sandbox limits and every problem of every set (content,
hashed). `identity` gathers them; each evaluation writes them beside its per-task rows as
WORKDIR/eval/step_N/summary.json, with its figures, after the rows. Before computing one, `evaluate` looks for
a summary of the same identity, in this workdir (a run resumed after its evaluation had finished, or a run of
--steps=0 whose final evaluation is its step-0 one) and, at step 0, in --sft_from's workdir (an arm of a sweep
evaluating the warm start's parameters the way the warm start did): found, its figures are used and its rows
copied, and one line names where they came from. Anything that differs, however small, computes anew.

Computing one (single process), each sampler call's tokens, and with execution feedback the call's later
turns, are kept in WORKDIR/eval/step_N/.partial/<identity digest>/<set>/ until the summary is written: a run
stopped during a long evaluation (SmolLM2 on MBPP test: about an hour here, a 2-turn one longer) samples,
when it evaluates again, only the batches it had not (the same tokens: each call draws with its own key);
the directory is removed at the end.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from typing import Any

import numpy as np

from grpo_jax import atomic
from grpo_jax import rng as rng_lib
from grpo_jax.eval import evaluation
from grpo_jax.eval import results as eval_results
from grpo_jax.eval.progress import EvalProgress
from grpo_jax.train.build import Run
from grpo_jax.train.export import params_digest
from grpo_jax.train.state import RunState

__all__ = ["SUMMARY", "evaluate", "identity"]

SUMMARY = "summary.json"  # in eval_results.step_records_dir(workdir, step), written last
# beside it: the sampler calls of an unfinished attempt, by identity (removed at the end)
PARTIAL = ".partial"


def _canon(x: Any) -> Any:
    """`x` as JSON data that two processes write alike: dataclasses by field, dicts (any hashable keys) and
    sets as lists sorted by their elements' JSON text, tuples and bytes tagged, other leaves by repr."""
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _canon(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if isinstance(x, dict):
        return ["dict", sorted(([_canon(k), _canon(v)] for k, v in x.items()), key=json.dumps)]
    if isinstance(x, (set, frozenset)):
        return ["set", sorted((_canon(v) for v in x), key=json.dumps)]
    if isinstance(x, (list, tuple)):
        return [type(x).__name__, [_canon(v) for v in x]]
    if x is None or isinstance(x, (bool, int, str)):
        return x
    return [type(x).__name__, repr(x)]  # float, complex, bytes, ...


def _sha(obj: Any) -> str:
    text = json.dumps(_canon(obj))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def identity(run: Run, params: Any, key: Any, step: int, spec: evaluation.EvalSpec) -> dict[str, Any]:
    """Everything an evaluation's figures depend on (JSON values; problem sets and model as digests)."""
    cfg, engine = run.cfg, run.eval_engine
    sets = {"heldout": run.problems.heldout, **run.problems.extra}
    return {
        "params_sha256": params_digest(params, fetch=run.ctx.host),
        "eval_key": np.asarray(run.ctx.host(key)).ravel().tolist(),
        "step": int(step),
        "spec": dataclasses.asdict(spec),
        "engine": {k: getattr(engine, k, None) for k in ("kind", "weights_dtype", "max_new", "eos_ids")},
        "model": _sha(run.model),
        "tokenizer": run.tok.fingerprint(),
        "prompt": cfg.tasks.prompt,
        "sandbox": dataclasses.asdict(cfg.sandbox),
        "sets": {name: _sha(list(probs)) for name, probs in sets.items()},
    }


def _found(directory: str, ident: dict) -> dict | None:
    """The figures of `directory`'s summary when its identity is `ident` (None when absent or unreadable)."""
    try:
        with open(os.path.join(directory, SUMMARY), encoding="utf-8") as f:
            saved = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(saved, dict) or saved.get("identity") != json.loads(json.dumps(ident)):
        return None
    return saved.get("results")


def _reuse(run: Run, step: int, ident: dict) -> tuple[dict, str] | None:
    """(figures, source workdir) of an earlier evaluation of this identity, or None. Every process must find
    one for any to reuse it (the evaluation is collective)."""
    sources = [run.cfg.workdir]
    if step == 0 and run.cfg.sft.from_workdir:
        sources.append(run.cfg.sft.from_workdir)
    hit = None
    for src in sources:
        res = _found(eval_results.step_records_dir(src, step), ident)
        if res is not None:
            hit = (res, src)
            break
    if run.ctx.multi and not all(run.ctx.allgather_objects(f"eval reuse {step}", hit is not None)):
        return None
    return hit


def _copy_records(run: Run, src: str, step: int) -> None:
    """The per-task rows and summary of `src`'s evaluation at `step` into this workdir (main process)."""
    here, there = (eval_results.step_records_dir(w, step) for w in (run.cfg.workdir, src))
    if not run.ctx.is_main or os.path.realpath(here) == os.path.realpath(there):
        return
    os.makedirs(here, exist_ok=True)
    names = sorted(n for n in os.listdir(there) if n.endswith(".jsonl")) + [SUMMARY]  # the summary last
    for name in names:
        with open(os.path.join(there, name), "rb") as f:
            atomic.write_bytes(os.path.join(here, name), f.read())


def evaluate(run: Run, state: RunState, step: int, tag: str) -> dict:
    """Held-out metrics of the current policy (after `step` RL steps), logged at that step: the held-out set
    (greedy pass@1 and pass@k, per turn with --eval_max_turns) and greedy pass@1 of the extra sets, through
    the run's evaluation engine (grpo_jax.eval.evaluation; the "eval" stream: training never depends on
    it), or an earlier evaluation's figures of the same identity (module docstring). The main process writes
    each set's per-task and greedy rows to WORKDIR/eval/step_<step>/ (grpo_jax.eval.results.
    write_step_records: experiments.evaluate's per_task.jsonl schema), then the summary."""
    cfg = run.cfg
    params = state.train.params if run.param_fn is None else run.param_fn(state.train.params, state.frozen)
    spec = evaluation.spec_from_config(cfg, run.eval_engine)
    ident = identity(run, params, state.train.rng["eval"], step, spec)
    hit = _reuse(run, step, ident)
    if hit is not None:
        out, src = hit
        _copy_records(run, src, step)
        where = "this workdir" if src == cfg.workdir else src
        run.print(f"[eval {tag}] reused: the same evaluation (parameters, key, settings, tasks) in {where}")
        run.results.setdefault("evals_reused", {})[str(step)] = src
    else:
        summary = os.path.join(eval_results.step_records_dir(cfg.workdir, step), SUMMARY)
        if run.ctx.is_main and os.path.exists(summary):  # another evaluation's: its rows are about to go
            os.remove(summary)
        partial = os.path.join(os.path.dirname(summary), PARTIAL, _sha(ident)[:16])
        out = _compute(run, state, params, step, tag, spec, partial)
        if run.ctx.is_main:
            atomic.write_json(summary, {"identity": ident, "results": out}, indent=1)
            shutil.rmtree(os.path.dirname(partial), ignore_errors=True)  # every attempt's partial samples
    shown = [k for k in out if k.startswith(("pass@", "level")) or "/pass@" in k]
    run.print(f"[eval {tag}] " + "  ".join(f"{k} {out[k]:.3f}" for k in shown))
    run.logger.scalars(step, {"eval/" + k.replace("@", "_at_"): v for k, v in out.items()})  # TB mangles "@"
    return out


def _compute(run: Run, state: RunState, params: Any, step: int, tag: str, spec, partial: str) -> dict:
    """The evaluation itself (every set), its per-task rows written; the figures. A single-process
    evaluation keeps each sampler call (and its later turns) in `partial`/<set> (evaluation.SampleStore)
    until its summary is written, so a run stopped during it samples only what it had not when it evaluates
    again."""
    cfg = run.cfg
    t = time.perf_counter()
    if not cfg.rollout.async_rewards:  # (an asynchronous rollout may be sampling now)
        evaluation.release_all()
    policy = evaluation.Policy(params, run.tok, cfg.tasks.prompt, run.ctx.host)
    out: dict = {}
    sets = [("heldout", run.problems.heldout, spec)]
    sets += [(name, probs, spec.greedy_only()) for name, probs in run.problems.extra.items()]
    for name, problems, sp in sets:
        batches = evaluation.plan(policy, problems, sp)
        prog = EvalProgress(
            len(batches), lambda line, n=name: run.print(f"[eval {tag}] {n} {line}"), quiet_s=10.0
        )
        key = rng_lib.derive(state.train.rng["eval"], step, name)
        details: dict = {}  # the texts and verdicts behind the figures (the per-task rows)
        store = None
        if not run.ctx.multi:  # (processes would have to agree on every hit)
            store = evaluation.SampleStore(os.path.join(partial, name))
        kw: dict[str, Any] = dict(progress=prog, batches=batches, details=details, store=store)
        res = evaluation.evaluate(policy, run.eval_engine, run.executor, problems, key, sp, **kw)
        if store is not None and store.hits:
            run.print(f"[eval {tag}] {name}: {store.hits} sampler batches read back from an earlier attempt")
        out.update(res if name == "heldout" else {f"{name}/pass@1": res["pass@1"]})
        if run.ctx.is_main:  # experiments.evaluate's per-task rows, per step
            eval_results.write_step_records(cfg.workdir, step, name, problems, details, sp, policy.fmt)
    evaluation.release_engine(run.eval_engine)
    out["seconds"] = time.perf_counter() - t
    return out
