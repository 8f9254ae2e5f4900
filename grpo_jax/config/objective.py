"""The objective section: the algorithm (grpo_jax.config.algorithms: one module per --algorithm, each with its
own section), advantages, baseline, KL and entropy coefficients, reference updates, reward shaping."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, ClassVar

from grpo_jax.config.algorithms import spec as algorithm_spec
from grpo_jax.config.algorithms import specs as algorithm_specs
from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, _positive, _schedule_ok, opt
from grpo_jax.config.controller import _MULTIPLICATIVE, ControllerConfig
from grpo_jax.config.loss import PolicyLossConfig

if TYPE_CHECKING:
    from grpo_jax.config.algorithms.dppo import DPPOConfig
    from grpo_jax.config.algorithms.ppo import PPOConfig
from grpo_jax.core.advantages import GROUP_ADV_METHODS
from grpo_jax.errors import fail

_ALGORITHMS = algorithm_specs()
# --algorithm's choices and help, from the registry (grpo_jax.algorithms.ALGORITHMS has one factory each)
ALGORITHMS = tuple(a.name for a in _ALGORITHMS)
ALGORITHM_HELP = ", ".join(a.help for a in _ALGORITHMS[:-1]) + f" or {_ALGORITHMS[-1].help}."
BASELINES = ("group", "pool", "mix")
REF_UPDATES = ("frozen", "hard", "ema")
MULTISCALE_MODES = ("mean_of_tests", "fraction")


def _with_algorithm_sections(cls: type) -> type:
    """Give the objective each registered algorithm's own section as the field named after the algorithm,
    right after `algorithm`, in registration order (the order of run.json and of the flags)."""
    annotations = {}
    for name, tp in cls.__dict__["__annotations__"].items():
        annotations[name] = tp
        if name == "algorithm":
            for a in _ALGORITHMS:
                if a.section is not None:
                    annotations[a.name] = a.section
                    setattr(cls, a.name, a.section())
    cls.__annotations__ = annotations
    return cls


@dataclasses.dataclass(frozen=True)
@_with_algorithm_sections
class ObjectiveConfig:
    """The objective: the algorithm, advantages, baseline, coefficients, reference updates, reward shaping.

    The defaults are canonical GRPO (DeepSeekMath: z-score advantages, k3 KL to a frozen π_ref with β = 0.04,
    clip 0.2, seq-mean-token-mean); published recipes are named in grpo_jax.presets. algorithm="ppo" replaces
    the group-relative advantages by a critic's (PPOConfig) on the same rollout.
    """

    FLAG_PREFIX: ClassVar[str] = ""
    algorithm: str = opt("grpo", ALGORITHM_HELP, choices=ALGORITHMS)
    # here each registered algorithm's own section, as the field named after it (_with_algorithm_sections):
    # ppo: PPOConfig = PPOConfig(), dppo: DPPOConfig = DPPOConfig()
    adv_method: str = opt(
        "grpo",
        "Advantage estimator: grpo (z-score), dr_grpo (mean only), rloo, batch_std.",
        choices=GROUP_ADV_METHODS,
    )
    adv_ddof: int = opt(1, "ddof of the group std (TRL: 1).")
    adv_eps: float = opt(1e-4, "eps added to the group std (TRL: 1e-4).")
    baseline: str = opt(
        "group",
        "Advantage baseline: group (canonical GRPO), pool (the past-policy pool's mean "
        "reward on the same prompt, scale-only form) or mix (a weighted sum of both).",
        choices=BASELINES,
    )
    baseline_mix: float = opt(0.5, "Weight of the pool baseline in --baseline=mix, in [0, 1].")
    baseline_std_floor: float = opt(1.0, "Advantage scale of all-equal groups under a pool baseline.")
    loss: PolicyLossConfig = PolicyLossConfig()
    kl_coef: float = opt(
        0.04,
        "KL coefficient β of the KL to the reference (the SFT policy); 0 removes the "
        "reference model. With --kl_schedule: β of step 0. With --algorithm=ppo: β of the KL-shaped "
        "per-token reward (no KL term in the loss).",
    )
    kl_schedule: tuple[tuple[int, float], ...] = opt(
        (),
        "Piecewise-constant β by GRPO step, 'step:beta,...' "
        "from step 0 (the seed: 0:0.03,100:0.01,500:0.005).",
    )
    entropy_coef: float = opt(0.0, "Entropy bonus coefficient (initial value if a controller drives it).")
    controller: ControllerConfig = ControllerConfig()
    mask_truncated: bool = opt(False, "Drop completions without EOS from the loss (DAPO overlong filter).")
    overlong_cache_len: int = opt(
        0,
        "DAPO soft overlong punishment: completions longer than max_new_tokens - "
        "this many tokens get a linear penalty down to -1 (0 = off).",
    )
    num_iterations: int = opt(
        1, "Epochs over each rollout batch (μ); μ > 1 moves π_θ off π_old (PPO-style reuse)."
    )
    mini_batches: int = opt(
        1,
        "Optimiser updates per epoch over a rollout batch: its prompts are shuffled and split into this "
        "many mini-batches (TRL steps_per_generation); updates = mini_batches x num_iterations.",
    )
    success_threshold: float = opt(
        1.0, "A sample counts as a success (Performance/SuccessRate) at reward >= this."
    )
    ref_update: str = opt(
        "frozen",
        "Reference policy updates: frozen, hard (π_ref ← π_θ every N steps, R1) or "
        "ema (π_ref ← π_ref + τ(π_θ − π_ref)); needs a KL to the reference.",
        choices=REF_UPDATES,
    )
    ref_update_every: int = opt(1, "Reference update period in GRPO steps (hard reset or EMA step).")
    ref_ema_tau: float = opt(0.005, "EMA rate τ of --ref_update=ema (the seed: 0.005).")
    multiscale_w_tests: float = opt(0.0, "Weight of the per-test sub-goal advantage (0 = off).")
    multiscale_mode: str = opt(
        "mean_of_tests", "Per-test advantage form: mean_of_tests or fraction.", choices=MULTISCALE_MODES
    )

    if TYPE_CHECKING:  # the algorithms' sections, added at import by _with_algorithm_sections (for mypy)
        ppo: PPOConfig = dataclasses.field(default_factory=PPOConfig)
        dppo: DPPOConfig = dataclasses.field(default_factory=DPPOConfig)

    def __post_init__(self):
        _choice(self, "adv_method", GROUP_ADV_METHODS)
        if self.adv_ddof not in (0, 1):
            fail(self, "adv_ddof", "valid: 0 or 1")
        _positive(
            self,
            ("adv_eps", "kl_coef", "entropy_coef", "multiscale_w_tests", "overlong_cache_len"),
            strict=False,
        )
        _choice(self, "baseline", BASELINES)
        if self.baseline != "group" and self.adv_method != "grpo":
            fail(self, "baseline", "a pool baseline uses the group-std scale: it needs adv_method=grpo")
        if not 0 <= self.baseline_mix <= 1:
            fail(self, "baseline_mix", "must be in [0, 1]")
        _positive(self, ("baseline_std_floor",))
        _choice(self, "ref_update", REF_UPDATES)
        _choice(self, "multiscale_mode", MULTISCALE_MODES)
        if self.ref_update_every < 1:
            fail(self, "ref_update_every", "must be an integer >= 1")
        if not 0 < self.ref_ema_tau <= 1:
            fail(self, "ref_ema_tau", "must be in (0, 1]")
        if self.num_iterations < 1:
            fail(self, "num_iterations", "must be an integer >= 1")
        _positive(self, ("mini_batches",))
        _schedule_ok(self, "kl_schedule", "0:0.03,100:0.01,500:0.005")
        if any(v < 0 for _, v in self.kl_schedule):
            fail(self, "kl_schedule", "every β must be >= 0")
        if self.kl_schedule and self.kl_schedule[0][1] != self.kl_coef:
            fail(self, "kl_schedule", f"its step-0 value must equal kl_coef={self.kl_coef} (β of step 0)")
        if self.kl_schedule and self.controller.drives == "kl_coef":
            fail(
                self, "kl_schedule", f"cannot be combined with controller {self.controller.kind!r} on kl_coef"
            )
        c = self.controller
        if c.kind in _MULTIPLICATIVE and c.drives is not None and getattr(self, c.drives) == 0:
            fail(self, c.drives, f"controller {c.kind!r} scales its coefficient: it needs a start value > 0")
        if self.loss.kl_anchor == "old" and self.num_iterations == 1:
            fail(
                self,
                "loss.kl_anchor",
                "with num_iterations=1 (μ = 1) π_old = sg(π_θ), so the KL to π_old is 0 "
                "in value (and, for k2/k3, in gradient; k1 leaves only a mean-zero score term): use "
                "kl_anchor=ref, or num_iterations > 1",
            )
        if self.ref_update != "frozen" and not self.uses_reference:
            fail(self, "ref_update", "moving the reference needs a KL to it (kl_coef > 0, kl_anchor=ref)")
        _choice(self, "algorithm", ALGORITHMS)
        check = algorithm_spec(self.algorithm).check
        if check is not None:
            check(self)
        _check_sub_settings(self, "objective", SUB_SETTINGS)

    @property
    def uses_kl(self) -> bool:
        """Whether the run has a KL penalty (a β that can be > 0: kl_coef, the schedule, a KL controller)."""
        beta = self.kl_coef > 0 or any(v > 0 for _, v in self.kl_schedule)
        return beta or self.controller.drives == "kl_coef"

    @property
    def uses_reference(self) -> bool:
        """Whether a reference model is needed (a KL to π_ref whose coefficient can be > 0)."""
        return self.loss.kl_anchor == "ref" and self.uses_kl

    @property
    def uses_entropy_bonus(self) -> bool:
        """Whether the loss has an entropy bonus (a coefficient that can be > 0)."""
        return self.entropy_coef > 0 or self.controller.drives == "entropy_coef"


def _algo(o) -> str:
    return f"--algorithm={o.algorithm}"


def _loss_objective(o) -> str:
    return f"--objective={o.loss.objective}"


def _algorithms_with(attr: str) -> tuple[str, tuple[str, ...]]:
    """(`--algorithm=a|b`, (a, b)): the algorithms whose AlgorithmSpec reason `attr` ("without_...") is empty,
    i.e. those that have the thing."""
    names = tuple(a.name for a in _ALGORITHMS if not getattr(a, attr))
    return "--algorithm=" + "|".join(names), names


def _what(what: str, attr: str) -> str:
    """`what`, then why the algorithms without it go without it."""
    return "; ".join([what, *(getattr(a, attr) for a in _ALGORITHMS if getattr(a, attr))])


_GROUP_ADV, _GROUP_ADV_ALGOS = _algorithms_with("without_group_advantages")
_LOSS_KL, _LOSS_KL_ALGOS = _algorithms_with("without_loss_kl")
_RATIO, _RATIO_ALGOS = _algorithms_with("without_ratio_policy_term")

# the sub-settings of the objective's optional mechanisms (base.Mechanism: one rule): each algorithm's own
# section first, then the objective's, then the TRL-style fields that every loss carries whatever its policy
# term (PolicyLossConfig by itself accepts them: the objective refuses them)
SUB_SETTINGS: tuple[Mechanism, ...] = (
    *(m for m in (a.mechanism() for a in _ALGORITHMS) if m is not None),
    Mechanism(
        "group_advantages",
        "objective",
        _GROUP_ADV,
        _what("group-relative advantages", "without_group_advantages"),
        lambda o: o.algorithm in _GROUP_ADV_ALGOS,
        _algo,
        ("adv_ddof", "adv_eps"),
    ),
    Mechanism(
        "pool_baseline_scale",
        "objective",
        "--baseline=pool|mix",
        "the advantage scale of all-equal groups under a pool baseline",
        lambda o: o.baseline != "group",
        lambda o: f"--baseline={o.baseline}",
        ("baseline_std_floor",),
    ),
    Mechanism(
        "mix_baseline",
        "objective",
        "--baseline=mix",
        "the weight of the pool baseline in the mix",
        lambda o: o.baseline == "mix",
        lambda o: f"--baseline={o.baseline}",
        ("baseline_mix",),
    ),
    Mechanism(
        "kl",
        "objective",
        "--kl_coef > 0 (or a --kl_schedule or KL controller that makes β > 0)",
        "a KL penalty",
        lambda o: o.uses_kl,
        lambda o: f"--kl_coef={o.kl_coef}",
        (
            "loss.kl_estimator",
            "loss.kl_anchor",
            "loss.kl_bias_correction",
            *(f"{a.name}.{f}" for a in _ALGORITHMS for f in a.kl_fields),
        ),
    ),
    Mechanism(
        "loss_kl",
        "objective",
        _LOSS_KL,
        _what("the loss's KL term", "without_loss_kl"),
        lambda o: o.algorithm in _LOSS_KL_ALGOS,
        _algo,
        ("loss.kl_estimator", "loss.kl_bias_correction"),
    ),
    Mechanism(
        "entropy_bonus",
        "objective",
        "--entropy_coef > 0 (or an entropy controller)",
        "an entropy bonus",
        lambda o: o.uses_entropy_bonus,
        lambda o: f"--entropy_coef={o.entropy_coef}",
        ("loss.entropy_bonus",),
    ),
    Mechanism(
        "reference_updates",
        "objective",
        "--ref_update=hard|ema",
        "reference updates",
        lambda o: o.ref_update != "frozen",
        lambda o: f"--ref_update={o.ref_update}",
        ("ref_update_every",),
    ),
    Mechanism(
        "ema_reference",
        "objective",
        "--ref_update=ema",
        "the EMA reference",
        lambda o: o.ref_update == "ema",
        lambda o: f"--ref_update={o.ref_update}",
        ("ref_ema_tau",),
    ),
    Mechanism(
        "multiscale",
        "objective",
        "--multiscale_w_tests > 0",
        "multi-scale advantages",
        lambda o: o.multiscale_w_tests > 0,
        lambda o: f"--multiscale_w_tests={o.multiscale_w_tests}",
        ("multiscale_mode",),
    ),
    Mechanism(
        "ratio_policy_term",
        "objective",
        _RATIO,
        _what("a clipped-ratio policy term", "without_ratio_policy_term"),
        lambda o: o.algorithm in _RATIO_ALGOS,
        _algo,
        ("loss.eps_low", "loss.eps_high", "loss.dual_clip", "loss.delta"),
    ),
    Mechanism(
        "clip_range",
        "objective",
        "--objective=clip",
        "the clipped surrogate's lower clip range",
        lambda o: o.loss.objective == "clip",
        _loss_objective,
        ("loss.eps_low",),
    ),
    Mechanism(
        "clip_or_cispo_cap",
        "objective",
        "--objective=clip|cispo",
        "the clipped surrogate's upper clip range, or CISPO's cap",
        lambda o: o.loss.objective in ("clip", "cispo"),
        _loss_objective,
        ("loss.eps_high",),
    ),
    Mechanism(
        "sapo",
        "objective",
        "--objective=sapo",
        "SAPO's soft gate",
        lambda o: o.loss.objective == "sapo",
        _loss_objective,
        ("loss.sapo_temp_pos", "loss.sapo_temp_neg"),
    ),
    Mechanism(
        "vespo",
        "objective",
        "--objective=vespo",
        "VESPO's sequence weight",
        lambda o: o.loss.objective == "vespo",
        _loss_objective,
        ("loss.vespo_k_pos", "loss.vespo_lambda_pos", "loss.vespo_k_neg", "loss.vespo_lambda_neg"),
    ),
)
