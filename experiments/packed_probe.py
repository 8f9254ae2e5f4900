"""What one packed row costs in the update, and how much of it is attention (SmolLM2-135M-Instruct, float32).

    python -m experiments.packed_probe --prompt_widths=384,64 --rows=8

The gradient of the summed log-probs of `--rows` packed rows of 512 tokens (one 500-token completion each,
random tokens) through grpo_jax.policies.packed, with the prompts left-padded to each width in
`--prompt_widths` (every completion token attends P prompt keys + its row's keys): one JSON line per width
with the best of two timed calls after a compiling one. The difference between two widths is the attention to
the extra prompt keys (the projections, the MLP and the head are the same); with the host's matmul rate
printed first, as experiments.bench does. Used in docs/ROLLOUT_ENGINES.md ("Where the packed train step's
time goes").
"""

from __future__ import annotations

import json
import time

from absl import app, flags

flags.DEFINE_list("prompt_widths", ["384", "64"], "Prompt widths P to time (tokens).")
flags.DEFINE_integer("rows", 8, "Packed rows of 512 tokens.", lower_bound=2)
FLAGS = flags.FLAGS

WIDTH, LENGTH = 512, 500


def probe(cfg, params, rows: int, p: int) -> dict:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from grpo_jax.policies import packed

    rng = np.random.default_rng(0)
    b = 2
    pmask = np.ones((b, p), np.int32)
    prompt = rng.integers(10, 1000, (b, p)).astype(np.int32)
    lens = np.zeros((b, rows), np.int64)
    lens[:, : rows // b] = LENGTH  # one completion per row, rows / b per group
    cmask = (np.arange(WIDTH) < lens[..., None]).astype(np.float32)
    comps = np.where(cmask > 0, rng.integers(10, 1000, (b, rows, WIDTH)), 0).astype(np.int32)
    layout, st = packed.plan(pmask, comps, cmask, WIDTH)
    layout = jax.tree.map(lambda x: jnp.asarray(x[0]), layout)
    fn = packed.packed_policy_fn(cfg)

    def loss(params):
        logp, _ = fn(params, jnp.asarray(prompt), jnp.asarray(pmask), layout, 1.0)
        return jnp.sum(logp * cmask)

    grad = jax.jit(jax.grad(loss))
    jax.block_until_ready(grad(params))
    times = []
    for _ in range(2):
        t = time.perf_counter()
        jax.block_until_ready(grad(params))
        times.append(time.perf_counter() - t)
    return dict(
        figure="packed_grad_s", value=round(min(times), 2), rows=st.rows, row_width=WIDTH, prompt_width=p
    )


def main(argv):
    del argv
    from experiments.bench_phases import device_rates_subprocess
    from experiments.bench_varlen import _smollm2

    for k, v in device_rates_subprocess().items():
        print(json.dumps(dict(figure=k, value=round(v, 1))), flush=True)
    cfg, params, _ = _smollm2("float32")
    for p in FLAGS.prompt_widths:
        print(json.dumps(probe(cfg, params, FLAGS.rows, int(p))), flush=True)


if __name__ == "__main__":
    app.run(main)
