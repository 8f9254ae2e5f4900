"""GRPO alone on the synthetic counting task (no sandbox, no SFT): the device side of GRPO learning.

    python -m experiments.token_task                 # ~1 minute on a 2-core CPU; prints reward going up
    python -m experiments.token_task --steps=300 --kl_coef=0.0 --entropy_coef=0.01

A 2-layer transformer policy learns to continue a count (c_t = c_{t-1} + 1 mod 14) from a reward equal to the
fraction of completion tokens that follow the rule; chance is 1/14.
"""

from absl import app, flags

flags.DEFINE_integer("steps", 150, "GRPO steps.", lower_bound=1)
flags.DEFINE_integer("prompts", 16, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 8, "Completions per prompt (G).", lower_bound=2)
flags.DEFINE_float("learning_rate", 1e-3, "AdamW learning rate.", lower_bound=0.0)
flags.DEFINE_float("kl_coef", 0.04, "KL coefficient beta (to the initial policy).", lower_bound=0.0)
flags.DEFINE_float("entropy_coef", 0.0, "Entropy bonus coefficient.", lower_bound=0.0)
flags.DEFINE_integer("seed", 0, "Run seed.")
flags.DEFINE_integer("log_every", 10, "Print a progress line every N steps.", lower_bound=1)
FLAGS = flags.FLAGS


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f"unexpected arguments: {argv[1:]}")
    from grpo_jax.config import ObjectiveConfig, OptimConfig, RolloutConfig
    from grpo_jax.train import token_loop as tt

    if FLAGS.learning_rate <= 0:
        raise app.UsageError("--learning_rate must be > 0")
    task = tt.TokenTaskConfig(steps=FLAGS.steps, prompts_per_step=FLAGS.prompts, seed=FLAGS.seed)
    print(
        f"GRPO on the counting task: {FLAGS.steps} steps x {FLAGS.prompts} prompts x G={FLAGS.group}; "
        f"chance reward = {1 / (task.vocab_size - 2):.3f}, maximum = 1.0 (first step includes compilation)"
    )
    _, hist = tt.run(
        task,
        obj=ObjectiveConfig(kl_coef=FLAGS.kl_coef, entropy_coef=FLAGS.entropy_coef),
        optim=OptimConfig(learning_rate=FLAGS.learning_rate),
        rollout=RolloutConfig(group_size=FLAGS.group, max_new_tokens=8),
        log_every=FLAGS.log_every,
    )
    first = sum(h["reward"] for h in hist[:5]) / min(5, len(hist))
    last = sum(h["reward"] for h in hist[-10:]) / min(10, len(hist))
    print(f"mean reward: first 5 steps {first:.3f} -> last 10 steps {last:.3f}")


if __name__ == "__main__":
    app.run(main)
