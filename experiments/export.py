"""Export a run's policy (its latest checkpoint, or --step) as a Hugging Face directory.

    python -m experiments.export --workdir=runs/smollm2 --out=runs/smollm2/hf_step40

The directory holds config.json, model.safetensors (LoRA adapters merged into the base) and the tokenizer
files, so `transformers.AutoModelForCausalLM.from_pretrained(out)` (or vLLM) loads the trained weights. The
run's own configuration comes from the workdir (run.json), so no other flag is needed.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from absl import logging as absl_logging

flags.DEFINE_string("workdir", None, "A run directory with checkpoints (written by experiments.codegen).")
flags.DEFINE_string("out", None, "The Hugging Face directory to write (must not exist).")
flags.DEFINE_integer("step", None, "Checkpoint step to export (default: the latest).")
FLAGS = flags.FLAGS


def main(argv):
    del argv
    absl_logging.set_verbosity(absl_logging.WARNING)
    from grpo_jax import cli

    if not FLAGS.workdir or not os.path.isfile(os.path.join(FLAGS.workdir, "run.json")):
        cli.fail(f"--workdir={FLAGS.workdir}: not a run directory (no run.json)")
    if not FLAGS.out or os.path.exists(FLAGS.out):
        cli.fail(f"--out={FLAGS.out}: give a directory that does not exist yet")
    from grpo_jax.train.export import export, open_checkpoint

    r, state = open_checkpoint(FLAGS.workdir, FLAGS.step, print_fn=lambda s: print(s, file=sys.stderr))
    try:
        export(r, state, FLAGS.out)
    finally:
        r.ckpt.close()
    print(FLAGS.out)


if __name__ == "__main__":
    app.run(main)
