"""Run in its own process with 8 forced CPU devices (see tests/test_multidevice.py).

Runs 3 GRPO train steps (the same batches) on one device, on a data-parallel mesh (8, 1) and on a
data x model mesh (4, 2) with Megatron-style sharded projections, and prints the largest differences of the
parameters and metrics as JSON.
"""

import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"

import json  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from grpo_jax.config import ObjectiveConfig, OptimConfig  # noqa: E402
from grpo_jax.policies import sampling  # noqa: E402
from grpo_jax.policies import transformer as tfm  # noqa: E402
from grpo_jax.train import sharding  # noqa: E402
from grpo_jax.train.state import init_state, make_optimizer  # noqa: E402
from grpo_jax.train.step import make_train_step, transformer_logits_fn  # noqa: E402
from grpo_jax.types import batch_from_samples  # noqa: E402

CFG = tfm.TransformerConfig(
    vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
OBJ = ObjectiveConfig(kl_coef=0.04, entropy_coef=0.01)
OPT = make_optimizer(OptimConfig(learning_rate=1e-4))
B, G, P, T = 8, 4, 6, 5


def batches():
    params = tfm.init_params(CFG, jax.random.PRNGKey(0))
    sampler = sampling.make_sampler(CFG, group=G, max_new=T, eos_id=3, pad_id=0)
    out = []
    for i in range(3):
        prompt = jax.random.randint(jax.random.PRNGKey(10 + i), (B, P), 4, CFG.vocab_size)
        pmask = (jnp.arange(P)[None] >= (jnp.arange(B) % 3)[:, None]).astype(jnp.int32)
        s = sampler(params, prompt, pmask, jax.random.PRNGKey(20 + i), sampling.sampling_params(1.0))
        r = (s.tokens[..., 0] % 3 == 0).astype(jnp.float32)
        out.append(batch_from_samples(prompt, pmask, s, r))
    return out


def run(mesh=None, model_parallel=False):
    state = init_state(tfm.init_params(CFG, jax.random.PRNGKey(0)), OBJ, OPT, seed=0)
    data = batches()
    shardings = None
    if mesh is not None:
        st_sh = sharding.state_shardings(state, mesh, model_parallel=model_parallel)
        b_sh = sharding.batch_shardings(data[0], mesh)
        state = sharding.shard(state, st_sh)
        data = [sharding.shard(b, b_sh) for b in data]
        shardings = (st_sh, b_sh)
    step = make_train_step(transformer_logits_fn(CFG), OBJ, OPT, shardings=shardings)
    ms = []
    for b in data:
        state, m, _ = step(state, b)
        ms.append({k: float(v) for k, v in m.items()})
    return jax.device_get(state.params), ms, state


def maxdiff(a, b):
    return max(
        float(np.max(np.abs(np.asarray(x) - np.asarray(y))))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False)
    )


def main():
    assert jax.device_count() == 8, jax.device_count()
    p1, m1, _ = run()
    p8, m8, s8 = run(sharding.make_mesh(8, 1))
    p42, m42, s42 = run(sharding.make_mesh(4, 2), model_parallel=True)
    qk = s42.params["layers"]["q_proj"]["kernel"]
    res = {
        "devices": jax.device_count(),
        "dp_param_diff": maxdiff(p1, p8),
        "mp_param_diff": maxdiff(p1, p42),
        "dp_metric_diff": max(abs(a[k] - b[k]) for a, b in zip(m1, m8, strict=False) for k in a),
        "mp_metric_diff": max(abs(a[k] - b[k]) for a, b in zip(m1, m42, strict=False) for k in a),
        "param_moved": maxdiff(p1, tfm.init_params(CFG, jax.random.PRNGKey(0))),
        "mp_q_proj_spec": list(qk.sharding.spec),
        "dp_batch_devices": len(s8.params["embed"].sharding.device_set),
    }
    print(json.dumps(res))


if __name__ == "__main__":
    main()
