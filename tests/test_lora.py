"""LoRA: B = 0 leaves outputs unchanged, only adapters get gradients with a frozen base, fold == merge."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.policies import lora
from grpo_jax.policies import transformer as tfm

CFG = tfm.TransformerConfig(
    vocab_size=32, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=64, qkv_bias=True
)
TOK = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 2, 32)
MASK = jnp.ones_like(TOK)


@pytest.fixture(scope="module")
def params():
    return tfm.init_params(CFG, jax.random.PRNGKey(0))


def _logits(p):
    return tfm.forward(p, CFG, TOK, MASK)[0]


def test_zero_b_leaves_outputs_unchanged(params):
    ad = lora.init(params, jax.random.PRNGKey(2), rank=4)
    np.testing.assert_array_equal(_logits(lora.merge(params, ad)), _logits(params))
    # 7 projections x 2 layers: A [2, in, 4] and B [2, 4, out]
    assert lora.num_params(ad) == 2 * 4 * sum(
        params["layers"][t]["kernel"].shape[1] + params["layers"][t]["kernel"].shape[2] for t in lora.TARGETS
    )


def test_only_adapters_receive_gradients_with_frozen_base(params):
    ad = lora.init(params, jax.random.PRNGKey(2), rank=4)

    def loss(p, a):
        return jnp.sum(_logits(lora.merge(jax.lax.stop_gradient(p), a)) ** 2)

    gp, ga = jax.grad(loss, argnums=(0, 1))(params, ad)
    assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(gp))
    # with B = 0 the gradient reaches B (through x A) and not yet A (through B), as in the LoRA paper's init
    assert float(jnp.abs(ga["layers"]["q_proj"]["lora_b"]).max()) > 0
    assert float(jnp.abs(ga["layers"]["q_proj"]["lora_a"]).max()) == 0.0


def test_fold_equals_merge_with_trained_adapters(params):
    ad = lora.init(params, jax.random.PRNGKey(2), rank=4)
    ad = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.PRNGKey(3), x.shape), ad)
    merged, folded = _logits(lora.merge(params, ad, alpha=8.0)), _logits(lora.fold(params, ad, alpha=8.0))
    assert float(jnp.abs(merged - _logits(params)).max()) > 1e-3  # the adapters do change the function
    np.testing.assert_allclose(merged, folded, atol=1e-5)


def test_bad_rank_and_targets(params):
    with pytest.raises(ValueError, match="rank"):
        lora.init(params, jax.random.PRNGKey(0), rank=0)
    with pytest.raises(ValueError, match="not projections"):
        lora.init(params, jax.random.PRNGKey(0), rank=2, targets=("qkv",))
