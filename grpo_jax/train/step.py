"""The update engine: `train_step(state, batch, frozen=None) -> (state, metrics, outputs)`, jitted once with
the TrainState donated, for any Algorithm (grpo_jax.algorithms: GRPO, PPO, ...).

One call does, on device:
  1. rewards: the batch's correctness rewards (non-finite ones leave their group and are counted) plus DAPO's
     soft overlong punishment when `overlong_cache_len` > 0; the loss mask;
  2. ONE no-gradient pass at the step's parameters: π_old's log-probs and entropies (V_old with a critic) and
     π_ref's log-probs when the objective has a reference (in micro-batch chunks);
  3. the controllers' coefficients of the step (β, the entropy coefficient), measured on π_old;
  4. `algorithm.targets` (GRPO: group advantages; PPO: KL-shaped rewards, GAE, returns), without gradient;
  5. ONE `lax.scan` over μ = num_iterations epochs x mini_batches updates, each accumulating its gradient over
     micro_batches micro-batches (`algorithm.loss`), then global-norm clip and AdamW (a non-finite gradient
     skips the update and is counted: optax.apply_if_finite);
  6. the controller updates and the reference update (frozen / hard / EMA);
  7. metrics: the common ones (the seed's TensorBoard names + the standard GRPO diagnostics), the loss
     diagnostics of EVERY update of the step combined (`algorithm.combine`; TRL logs all of them too), the
     algorithm's own (`algorithm.metrics`), and `outputs` {"advantages", "rewards", ...} for histograms.

The plain step (μ = mini_batches = micro_batches = 1) is the 1 x 1 case of the same scan and pays no extra
forward: its no-gradient pass is the first update's own forward (π_old = sg(π_θ), so the first ratio is
exactly 1, as in TRL), and later epochs reuse those values. The coefficients of a step are those measured
on π_old, for every update of the step.

Normalisation with micro- and mini-batches: each epoch shuffles the B prompts into m mini-batches; each
micro-batch's loss is normalised by its MINI-batch's counts (sequences N, tokens Σ|o_i| for token_mean,
entropy-bonus tokens, the top-entropy threshold of the whole rollout batch), so the k micro-batch gradients
sum exactly to the mini-batch's (tests/test_microbatch.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

from grpo_jax.algorithms import Algorithm, Coefs, OldStats, PolicyOutputs, Rows, make_algorithm
from grpo_jax.algorithms.base import tree_where
from grpo_jax.config import ObjectiveConfig
from grpo_jax.core.advantages import soft_overlong_punishment
from grpo_jax.core.kl import kl_penalty
from grpo_jax.core.metrics import masked_mean, masked_quantile, masked_std
from grpo_jax.policies import packed
from grpo_jax.policies import transformer as tfm
from grpo_jax.policies.logp import policy_logp_fn
from grpo_jax.runtime.sharding import to_host
from grpo_jax.train.state import TrainState, make_controllers
from grpo_jax.types import RolloutBatch

sg = jax.lax.stop_gradient
# logp_fn(params, prompt, prompt_mask, completions, temperature) -> (logp, entropy[, values]) [B, G, T] each
LogpFn = Callable[..., tuple[jax.Array, ...]]


class Engine(NamedTuple):
    """What one compiled train step is made of (static)."""

    algorithm: Algorithm
    obj: ObjectiveConfig
    optimizer: optax.GradientTransformation
    forward: Callable[..., PolicyOutputs]  # (trainable params, frozen, batch, packed layout | None)
    controllers: tuple  # (kl controller, entropy controller)
    n_mini: int
    n_micro: int
    constrain: Callable[[Any], Any]  # pins a (micro-)batch's rows to the batch sharding


def make_train_step(
    model: tfm.TransformerConfig | None,
    obj: ObjectiveConfig,
    optimizer: optax.GradientTransformation,
    *,
    temperature: float = 1.0,
    micro_batches: int = 1,
    param_fn: Callable[[Any, Any], Any] | None = None,
    shardings: tuple | None = None,
    jit: bool = True,
    logp_fn: LogpFn | None = None,
    pack_tokens: int = 0,
    pad_id: int = 0,
    pack_rows_per_doubling: int = 2,
):
    """Build `train_step(state, batch, frozen=None) -> (state, metrics, outputs)` for `obj.algorithm`.

    The policy is the transformer `model` (its head chunked when model.logp_chunk > 0; its critic when
    model.value_head), or any `logp_fn(params, prompt, prompt_mask, completions, temperature) -> (logp,
    entropy[, values])` given instead (another model family: policies.logp.logp_from_logits). `temperature`:
    the sampler's, so π_θ is the distribution that sampled. `micro_batches`: gradient accumulation (the
    mini-batch count is obj.mini_batches). `param_fn(trainable, frozen)` -> full parameters for states whose
    params are not the whole model (LoRA: the adapters merged over the stop-gradient'ed base; the reference
    is param_fn(ref_params, frozen) likewise). jit=True compiles once with the TrainState donated;
    `shardings=(state, batch[, frozen])` pins the input/output shardings on a mesh (train/sharding.py).
    `pack_tokens=N` > 0: the padding-free update (grpo_jax.policies.packed; the transformer `model` only, not
    with mini-batches): before each call the batch's sequences are packed on the host into rows of N tokens
    (one layout per micro-batch, `pad_id` between them) and the forward passes run over the packed rows;
    the loss, gradient and metrics are those of the padded update to float rounding; the row count is
    packed.row_bucket's with `pack_rows_per_doubling` sizes per doubling. It adds `pack/*` metrics (rows,
    rows_needed, padding_fraction).
    """
    algorithm = make_algorithm(obj)
    check_arguments(model, obj, algorithm, micro_batches, logp_fn, pack_tokens)
    if logp_fn is None:
        if model is None:  # (check_arguments refused it already)
            raise ValueError("make_train_step: give exactly one of model and logp_fn")
        logp_fn = policy_logp_fn(model)
    policy = logp_fn
    packed_policy = packed.packed_policy_fn(model) if pack_tokens and model is not None else None

    def forward(params, frozen, batch: RolloutBatch, layout=None) -> PolicyOutputs:
        full = params if param_fn is None else param_fn(params, frozen)
        if layout is None:
            out = policy(full, batch.prompt, batch.prompt_mask, batch.completions, temperature)
        else:
            if packed_policy is None:
                raise ValueError("make_train_step: a packed layout needs pack_tokens > 0")
            out = packed_policy(full, batch.prompt, batch.prompt_mask, layout, temperature)
        if algorithm.needs_values and (len(out) != 3 or out[2] is None):
            raise ValueError(
                f"make_train_step: algorithm={algorithm.name} needs the critic's values from the policy "
                "function: logp_fn must return (logp, entropy, values)"
            )
        return PolicyOutputs(out[0], out[1], out[2] if len(out) == 3 else None)

    batch_sh = None if shardings is None else shardings[1]

    def constrain(tree):
        if not isinstance(batch_sh, jax.sharding.NamedSharding):
            return tree
        return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, batch_sh), tree)

    engine = Engine(
        algorithm, obj, optimizer, forward, make_controllers(obj), obj.mini_batches, micro_batches, constrain
    )

    def step(state: TrainState, batch: RolloutBatch, frozen: Any = None, layout=None):
        return train_step(engine, state, batch, frozen, layout)

    inner = step if not jit else compiled(step, shardings, bool(pack_tokens))
    if not pack_tokens:
        return inner
    rows_multiple = 1 if shardings is None else sharding_rows(shardings[1])
    return PackedStep(inner, pack_tokens, micro_batches, rows_multiple, pad_id, pack_rows_per_doubling)


def check_arguments(model, obj: ObjectiveConfig, algorithm: Algorithm, micro_batches, logp_fn, pack_tokens):
    """make_train_step's arguments that cannot work together: one ValueError naming them."""
    if obj.overlong_cache_len > 0 and obj.loss.max_len is None:
        raise ValueError("make_train_step: overlong_cache_len needs obj.loss.max_len (L_max) to be set")
    if (model is None) == (logp_fn is None):
        raise ValueError("make_train_step: give exactly one of model and logp_fn")
    if micro_batches < 1 or obj.mini_batches < 1:
        raise ValueError(f"make_train_step: micro_batches={micro_batches} and mini_batches must be >= 1")
    if model is not None and algorithm.needs_values and not model.value_head:
        raise ValueError(
            f"make_train_step: algorithm={algorithm.name} needs the critic's values: a model with "
            "TransformerConfig.value_head=True"
        )
    if pack_tokens and (model is None or obj.mini_batches > 1):
        raise ValueError(
            "make_train_step: pack_tokens needs the transformer `model` (not a logp_fn) and mini_batches=1 "
            f"(got mini_batches={obj.mini_batches})"
        )


def compiled(step, shardings: tuple | None, packed: bool):
    """`step` jitted with the TrainState donated; with `shardings` = (state, batch[, frozen]) its inputs and
    outputs pinned to them (the packed layout's rows over the batch axes)."""
    if shardings is None:
        return jax.jit(step, donate_argnums=0)
    state_sh, b_sh, *rest = shardings
    layout_sh = None
    if packed and isinstance(b_sh, jax.sharding.NamedSharding):
        layout_sh = jax.sharding.NamedSharding(b_sh.mesh, jax.sharding.PartitionSpec(None, *b_sh.spec))
    jitted = jax.jit(
        step,
        donate_argnums=0,
        in_shardings=(state_sh, b_sh, rest[0] if rest else None, layout_sh),
        out_shardings=(state_sh, None, None),
    )

    def sharded_step(state: TrainState, batch: RolloutBatch, frozen: Any = None, layout=None):
        return jitted(state, batch, frozen, layout)  # positional: in_shardings covers every argument

    # the ignore: `_cache_size` is jax's private attribute of a jitted function (not in JitWrapped's stubs),
    # and mypy lets no function carry an attribute
    sharded_step._cache_size = jitted._cache_size  # type: ignore[attr-defined]
    return sharded_step


def sharding_rows(batch_sharding) -> int:
    """How many parts the batch sharding splits the leading (row) axis into (1: none)."""
    if not isinstance(batch_sharding, jax.sharding.NamedSharding):
        return 1
    axes = batch_sharding.spec[0] if batch_sharding.spec else None
    axes = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    n = 1
    for a in axes:
        n *= batch_sharding.mesh.shape[a]
    return n


class PackedStep:
    """The train step with the padding-free update: `step(state, batch, frozen)` packs the batch's sequences
    on the host (grpo_jax.policies.packed.plan: one layout per micro-batch, rows a multiple of the batch
    sharding's parts) and calls the jitted step with the layout (one compilation per row count)."""

    def __init__(self, inner, width: int, parts: int, rows_multiple: int, pad_id: int, per_doubling: int = 2):
        self.inner, self.width, self.parts = inner, width, parts
        self.rows_multiple, self.pad_id, self.per_doubling = rows_multiple, pad_id, per_doubling
        self.last_plan: packed.PlanStats | None = None

    def layout(self, batch: RolloutBatch):
        """(the layout, its PlanStats) of `batch`: groups that take no part (group_mask 0) are not packed."""
        pmask, comps, cmask, gm = to_host(
            (batch.prompt_mask, batch.completions, batch.completion_mask, batch.group_mask)
        )
        return packed.plan(
            pmask,
            comps,
            np.where(np.asarray(gm)[..., None] > 0, cmask, 0),
            self.width,
            parts=self.parts,
            rows_multiple=self.rows_multiple,
            pad_id=self.pad_id,
            per_doubling=self.per_doubling,
        )

    def __call__(self, state: TrainState, batch: RolloutBatch, frozen: Any = None):
        layout, st = self.layout(batch)
        self.last_plan = st
        state, metrics, outputs = self.inner(state, batch, frozen, jax.tree.map(jnp.asarray, layout))
        metrics = dict(metrics)
        metrics["pack/rows"] = jnp.float32(st.rows * self.parts)
        metrics["pack/rows_needed"] = jnp.float32(st.needed * self.parts)  # before row_bucket's rounding
        metrics["pack/padding_fraction"] = jnp.float32(1.0 - st.tokens / st.capacity)
        return state, metrics, outputs

    @property
    def _cache_size(self):
        return self.inner._cache_size


# ------------------------------------------------------------------------------------------------------------
# one step
# ------------------------------------------------------------------------------------------------------------


def train_step(e: Engine, state: TrainState, batch: RolloutBatch, frozen: Any, layout=None):
    """The whole step (see the module docstring). `layout`: the packed layouts of the micro-batches (stacked
    [n_micro, ...]; grpo_jax.policies.packed), None for the padded update."""
    batch, finite, rewards, mask = prepare(batch, e.obj)
    fused = e.n_mini * e.n_micro == 1  # the no-gradient pass is the first update's forward
    alg = e.algorithm
    if fused:
        ref = None
        if e.obj.uses_reference:
            ref = sg(e.forward(state.ref_params, frozen, batch, first_layout(layout)).logp)
        # the rest comes from the first update (FirstUpdate): this placeholder's None leaves are never read,
        # so OldStats keeps its arrays' types (the ignore)
        old = OldStats(None, None, None, ref)  # type: ignore[arg-type]
        coefs = signals = None
    else:
        old = no_grad_pass(e, state, frozen, batch, layout)
        signals = measure(e, old, mask)
        coefs = coefficients(e, state, signals)
    targets = None
    if not alg.targets_use_old:
        targets = alg.targets(batch, rewards, mask, None, None)
    elif not fused:
        targets = alg.targets(batch, rewards, mask, old, coefs)
    rows = Rows(batch, mask, rewards, old, targets)
    params, opt_state, per_update, first = run_updates(e, state, frozen, rows, coefs, layout)
    aux, tokens, grad_norms = per_update
    if fused:  # what the first update measured
        rows, signals, coefs = rows._replace(old=first.old, targets=first.targets), first.signals, first.coefs
    return finish(e, state, rows, finite, aux, tokens, grad_norms, params, opt_state, signals, coefs)


def prepare(batch: RolloutBatch, obj: ObjectiveConfig):
    """(batch, finite [B, G], shaped rewards [B, G], loss mask [B, G, T]): a non-finite reward is a data bug,
    so its member leaves the group (and is counted in the metrics); then DAPO's overlong shaping (L_max =
    obj.loss.max_len, the run's max_new_tokens) and the tokens that enter the loss."""
    finite = jnp.isfinite(batch.rewards)
    batch = dataclasses.replace(
        batch,
        rewards=jnp.where(finite, batch.rewards, 0.0),
        group_mask=batch.group_mask * finite.astype(jnp.float32),
    )
    rewards = batch.rewards
    if obj.overlong_cache_len > 0:
        if obj.loss.max_len is None:  # (make_train_step's check_arguments refuses it)
            raise ValueError("make_train_step: overlong_cache_len needs obj.loss.max_len (L_max) to be set")
        lengths = batch.completion_mask.sum(-1)
        rewards = rewards + soft_overlong_punishment(
            lengths, max_len=obj.loss.max_len, cache_len=obj.overlong_cache_len
        )
    mask = batch.completion_mask * batch.group_mask[..., None]
    if obj.mask_truncated:
        mask = mask * (1.0 - batch.truncated.astype(jnp.float32))[..., None]
    return batch, finite, rewards, mask


def first_layout(layout):
    """The layout of the first (only) micro-batch of a stacked layout (None: the padded update)."""
    return None if layout is None else jax.tree.map(lambda x: x[0], layout)


def no_grad_pass(e: Engine, state: TrainState, frozen: Any, batch: RolloutBatch, layout=None) -> OldStats:
    """π_old (and V_old) at the step's parameters and π_ref, without gradients, in micro-batch chunks."""

    def stats(xs):
        x, lay = xs
        x = e.constrain(x)
        out = e.forward(state.params, frozen, x, lay)
        ref = sg(e.forward(state.ref_params, frozen, x, lay).logp) if e.obj.uses_reference else None
        values = None if out.values is None or not e.algorithm.needs_values else sg(out.values)
        return OldStats(sg(out.logp), sg(out.entropy), values, ref)

    return unsplit(jax.lax.map(stats, (split(batch, e.n_mini * e.n_micro), layout)))


def measure(e: Engine, old: OldStats, mask: jax.Array) -> dict[str, jax.Array]:
    """What the controllers can measure on this batch (Controller.measures), on π_old."""
    anchor = old.ref if e.obj.loss.kl_anchor == "ref" else old.logp
    kl = (
        0.0
        if anchor is None
        else masked_mean(kl_penalty(old.logp, anchor, kind=e.algorithm.kl_estimator), mask)
    )
    return {
        "entropy": sg(masked_mean(old.entropy, mask)),
        "kl": sg(jnp.float32(kl)),
        "none": jnp.float32(0.0),
    }


def coefficients(e: Engine, state: TrainState, signals: dict) -> Coefs:
    kl_ctrl, ent_ctrl = e.controllers
    return Coefs(
        kl_ctrl.applied(state.kl_ctrl, signals[kl_ctrl.measures]),
        ent_ctrl.applied(state.ent_ctrl, signals[ent_ctrl.measures]),
    )


# ------------------------------------------------------------------------------------------------------------
# the updates
# ------------------------------------------------------------------------------------------------------------


class FirstUpdate(NamedTuple):
    """The plain step's no-gradient values, from its first update's forward (carried to later epochs)."""

    old: OldStats
    targets: Any
    signals: dict
    coefs: Coefs


def run_updates(e: Engine, state: TrainState, frozen: Any, rows: Rows, coefs: Coefs | None, layout=None):
    """The scan over μ x mini_batches updates. Returns (params, opt_state, (aux [U, k, ...], tokens [U, k],
    grad norms [U]), FirstUpdate or None)."""
    fused = coefs is None
    first = first_template(e, rows) if fused else None
    n_updates = e.obj.num_iterations * e.n_mini
    thr = None  # the top-entropy threshold of the whole rollout batch, for its micro-batches
    if not fused and e.obj.loss.top_entropy_quantile < 1.0:
        thr = masked_quantile(rows.old.entropy, rows.mask, 1.0 - e.obj.loss.top_entropy_quantile)

    def update(carry, u):
        params, opt_state, first = carry
        mini, norm = mini_batch(e, state, rows, u, thr)
        if fused:
            (_, (aux, first)), grads = jax.value_and_grad(fused_loss, has_aux=True)(
                params, e, frozen, mini, state, first, u == 0, first_layout(layout)
            )
            aux, tok = jax.tree.map(lambda x: x[None], aux), mini.mask.sum()[None]
        else:
            grads, (aux, tok) = accumulate(e, params, frozen, mini, coefs, norm, layout)
        updates, opt_state = e.optimizer.update(grads, opt_state, params)
        params = optax.apply_updates(params, updates)
        return (params, opt_state, first), (aux, tok, optax.tree.norm(grads))

    (params, opt_state, first), per_update = jax.lax.scan(
        update, (state.params, state.opt_state, first), jnp.arange(n_updates)
    )
    return params, opt_state, per_update, first


def first_template(e: Engine, rows: Rows) -> FirstUpdate:
    """Zeros in the shapes of the plain step's carried no-gradient values."""
    zeros = jnp.zeros(rows.batch.completions.shape, jnp.float32)
    old = OldStats(zeros, zeros, zeros if e.algorithm.needs_values else None, rows.old.ref)
    coefs = Coefs(jnp.float32(0.0), jnp.float32(0.0))
    targets = rows.targets
    if e.algorithm.targets_use_old:
        shapes = jax.eval_shape(e.algorithm.targets, rows.batch, rows.rewards, rows.mask, old, coefs)
        targets = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    signals = {k: jnp.float32(0.0) for k in ("entropy", "kl", "none")}
    return FirstUpdate(old, targets, signals, coefs)


def fused_loss(params, e: Engine, frozen, rows: Rows, state: TrainState, carried: FirstUpdate, first, layout):
    """The plain step's loss: at the first update its own forward gives π_old (and V_old), the controllers'
    coefficients and the targets; later epochs reuse the carried ones."""
    out = e.forward(params, frozen, rows.batch, layout)
    values = None if out.values is None or not e.algorithm.needs_values else sg(out.values)
    fresh = OldStats(sg(out.logp), sg(out.entropy), values, rows.old.ref)
    old = tree_where(first, fresh, carried.old)
    signals = measure(e, old, rows.mask)
    coefs = coefficients(e, state, signals)
    targets = rows.targets
    if e.algorithm.targets_use_old:
        fresh_t = e.algorithm.targets(rows.batch, rows.rewards, rows.mask, old, coefs)
        targets = tree_where(first, fresh_t, carried.targets)
    loss, aux = e.algorithm.loss(out, rows._replace(old=old, targets=targets), coefs, {})
    return loss, (aux, FirstUpdate(old, targets, signals, coefs))


def mini_batch(e: Engine, state: TrainState, rows: Rows, u: jax.Array, thr) -> tuple[Rows, dict]:
    """The rows of update u (epoch u // m: a fresh shuffle of the prompts when m > 1) and the normalisers of
    that mini-batch ({} for the plain step, whose loss sees the whole batch); `thr`: the top-entropy
    threshold of the whole rollout batch (None: the mask is off)."""
    if e.n_mini * e.n_micro == 1:
        return rows, {}
    if e.n_mini > 1:
        B = rows.mask.shape[0]
        per = B // e.n_mini
        order = jax.random.permutation(state.key("train", "minibatch", u // e.n_mini), B)
        idx = jax.lax.dynamic_slice_in_dim(order, (u % e.n_mini) * per, per)
        rows = jax.tree.map(lambda x: x[idx], rows)
    m = rows.mask
    kept = m if thr is None else m * ((rows.old.entropy * m >= thr) & (m > 0))  # tokens of the entropy bonus
    norm = {
        "num_items": m.sum(),
        "num_seqs": m.shape[0] * m.shape[1],
        "entropy_threshold": thr,
        "entropy_items": kept.sum(),
    }
    return rows, norm


def accumulate(e: Engine, params, frozen, rows: Rows, coefs: Coefs, norm: dict, layout=None):
    """The gradient of one update summed over its micro-batches (strided row blocks), each normalised by the
    mini-batch's counts (`layout`: each micro-batch's packed layout, stacked). Returns (grads, (aux [k, ...],
    tokens [k]))."""

    def loss(p, mb: Rows, lay):
        return e.algorithm.loss(e.forward(p, frozen, mb.batch, lay), mb, coefs, norm)

    def micro(acc, xs):
        mb, lay = xs
        mb = mb._replace(batch=e.constrain(mb.batch))
        (_, aux), g = jax.value_and_grad(loss, has_aux=True)(params, mb, lay)
        return jax.tree.map(jnp.add, acc, g), (aux, mb.mask.sum())

    zeros = jax.tree.map(jnp.zeros_like, params)
    return jax.lax.scan(micro, zeros, (split(rows, e.n_micro), layout))


# ------------------------------------------------------------------------------------------------------------
# after the updates
# ------------------------------------------------------------------------------------------------------------


def finish(e: Engine, state, rows: Rows, finite, aux, tokens, grad_norms, params, opt_state, signals, coefs):
    """Controllers, reference update, metrics and the new state."""
    kl_ctrl, ent_ctrl = e.controllers
    n_samples = jnp.sum(rows.batch.group_mask)
    kl_state = kl_ctrl.update(state.kl_ctrl, signals[kl_ctrl.measures], n_steps=n_samples)
    ent_state = ent_ctrl.update(state.ent_ctrl, signals[ent_ctrl.measures], n_steps=n_samples)
    ref_params, ref_due = update_reference(state.ref_params, params, state.step + 1, e.obj)
    combined = e.algorithm.combine(aux, tokens)  # (LossAux, the algorithm's own diagnostics)
    loss_aux = combined[0]
    seq_adv, extra, extra_outputs = e.algorithm.metrics(rows, combined)
    metrics = common_metrics(e.obj, rows, finite, seq_adv, loss_aux, grad_norms, opt_state)
    metrics.update(
        {
            "coef/kl": coefs.kl,
            "coef/entropy": coefs.entropy,
            "coef/kl_next": kl_state.coef,
            "coef/entropy_next": ent_state.coef,
            "loss/final_iteration": jnp.sum(aux[0].loss[-1]),  # the last update's, over its micro-batches
            "nonfinite/rewards": jnp.sum(~finite).astype(jnp.float32),
            "ref/updated": ref_due,
        }
    )
    metrics.update(objective_metrics(e.obj, rows, loss_aux))
    metrics.update(extra)
    outputs = {"advantages": seq_adv, "rewards": rows.rewards, **extra_outputs}
    new_state = dataclasses.replace(
        state,
        step=state.step + 1,
        params=params,
        opt_state=opt_state,
        kl_ctrl=kl_state,
        ent_ctrl=ent_state,
        ref_params=ref_params,
    )
    return new_state, metrics, outputs


def objective_metrics(obj: ObjectiveConfig, rows: Rows, aux) -> dict[str, jax.Array]:
    """The diagnostics of options of the policy loss that are on (overlong shaping, IS correction, the
    off-policy and top-entropy masks, VESPO's weight)."""
    batch, mask, m = rows.batch, rows.mask, {}
    if obj.overlong_cache_len > 0:
        m["reward/correctness"] = masked_mean(batch.rewards, batch.group_mask)
        m["reward/overlong"] = masked_mean(rows.rewards - batch.rewards, batch.group_mask)
    if obj.loss.tis_enabled:  # off-policy diagnostics: the IS-correction weights of this batch
        m["tis/weight_mean"] = aux.is_weight_mean
        if obj.loss.tis_cap is not None:
            w_raw = jnp.exp(jnp.where(mask > 0, rows.old.logp - batch.logp_sampler, 0.0))
            m["tis/capped_frac"] = masked_mean((w_raw > obj.loss.tis_cap).astype(jnp.float32), mask)
    if obj.loss.off_policy_mask_threshold is not None:
        m["off_policy_mask/kept"] = aux.off_policy_kept
    if obj.loss.top_entropy_quantile < 1.0:
        m["entropy_mask/kept"] = aux.entropy_kept
    if obj.loss.objective == "vespo":
        m["vespo/phi_seq_mean"] = aux.phi_seq_mean
    return m


def common_metrics(obj, rows: Rows, finite, adv, aux, grad_norms, opt_state) -> dict[str, jax.Array]:
    """The seed's TensorBoard names and the standard GRPO diagnostics (TRL's names where they exist). The
    loss diagnostics and grad_norm are over every update of the step; frac_reward_zero_std is over the
    batch's B groups, including groups masked out of the loss (dynamic sampling's filler)."""
    batch, r, mask = rows.batch, rows.rewards, rows.mask
    gm = batch.group_mask
    n = jnp.maximum(gm.sum(), 1.0)
    f = finite.astype(jnp.float32)
    sampled = (f.sum(-1) > 0).astype(jnp.float32)  # groups with a finite reward: every group that was sampled
    g_std = masked_std(r, f, axis=-1)  # per-group reward std (population): 0 = no policy gradient
    lengths = batch.completion_mask.sum(-1)
    success = (batch.rewards >= obj.success_threshold).astype(jnp.float32)
    return {
        # the seed document's TensorBoard names
        "Policy/Entropy": aux.entropy,
        "Training/AdvantageNorm": jnp.sqrt(jnp.sum(jnp.square(adv) * gm) / n),  # RMS over valid samples
        "Performance/SuccessRate": jnp.sum(success * gm) / n,
        # standard GRPO diagnostics (TRL names where they exist)
        "loss": aux.loss,
        "loss/policy": aux.pg_loss,
        "kl": aux.kl,
        "entropy": aux.entropy,
        "clip_ratio/low": aux.clip_low_frac,
        "clip_ratio/high": aux.clip_high_frac,
        "clip_ratio/region": aux.clip_region_frac,
        "clip_ratio/low_min": aux.clip_low_min,
        "clip_ratio/high_max": aux.clip_high_max,
        "ratio/mean": aux.ratio_mean,
        "ratio/max": aux.ratio_max,
        "ratio/min": aux.ratio_min,
        "adv/mean": jnp.sum(adv * gm) / n,
        "adv/abs_mean": jnp.sum(jnp.abs(adv) * gm) / n,
        "reward": jnp.sum(r * gm) / n,
        "reward_std": masked_std(r, gm),
        "frac_reward_zero_std": jnp.sum((g_std == 0) * sampled) / jnp.maximum(sampled.sum(), 1.0),
        "completions/mean_length": jnp.sum(lengths * gm) / n,
        "completions/min_length": jnp.min(jnp.where(gm > 0, lengths, jnp.inf)),
        "completions/max_length": jnp.max(jnp.where(gm > 0, lengths, -jnp.inf)),
        "completions/clipped_ratio": jnp.sum(batch.truncated * gm) / n,
        "grad_norm": jnp.mean(grad_norms),
        "nonfinite/skipped_total": opt_state.total_notfinite.astype(jnp.float32),
        "nonfinite/consecutive": opt_state.notfinite_count.astype(jnp.float32),
        "logp_mismatch": masked_mean(jnp.abs(batch.logp_sampler - rows.old.logp), mask),
        "tokens": mask.sum(),
    }


def update_reference(ref: Any, params: Any, new_step: jax.Array, obj: ObjectiveConfig):
    """π_ref after the update that made `new_step` (docs/GRPO_MATH.md §3 row 9): frozen; hard reset π_ref ←
    π_θ; or
    EMA π_ref ← π_ref + τ (π_θ − π_ref) — each every `ref_update_every` steps. Returns (ref, updated 0/1)."""
    if ref is None or obj.ref_update == "frozen":
        return ref, jnp.float32(0.0)
    due = (new_step % obj.ref_update_every) == 0

    def upd(r, p):
        if obj.ref_update == "hard":
            new = p.astype(r.dtype)
        else:
            r32 = r.astype(jnp.float32)
            new = (r32 + obj.ref_ema_tau * (p.astype(jnp.float32) - r32)).astype(r.dtype)
        return jnp.where(due, new, r)

    return jax.tree.map(upd, ref, params), due.astype(jnp.float32)


def split(tree: Any, n: int) -> Any:
    """[B, ...] leaves -> [n, B/n, ...], strided (row b goes to part b mod n), so a batch sharded in
    contiguous row blocks over the devices gives every part a share of every device's rows (no data
    movement). B must divide by n (the config checks prompts_per_step)."""
    return jax.tree.map(lambda x: x.reshape(x.shape[0] // n, n, *x.shape[1:]).swapaxes(0, 1), tree)


def unsplit(tree: Any) -> Any:
    """The inverse of split: [n, B/n, ...] -> [B, ...]."""
    return jax.tree.map(lambda x: x.swapaxes(0, 1).reshape(-1, *x.shape[2:]), tree)
