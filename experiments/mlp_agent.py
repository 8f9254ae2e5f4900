"""The seed's actor-critic MLP on the toy tasks: GRPO on the one-step bandits, PPO on the episodic chain.

    python -m experiments.mlp_agent --env=discrete --steps=200 --workdir=/tmp/mlpA
    python -m experiments.mlp_agent --env=continuous --steps=200 --workdir=/tmp/mlpB
    python -m experiments.mlp_agent --env=chain --algorithm=ppo --steps=50 --workdir=/tmp/mlpC

The trainers are grpo_jax.train.mlp_agent's (GRPO: DiscreteBandit / ContinuousBandit of grpo_jax.envs.toy;
PPO: Chain), the host loop grpo_jax.train.mlp_loop: metrics.jsonl + TensorBoard, an evaluation every
--eval_every steps (``eval/...``: sampled and greedy / mean-action reward or return on a fixed evaluation
set), orbax checkpoints every --checkpoint_every steps, results.json at the end. Running the same command
again with the same --workdir resumes from its newest checkpoint (bit-identical to an uninterrupted run; a
larger --steps extends it); a workdir of a different configuration is refused. SIGTERM / SIGINT: the step
ends, a checkpoint is saved, the run exits.

Unset trainer flags take the algorithm's default (GRPOAgentConfig / PPOAgentConfig). The flags are parsed
into this module's own FlagValues (``main(argv)``), so tests run it in-process beside other experiments.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from absl import flags

if TYPE_CHECKING:
    from grpo_jax.train.mlp_loop import MLPRunConfig

ENVS = ("discrete", "continuous", "chain")
GRPO_ONLY = ("prompts", "group", "inner_steps", "kl_coef")  # flags that only one trainer / task reads
PPO_ONLY = ("envs", "epochs", "minibatches", "gamma", "lam", "vf_coef")
BANDIT_ONLY = ("obs_dim", "act_dim")
CHAIN_ONLY = ("chain_n", "horizon")


def define_flags(fv: flags.FlagValues) -> None:
    """The command line, defined on ``fv``."""

    def d(kind: str, name: str, default: object, doc: str, **kw: object) -> None:
        getattr(flags, f"DEFINE_{kind}")(name, default, doc, flag_values=fv, **kw)

    flags.DEFINE_enum("env", "discrete", ENVS, "Task: discrete / continuous bandit, chain.", flag_values=fv)
    algorithms = ["grpo", "ppo"]
    flags.DEFINE_enum(
        "algorithm", None, algorithms, "grpo (bandits), ppo (chain); default: the env's.", flag_values=fv
    )
    d("string", "workdir", None, "Run directory (required): metrics, checkpoints, results.json.")
    d("integer", "steps", 200, "Train steps in all (a resumed run continues to this count).", lower_bound=0)
    d("integer", "seed", 0, "Run seed: the task, the init, the rollouts, the evaluation set.")
    d("integer", "hidden", 64, "MLP trunk width (the seed's default is 1024).", lower_bound=1)
    d("float", "learning_rate", None, "AdamW learning rate (default: grpo 3e-3, ppo 1e-3).", lower_bound=0.0)
    d("float", "weight_decay", None, "AdamW weight decay (default 0).", lower_bound=0.0)
    d("float", "max_grad_norm", None, "Gradient-norm clip (default: grpo 1, ppo 0.5).", lower_bound=0.0)
    d("float", "entropy_coef", None, "Entropy bonus (default: grpo 0, ppo 0.01).", lower_bound=0.0)
    d("float", "clip_eps", None, "Ratio clip epsilon, both sides (default 0.2).", lower_bound=0.0)
    d("integer", "prompts", None, "GRPO: observations per step, B (default 64).", lower_bound=1)
    d("integer", "group", None, "GRPO: actions per observation, G (default 8).", lower_bound=2)
    d("integer", "inner_steps", None, "GRPO: gradient steps per batch, mu (default 1).", lower_bound=1)
    d("float", "kl_coef", None, "GRPO: k3 KL to the initial policy (default 0.01).", lower_bound=0.0)
    d("integer", "envs", None, "PPO: parallel episodes per rollout (default 64).", lower_bound=1)
    d("integer", "epochs", None, "PPO: epochs over each rollout (default 4).", lower_bound=1)
    d("integer", "minibatches", None, "PPO: minibatches per epoch (default 4).", lower_bound=1)
    d("float", "gamma", None, "PPO: discount (default 0.99).", lower_bound=0.0, upper_bound=1.0)
    d("float", "lam", None, "PPO: GAE lambda (default 0.95).", lower_bound=0.0, upper_bound=1.0)
    d("float", "vf_coef", None, "PPO: value loss coefficient (default 0.5).", lower_bound=0.0)
    d("integer", "obs_dim", 8, "Bandits: observation size.", lower_bound=1)
    d("integer", "act_dim", None, "Bandits: actions (default 8) / action size (2).", lower_bound=1)
    d("integer", "chain_n", 8, "Chain: cells (the goal is the last).", lower_bound=3)
    d("integer", "horizon", 8, "Chain: steps before an episode is cut.", lower_bound=1)
    d("integer", "log_every", 10, "A progress line every N steps.", lower_bound=1)
    d("integer", "eval_every", 50, "An evaluation every N steps (0: at step 0 and the end).", lower_bound=0)
    d("integer", "eval_episodes", 1024, "Observations / episodes per evaluation.", lower_bound=1)
    d("integer", "checkpoint_every", 50, "A checkpoint every N steps (0: at the end).", lower_bound=0)
    d("integer", "keep_checkpoints", 3, "Newest intact checkpoints kept.", lower_bound=1)
    d("string", "compilation_cache", "", "Persistent XLA cache dir ('': the project's default; none: off).")


def fail(msg: str) -> int:
    """One line on stderr; the exit status 2."""
    print(f"error: {msg}", file=sys.stderr, flush=True)
    return 2


def config_from_flags(fv: flags.FlagValues) -> MLPRunConfig:
    """The MLPRunConfig of the parsed flags; ValueError (one line) for a combination that is not valid."""
    from grpo_jax.config import PolicyLossConfig
    from grpo_jax.train import mlp_agent, mlp_loop

    env, algorithm = fv.env, fv.algorithm or mlp_loop.ALGORITHMS[fv.env]
    mlp_loop.check_combination(env, algorithm)
    if not fv.workdir:
        raise ValueError("--workdir is required (the run's directory; rerun with the same one to resume)")
    wrong = [(n, "--algorithm=ppo") for n in GRPO_ONLY if algorithm != "grpo"]
    wrong += [(n, "--algorithm=grpo") for n in PPO_ONLY if algorithm != "ppo"]
    wrong += [(n, "--env=chain") for n in BANDIT_ONLY if env == "chain"]
    wrong += [(n, f"--env={env}") for n in CHAIN_ONLY if env != "chain"]
    for name, why in wrong:
        if fv[name].present:
            raise ValueError(f"--{name} does not apply with {why}")
    given = lambda **kw: {k: v for k, v in kw.items() if v is not None}  # noqa: E731
    common = given(
        learning_rate=fv.learning_rate,
        weight_decay=fv.weight_decay,
        max_grad_norm=fv.max_grad_norm,
        entropy_coef=fv.entropy_coef,
    )
    agent: mlp_agent.GRPOAgentConfig | mlp_agent.PPOAgentConfig
    if algorithm == "grpo":
        loss = given(eps_low=fv.clip_eps, eps_high=fv.clip_eps)
        kw = given(
            num_prompts=fv.prompts, group_size=fv.group, num_inner_steps=fv.inner_steps, kl_coef=fv.kl_coef
        )
        agent = mlp_agent.GRPOAgentConfig(**common, **kw)
        if loss:
            agent = dataclasses.replace(agent, loss=PolicyLossConfig(**loss))
    else:
        kw = given(
            num_envs=fv.envs,
            num_epochs=fv.epochs,
            num_minibatches=fv.minibatches,
            gamma=fv.gamma,
            lam=fv.lam,
            vf_coef=fv.vf_coef,
            clip_eps=fv.clip_eps,
        )
        agent = mlp_agent.PPOAgentConfig(**common, **kw)
    return mlp_loop.MLPRunConfig(
        env=env,
        algorithm=algorithm,
        workdir=fv.workdir,
        steps=fv.steps,
        agent=agent,
        seed=fv.seed,
        hidden=fv.hidden,
        obs_dim=fv.obs_dim,
        act_dim=fv.act_dim if fv.act_dim is not None else (8 if env == "discrete" else 2),
        chain_n=fv.chain_n,
        horizon=fv.horizon,
        eval_episodes=fv.eval_episodes,
        log_every=fv.log_every,
        eval_every=fv.eval_every,
        checkpoint_every=fv.checkpoint_every,
        keep_checkpoints=fv.keep_checkpoints,
    )


def main(argv: Sequence[str]) -> int:
    """Parse ``argv`` (``argv[0]``: the program) into a fresh FlagValues and run; the exit status (0, or 2
    after one error line on stderr: a bad flag or combination, a workdir of another configuration)."""
    fv = flags.FlagValues()
    define_flags(fv)
    if any(a in ("-h", "--help", "--helpshort", "--helpfull") for a in argv[1:]):
        print(f"{__doc__}\n{fv.get_help()}")
        return 0
    try:
        rest = fv(list(argv))
    except flags.Error as e:
        return fail(str(e).replace("ERROR:: ", ""))
    if len(rest) > 1:
        return fail(f"unexpected arguments: {' '.join(rest[1:])}")
    from grpo_jax.runtime import compile_cache
    from grpo_jax.train import mlp_loop

    try:
        cfg = config_from_flags(fv)
    except ValueError as e:  # MLPRunError included
        return fail(str(e))
    if compile_cache.directory() is None:  # a process that has one (the tests) keeps it
        compile_cache.enable(fv.compilation_cache)
    try:
        mlp_loop.run(cfg, print_fn=lambda line: print(line, flush=True))
    except mlp_loop.MLPRunError as e:
        return fail(str(e))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
