"""What an RL algorithm is to the train step: an `Algorithm`, a NamedTuple of pure functions (optax style),
plus the data they exchange with the engine (grpo_jax.train.step).

    alg = grpo_jax.algorithms.make_algorithm(obj)        # obj: config.ObjectiveConfig (static)
    targets = alg.targets(batch, rewards, mask, old, coefs)   # no gradient: advantages, returns, ...
    loss, aux = alg.loss(out, rows, coefs, norm)             # one (micro-)batch, differentiated
    seq_adv, extra, outputs = alg.metrics(rows, aux)         # what the algorithm adds to the step's metrics

The engine owns everything the algorithms share: the no-gradient pass (π_old, π_ref, V_old, entropies), the
controllers (β and the entropy coefficient: `Coefs`), the μ x mini-batch updates with gradient accumulation,
the reference update and the common metrics. A new algorithm is one module with a `make(obj) -> Algorithm`
and its name in `grpo_jax.algorithms.ALGORITHMS` (WORKSPACE.md §4 has the recipe).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from grpo_jax.algorithms.policy_loss import LossAux
from grpo_jax.types import RolloutBatch


class PolicyOutputs(NamedTuple):
    """The policy on a batch, [B, G, T] each (differentiated in the loss)."""

    logp: jax.Array  # log π_θ of each completion token
    entropy: jax.Array  # entropy of π_θ at each position
    values: jax.Array | None = None  # the critic's V (algorithms with needs_values)


class OldStats(NamedTuple):
    """No-gradient values at the step's parameters, [B, G, T] each: what each update of the step uses."""

    logp: jax.Array  # π_old (the policy that sampled, up to the sampler's float noise)
    entropy: jax.Array  # the policy entropy the controllers and the top-entropy threshold see
    values: jax.Array | None  # V_old (algorithms with needs_values), else None
    ref: jax.Array | None  # log π_ref when the objective has a reference, else None


class Coefs(NamedTuple):
    """The coefficients of this step, from the controllers (data: changing them never recompiles)."""

    kl: jax.Array  # β
    entropy: jax.Array  # the entropy-bonus coefficient


class Rows(NamedTuple):
    """One (micro-)batch as a loss sees it: every leaf has the batch's leading prompt axis."""

    batch: RolloutBatch
    mask: jax.Array  # [B, G, T] tokens in the loss (completion x group member x not-truncated when masked)
    rewards: jax.Array  # [B, G] the shaped rewards the targets came from
    old: OldStats
    targets: Any  # the algorithm's targets (leading axis B)


class Algorithm(NamedTuple):
    """An RL algorithm over the shared engine. Static flags first, then the three functions.

    targets(batch, rewards, mask, old, coefs) -> targets    pytree, leading axis B, stop-gradient;
        `old` / `coefs` are None when `targets_use_old` is False (then the engine calls it once, up front)
    loss(out, rows, coefs, norm) -> (loss, aux)             aux = (LossAux, the algorithm's own scalars or
        None); `norm` holds the normalisers of the mini-batch a micro-batch belongs to (num_items,
        num_seqs, entropy_threshold, entropy_items), empty when the rows are the whole batch
    combine(aux [U, k, ...], tokens [U, k]) -> aux          the step's diagnostics from its U updates x k
        micro-batches (every update, not only the first epoch)
    metrics(rows, aux) -> (seq_adv [B, G], extra metrics, extra histogram outputs)
    """

    name: str
    targets: Callable[..., Any]
    loss: Callable[..., tuple[jax.Array, Any]]
    combine: Callable[[Any, jax.Array], Any]
    metrics: Callable[[Rows, Any], tuple[jax.Array, dict, dict]]
    kl_estimator: str  # the per-token KL estimate the controllers measure (and `kl` logs)
    needs_values: bool = False  # the policy must return a critic's values (a value head)
    targets_use_old: bool = False  # targets need π_old / V_old / β (computed after the no-gradient pass)


# how each LossAux field of the micro-batches / updates combines into the step's value
_SUMMED = ("loss", "pg_loss")  # normalised by the whole (mini-)batch's counts: they add up per update
_MAXED = ("ratio_max", "clip_high_max")
_MINNED = ("ratio_min", "clip_low_min")
_SEQ_MEANS = ("off_policy_kept", "phi_seq_mean")  # plain means over sequences (equal-sized micro-batches)


def combine_aux(aux: LossAux, tokens: jax.Array, importance_level: str, n_updates: int) -> LossAux:
    """One LossAux from per-micro-batch ones stacked on axis 0 (`tokens` [n]: each one's valid tokens), over
    `n_updates` optimiser updates: the losses summed over the micro-batches of an update and averaged over
    the updates; max / min for the extremes; plain means for per-sequence shares (and the clip fractions at
    importance_level="sequence"); token-weighted means for the token means."""
    w = tokens / jnp.maximum(tokens.sum(), 1.0)
    seq_means = _SEQ_MEANS + (
        ("clip_low_frac", "clip_high_frac", "clip_region_frac") if importance_level == "sequence" else ()
    )
    has = tokens > 0
    out = {}
    for name, x in aux._asdict().items():
        if name in _SUMMED:
            out[name] = x.sum() / n_updates
        elif name in _MAXED:
            out[name] = jnp.where(has.any(), jnp.where(has, x, -jnp.inf).max(), 0.0)
        elif name in _MINNED:
            out[name] = jnp.where(has.any(), jnp.where(has, x, jnp.inf).min(), 0.0)
        elif name in seq_means:
            out[name] = x.mean()
        else:
            out[name] = jnp.sum(x * w)
    return LossAux(**out)


def tree_where(cond: jax.Array, a: Any, b: Any) -> Any:
    """Leaf-wise jnp.where(cond, a, b) over two pytrees of the same structure (None leaves stay None)."""
    return jax.tree.map(lambda x, y: jnp.where(cond, x, y), a, b)
