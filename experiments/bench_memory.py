"""Memory benchmark of the GRPO train step with a real vocabulary: full logits vs the chunked LM head.

    python -m experiments.bench_memory          # naive, chunk 128 / 256 / 512, one process each
    python -m experiments.bench_memory --remat  # the same with per-layer rematerialisation
    python -m experiments.bench_memory --variants=naive,256 --steps=1

Model: Qwen2.5-0.5B-shaped with few layers (d_model 896, 14 heads, 2 kv heads, d_ff 4864, q/k/v bias, tied
embeddings, vocab 151 936; 2 layers by default: 166 M parameters, 136 M of them the embedding/head), float32.
Batch: 2 prompts x G = 4 x (64 prompt + 128 completion) tokens, every completion full length (no EOS: the
worst case), β = 0.04 so the reference pass runs, AdamW. The completions are random ids by default (the train
step's memory and time do not depend on their values); `--sample` draws them with the KV-cache sampler
instead (slower: 128 decode steps over the 151 936-id head).

Variants: `naive` = `transformer_logits_fn` (the [B, G, T, V] float32 logits, then token_logp), `chunkC` =
`grpo_jax.policies.logp.make_logp_fn(cfg, C)` (forward_grouped(return_hidden=True) + a chunked head that
never holds more than C positions' logits, forward or backward). Each variant runs in its own subprocess, so
the process peak RSS (VmHWM) is that variant's. Figures, one JSON line each, per variant:
  xla_temp_mb       compiled train step's temporary buffers (memory_analysis: XLA's buffer assignment peak)
  xla_argument_mb   its arguments (TrainState + batch; the state is donated, so the outputs alias it)
  xla_output_mb     its outputs
  rss_before_mb     process RSS after building the state and compiling, before the first step
  peak_rss_mb       process peak RSS (VmHWM) after the steps
  compile_s         lower + compile
  step_s            fastest of the timed steps (the least disturbed by other load; the first execution is
                    a warm-up, not timed)
then a `summary` line: naive vs the best chunked variant, peaks and ratios. Timings are only comparable
within one run (the host and its load vary: ../shared/design/ARCHITECTURE.md §4).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from absl import app, flags

flags.DEFINE_list("variants", ["naive", "128", "256", "512"], "naive and/or chunk sizes.")
flags.DEFINE_string("variant", None, "Run ONE variant in this process (what the parent spawns).")
flags.DEFINE_bool("remat", False, "Per-layer rematerialisation (TransformerConfig.remat).")
flags.DEFINE_integer("layers", 2, "Transformer layers.", lower_bound=1)
flags.DEFINE_integer("prompts", 2, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 4, "Completions per prompt (G).", lower_bound=2)
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens (P).", lower_bound=1)
flags.DEFINE_integer("new_tokens", 128, "Completion tokens (T).", lower_bound=1)
flags.DEFINE_integer("vocab", 151936, "Vocabulary size.", lower_bound=2)
flags.DEFINE_integer("steps", 2, "Timed steps (after one untimed warm-up execution).", lower_bound=1)
flags.DEFINE_bool("sample", False, "Draw the completions with the sampler (else random ids).")
FLAGS = flags.FLAGS

MB = 2**20


def emit(**kw):
    print(json.dumps(kw), flush=True)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    return float("nan")


def run_variant(variant: str) -> None:
    import jax
    import jax.numpy as jnp

    from grpo_jax.config import ObjectiveConfig, OptimConfig
    from grpo_jax.policies import sampling
    from grpo_jax.policies import transformer as tfm
    from grpo_jax.policies.logp import make_logp_fn
    from grpo_jax.train.state import init_state, make_optimizer
    from grpo_jax.train.step import make_train_step, transformer_logits_fn
    from grpo_jax.types import SampleOutput, batch_from_samples

    B, G, P, T = FLAGS.prompts, FLAGS.group, FLAGS.prompt_len, FLAGS.new_tokens
    cfg = tfm.TransformerConfig(
        vocab_size=FLAGS.vocab,
        d_model=896,
        n_layers=FLAGS.layers,
        n_heads=14,
        n_kv_heads=2,
        d_ff=4864,
        qkv_bias=True,
        tie_embeddings=True,
        rope_theta=1e6,
        remat=FLAGS.remat,
    )
    obj = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.001)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-6, grad_clip=1.0))
    params = tfm.init_params(cfg, jax.random.PRNGKey(0))
    state = init_state(params, obj, optimizer, seed=0)
    del params
    if variant == "naive":
        train_step = make_train_step(transformer_logits_fn(cfg), obj, optimizer)
    else:
        train_step = make_train_step(None, obj, optimizer, logp_fn=make_logp_fn(cfg, int(variant)))
    prompt = jax.random.randint(jax.random.PRNGKey(1), (B, P), 2, cfg.vocab_size)
    pmask = jnp.ones((B, P), jnp.int32)
    if FLAGS.sample:
        sampler = sampling.make_sampler(cfg, group=G, max_new=T, eos_id=-1, pad_id=0)
        out = sampler(state.params, prompt, pmask, jax.random.PRNGKey(2), sampling.sampling_params(1.0))
    else:
        toks = jax.random.randint(jax.random.PRNGKey(2), (B, G, T), 2, cfg.vocab_size)
        out = SampleOutput(
            tokens=toks,
            logp=jnp.zeros((B, G, T), jnp.float32),
            mask=jnp.ones((B, G, T), jnp.float32),
            lengths=jnp.full((B, G), T, jnp.int32),
            truncated=jnp.ones((B, G), bool),
        )
    rewards = (out.tokens[..., 0] % 2).astype(jnp.float32)  # any non-constant reward
    batch = batch_from_samples(prompt, pmask, out, rewards)
    jax.block_until_ready((state, batch))

    t = time.perf_counter()
    compiled = train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t
    ma = compiled.memory_analysis()
    rss_before = _status_mb("VmRSS")
    times = []
    for i in range(FLAGS.steps + 1):
        t = time.perf_counter()
        state, metrics, _ = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        if i:
            times.append(time.perf_counter() - t)
    common = dict(
        variant="naive" if variant == "naive" else f"chunk{variant}",
        remat=FLAGS.remat,
        params=cfg.num_params(),
        B=B,
        G=G,
        P=P,
        T=T,
        V=cfg.vocab_size,
        layers=cfg.n_layers,
        backend=jax.default_backend(),
    )
    emit(figure="xla_temp_mb", value=round(ma.temp_size_in_bytes / MB, 1), **common)
    emit(figure="xla_argument_mb", value=round(ma.argument_size_in_bytes / MB, 1), **common)
    emit(figure="xla_output_mb", value=round(ma.output_size_in_bytes / MB, 1), **common)
    emit(figure="rss_before_mb", value=round(rss_before, 1), **common)
    emit(figure="peak_rss_mb", value=round(_status_mb("VmHWM"), 1), **common)
    emit(figure="compile_s", value=round(compile_s, 2), **common)
    emit(figure="step_s", value=round(min(times), 3), **common)
    emit(figure="loss", value=float(metrics["loss"]), **common)  # the variants train the same objective


def main(argv):
    del argv
    if FLAGS.variant is not None:
        run_variant(FLAGS.variant)
        return
    for v in FLAGS.variants:
        if v != "naive" and not (v.isdigit() and int(v) > 0):
            raise app.UsageError(f"--variants: {v!r} is neither 'naive' nor a positive chunk size")
    passthrough = [
        f"--layers={FLAGS.layers}",
        f"--prompts={FLAGS.prompts}",
        f"--group={FLAGS.group}",
        f"--prompt_len={FLAGS.prompt_len}",
        f"--new_tokens={FLAGS.new_tokens}",
        f"--vocab={FLAGS.vocab}",
        f"--steps={FLAGS.steps}",
        "--remat" if FLAGS.remat else "--noremat",
        "--sample" if FLAGS.sample else "--nosample",
    ]
    figures: dict[str, dict[str, float]] = {}
    for v in FLAGS.variants:  # one process per variant: its peak RSS is its own
        args = [sys.executable, "-m", "experiments.bench_memory", f"--variant={v}", *passthrough]
        proc = subprocess.run(args, capture_output=True, text=True, env=dict(os.environ))
        if proc.returncode:  # e.g. killed by the kernel's OOM killer (-9): that is a result too
            why = (
                "killed by SIGKILL (out of memory?)" if proc.returncode == -9 else proc.stderr.strip()[-500:]
            )
            emit(figure="failed", variant=v, remat=FLAGS.remat, returncode=proc.returncode, why=why)
            figures[v if v == "naive" else f"chunk{v}"] = {"failed": proc.returncode}
            continue
        for line in proc.stdout.splitlines():
            if line.startswith("{"):
                print(line, flush=True)
                rec = json.loads(line)
                figures.setdefault(rec["variant"], {})[rec["figure"]] = rec["value"]
    chunked = [k for k in figures if k != "naive" and "failed" not in figures[k]]
    summary = dict(figure="summary", remat=FLAGS.remat, variants=figures)
    if "naive" in figures and "failed" not in figures["naive"] and chunked:
        best = min(chunked, key=lambda k: figures[k]["peak_rss_mb"])
        n, c = figures["naive"], figures[best]
        summary.update(
            best=best,
            temp_ratio=round(c["xla_temp_mb"] / n["xla_temp_mb"], 3),
            peak_rss_ratio=round(c["peak_rss_mb"] / n["peak_rss_mb"], 3),
            step_time_ratio=round(c["step_s"] / n["step_s"], 3),
            text=(
                f"remat={FLAGS.remat}: naive peak RSS {n['peak_rss_mb'] / 1024:.2f} GiB (XLA temp "
                f"{n['xla_temp_mb'] / 1024:.2f} GiB, step {n['step_s']:.1f} s) vs {best} "
                f"{c['peak_rss_mb'] / 1024:.2f} GiB (temp {c['xla_temp_mb'] / 1024:.2f} GiB, step "
                f"{c['step_s']:.1f} s): peak x{c['peak_rss_mb'] / n['peak_rss_mb']:.2f}, "
                f"temp x{c['xla_temp_mb'] / n['xla_temp_mb']:.2f}"
            ),
        )
    emit(**summary)


if __name__ == "__main__":
    app.run(main)
