"""The host-side rollout: what a GRPO step trains on, and the one interface to the policy's samplers.

    engines.py         RolloutEngine (the protocol every caller samples through: training, evaluation,
                       multi-turn), StaticEngine (one compiled batch), ContinuousEngine (continuous batching),
                       make_engine (--rollout_engine)
    codegen.py         CodegenRollout = ProblemSource + engine + Grader (+ replay splicing, dynamic sampling,
                       the pool baseline); AsyncRollout (one step ahead in a worker thread); make_rollout
    problem_source.py  which problems a step draws (uniform, curriculum, replayed successes) and the counts
    grader.py          decode + sandbox + per-test rewards; the multi-process verdict exchange
    multiturn.py       --max_turns trajectories (feedback on the visible tests, the next reply through the
                       engine, packed reply | feedback | reply); EvalTurns for evaluation
    pool_runtime.py    the policy pool's snapshots, members and baseline (its members sample with the pool's
                       own vmapped sampler, whatever the engine)
    state.py           RolloutState, ProblemStats (checkpointed in the run's RunState)

Nothing here imports grpo_jax.train or grpo_jax.eval (tests/test_layers.py).
"""
