"""Benchmark of the policy pool: vmapped evaluation of K stacked members against a Python loop over members,
and the pool's memory with full parameters against LoRA adapters.

    python -m experiments.bench_pool                       # K = 8, 16, 32 on the quickstart model
    python -m experiments.bench_pool --ks=16 --repeats=5

Workload = what the code-generation loop does per step with `--baseline=pool`: every member draws
`samples` completions of `prompts` prompts (KV-cache sampler, `new_tokens` tokens, no early EOS), and the
log-probabilities of one batch (prompts x group completions) under every member. "vmap" is one jitted call
over the stacked pool (grpo_jax.pool); "loop" calls the same jitted single-member function once per member
(members pre-sliced outside the timing, compile excluded: the loop's best case). Times are medians over
`repeats` calls after one warm-up call.

Two kinds of members: full parameters (members="full": K independent random models, vmapped) and LoRA
adapters of one base (members="lora_r8": K random rank-r adapters; "vmap" is then the batched multi-adapter
path, one base matmul over the K*B member-major rows per projection plus per-member low-rank deltas, and
"loop" runs the members FOLDED into full models outside the timing, so the loop does no adapter matmuls).

Prints one JSON line per figure and a table: per kind and K, logp_vmap_s / logp_loop_s / ratio and
sample_vmap_s / sample_loop_s / ratio (ratio = vmapped or batched time / loop time; the target is <= 0.5 at
K = 16); then pool memory (MB, float32) with full parameters and with rank-r LoRA adapters for the quickstart,
TINY and SMALL models.
"""

from __future__ import annotations

import json

from absl import app, flags

from experiments.pool_timing import QUICKSTART, measure

flags.DEFINE_list("ks", ["8", "16", "32"], "Pool sizes K to time.")
flags.DEFINE_integer("prompts", 16, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 8, "Completions per prompt in the log-prob batch (G).", lower_bound=1)
flags.DEFINE_integer("samples", 1, "Completions per prompt each member samples.", lower_bound=1)
flags.DEFINE_integer("prompt_len", 128, "Prompt tokens (P).", lower_bound=1)
flags.DEFINE_integer("new_tokens", 24, "New tokens per completion (T).", lower_bound=1)
flags.DEFINE_integer("repeats", 3, "Timed calls per figure (median).", lower_bound=1)
flags.DEFINE_integer(
    "lora_rank", 8, "LoRA rank of the adapter members and of the memory figure.", lower_bound=1
)
flags.DEFINE_bool("lora", True, "Also time LoRA-adapter members of one shared base (batched on the base).")
FLAGS = flags.FLAGS


def emit(**kw):
    print(json.dumps(kw), flush=True)


def main(argv):
    del argv
    import jax

    from grpo_jax import pool
    from grpo_jax.policies import lora
    from grpo_jax.policies import transformer as tfm

    cfg = tfm.TransformerConfig(**QUICKSTART)
    emit(
        setting="bench_pool",
        model_params=cfg.num_params(),
        prompts=FLAGS.prompts,
        group=FLAGS.group,
        samples=FLAGS.samples,
        prompt_len=FLAGS.prompt_len,
        new_tokens=FLAGS.new_tokens,
        devices=str(jax.devices()),
    )
    rows = []
    for x in FLAGS.ks:
        for r in measure(
            int(x),
            prompts=FLAGS.prompts,
            group=FLAGS.group,
            samples=FLAGS.samples,
            prompt_len=FLAGS.prompt_len,
            new_tokens=FLAGS.new_tokens,
            repeats=FLAGS.repeats,
            lora_rank=FLAGS.lora_rank,
            with_lora=FLAGS.lora,
        ):
            emit(**r)
            rows.append(r)

    print(f"\n{'members':>8} {'K':>4} {'logp vmap':>10} {'loop':>8} {'ratio':>6}", end="")
    print(f"   {'sample vmap':>11} {'loop':>8} {'ratio':>6}   {'loop GFLOP/s':>12}")
    for r in rows:
        print(
            f"{r['members']:>8} {r['K']:>4} {r['logp_vmap_s']:>9.3f}s {r['logp_loop_s']:>7.3f}s "
            f"{r['logp_ratio']:>6.2f}   {r['sample_vmap_s']:>10.3f}s {r['sample_loop_s']:>7.3f}s "
            f"{r['sample_ratio']:>6.2f}   {r['loop_gflops']:>12.1f}"
        )

    print(f"\npool memory (float32 MB), LoRA rank {FLAGS.lora_rank} on all 7 projections")
    for name, c in (("quickstart", cfg), ("TINY", tfm.TINY), ("SMALL", tfm.SMALL)):
        shapes = jax.eval_shape(lambda c=c: tfm.init_params(c, jax.random.PRNGKey(0)))
        adapters = jax.eval_shape(
            lambda sh=shapes: lora.init(sh, jax.random.PRNGKey(0), rank=FLAGS.lora_rank)
        )
        n_full = sum(x.size for x in jax.tree.leaves(shapes))
        n_ad = sum(x.size for x in jax.tree.leaves(adapters))
        for k in [int(x) for x in FLAGS.ks]:
            full_mb, lora_mb = 4 * k * n_full / 2**20, 4 * k * n_ad / 2**20
            emit(
                model=name,
                K=k,
                pool_full_mb=round(full_mb, 2),
                pool_lora_mb=round(lora_mb, 2),
                lora_fraction=round(n_ad / n_full, 4),
            )
        print(
            f"  {name:<11} params {n_full:>10,}  adapters {n_ad:>9,} ({n_ad / n_full:.1%}); "
            + ", ".join(
                f"K={k}: {4 * k * n_full / 2**20:.1f} vs {4 * k * n_ad / 2**20:.1f}"
                for k in [int(x) for x in FLAGS.ks]
            )
        )
    # the pool as actually allocated (checks the arithmetic above on the quickstart model)
    base = tfm.init_params(cfg, jax.random.PRNGKey(0))
    ad = lora.init(base, jax.random.PRNGKey(1), rank=FLAGS.lora_rank)
    k = int(FLAGS.ks[-1])
    nbytes = [sum(x.nbytes for x in jax.tree.leaves(pool.init(tree, k).params)) for tree in (base, ad)]
    emit(
        allocated_pool_full_mb=round(nbytes[0] / 2**20, 2),
        allocated_pool_lora_mb=round(nbytes[1] / 2**20, 2),
        K=k,
    )


if __name__ == "__main__":
    app.run(main)
