"""The main job: SFT warm start, then GRPO on sandboxed code rewards.

    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags
    python -m experiments.codegen --flagfile=experiments/flagfiles/quickstart.flags --preset=dr_grpo \
        --workdir=runs/dr_grpo
    python -m experiments.codegen --helpfull             # every flag with its meaning and default
    python launch/local.py --num_processes=2 --devices_per_process=2 -- \
        --flagfile=experiments/flagfiles/quickstart.flags --workdir=runs/dist   # 2 processes on this machine

Every flag is a field of grpo_jax.config.RunConfig (grpo_jax.cli derives the flags from the tree). Precedence:
the last setting of a field on the command line wins, flagfiles expanded where they appear, and `--preset`
sets all its fields where it appears; the run prints every field where a preset and a flag disagree. A bad
value stops the run with one line naming the flag and what is valid, before anything starts or is written.
The run resumes from the workdir's latest checkpoint by default (`--noresume` refuses a workdir that has one).
A disk that fills up while the run writes a checkpoint or its logs ends it with one line on stderr naming the
newest intact checkpoint and exit status 74 (EX_IOERR); the same command, given space, resumes from it.
"""

from __future__ import annotations

import json
import os
import sys
import warnings

from absl import app, flags
from absl import logging as absl_logging

from grpo_jax import cli
from grpo_jax.train.diskfull import EXIT_DISK_FULL, disk_full_error, disk_full_line, quiet_disk_full_logs

FLAGS = flags.FLAGS
cli.define_flags(FLAGS)
flags.DEFINE_bool("dry_run", False, "Check the flags, print the resolved configuration as JSON and exit.")


def main(argv):
    absl_logging.set_verbosity(absl_logging.WARNING)  # JAX / orbax INFO lines would bury the run's output
    if len(argv) > 1:
        cli.fail(f"unexpected positional arguments: {' '.join(argv[1:])}")
    try:
        cfg, notes = cli.config_from_flags(FLAGS)
    except cli.FlagError as e:
        cli.fail(str(e))
    for n in notes:
        print(n, file=sys.stderr if FLAGS.dry_run else sys.stdout, flush=True)
    if FLAGS.dry_run:
        print(json.dumps(cfg.to_json(), indent=1))
        return

    from grpo_jax.runtime import distributed, sharding

    try:  # the CPU device count and joining the other processes first: nothing may touch a device before
        sharding.set_cpu_devices(cfg.mesh.cpu_devices)
        distributed.initialize(cfg.dist)
    except (distributed.PeerLost, sharding.MeshError) as e:
        cli.fail(str(e))

    from grpo_jax.runtime import compile_cache
    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.types import Limits
    from grpo_jax.train.loop import RunConfigError, run

    # before the first compilation; an unusable directory: one warning line, the run goes on without it
    cache_dir = compile_cache.enable(cfg.runtime.compilation_cache)

    main_process = distributed.context(cfg.dist).is_main
    quiet_disk_full_logs()
    limits = Limits(wall_s=cfg.sandbox.wall_s, cpu_s=cfg.sandbox.cpu_s)
    with Executor(num_workers=cfg.sandbox.workers, limits=limits) as executor:  # this process's own sandbox
        if main_process:
            print(f"sandbox: isolation tier {executor.tier_line()}", flush=True)
            print(f"compilation cache: {cache_dir or 'off'}", flush=True)
        try:
            run(cfg, executor, notes=notes)
        except RunConfigError as e:  # e.g. the workdir holds a different run
            cli.fail(str(e))
        except distributed.PeerLost as e:  # another process hung or died: end now, do not wait for it
            distributed.fail_lost(e)
        except Exception as e:  # with several processes, often a collective whose peer died
            full = disk_full_error(e)
            if full is not None:
                print(f"error: {disk_full_line(full, cfg.workdir, raised=e)}", file=sys.stderr, flush=True)
                # the failed save's coroutines are collected at exit: no warning about them after the line
                warnings.filterwarnings("ignore", r"coroutine .* was never awaited", RuntimeWarning)
                if cfg.dist.enabled:  # as fail_lost: JAX's shutdown would wait for the other processes
                    os._exit(EXIT_DISK_FULL)
                sys.exit(EXIT_DISK_FULL)
            if cfg.dist.enabled:
                distributed.fail_after_error(e, cfg.dist.heartbeat_s)
            raise


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    app.run(main, flags_parser=cli.parse)
