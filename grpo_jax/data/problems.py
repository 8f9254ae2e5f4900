"""The main job's problem sets (moved here from the run's assembly, grpo_jax.train.build): the procedural
suite's splits, MBPP's, CodeI/O's or a dataset input's (--train_data / --eval_data, through
grpo_jax.data.load), the warm start's own problems when --sft_data names them (sft_data_problems), and the
extra evaluation sets (--eval_mbpp, --eval_humaneval).

    problems = load_problems(cfg, executor)   # Problems(sft, rl, heldout, extra)

A bad input is one RunConfigError naming the file, row and field, raised before anything is written.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from grpo_jax.codegen import datasets, tasks
from grpo_jax.config import RunConfig
from grpo_jax.config.tasks import sft_data_inputs
from grpo_jax.data.load import load
from grpo_jax.errors import RunConfigError


class Problems(NamedTuple):
    sft: list  # the supervised warm start's problems
    rl: list  # the RL training problems
    heldout: list  # the held-out evaluation problems
    extra: dict  # {name: problems} evaluated greedily besides the held-out set (mbpp, humaneval)


def load_problems(cfg: RunConfig, executor=None, print_fn=print) -> Problems:
    """The run's problems: the procedural suite's splits (or MBPP's, CodeI/O's, a file's), and the extra
    evaluation sets. A --eval_data file replaces the source's held-out set (graded on its hidden tests);
    --sft_data replaces the source's SFT problems (sft_data_problems). `executor`: the sandbox that builds the
    CodeI/O tests on first use (None: one made for it); `print_fn`: where the counts of problems left out
    (Unsupported rows, SFT problems without a reference) go."""
    t = cfg.tasks
    sft_data = sft_data_problems(cfg, executor, print_fn) if cfg.sft.data else None
    if t.source == "mbpp":
        train, test = datasets.load_mbpp(split="train"), datasets.load_mbpp(split="test")
        sft_p, rl_p, heldout = train, train, test[: t.heldout_per_level]
    elif t.source in ("codeio", "mbpp+codeio"):
        from grpo_jax.codegen.codeio import load_codeio

        every = load_codeio("all", limit=t.codeio_tasks or None, executor=executor)  # one read of the cache
        train = [q for q in every if q.split == "train"]
        held = [] if t.eval_data else [q for q in every if q.split == "heldout"][: t.heldout_per_level]
        heldout = [q.with_grade_tests("private") for q in held]
        if t.source == "mbpp+codeio":  # both training splits; MBPP's test split held out
            train = datasets.load_mbpp(split="train") + train
            heldout = datasets.load_mbpp(split="test")[: t.heldout_per_level]
        sft_p, rl_p = train, train
    elif t.source == "file":
        sft_p, rl_p, heldout = file_problems(cfg, print_fn)
    else:
        split = dict(n_per_level=t.train_per_level, seed=cfg.seed)
        sft_p = tasks.make_split("train", levels=t.sft_levels, **split)
        rl_p = tasks.make_split("train", levels=t.rl_levels, **split)
        heldout = tasks.make_split(
            "heldout", levels=t.eval_levels, n_per_level=t.heldout_per_level, seed=cfg.seed
        )
    if t.eval_data:
        heldout = load_data(cfg, t.eval_data, "private", print_fn)
    extra = {}
    if cfg.eval.mbpp:
        extra["mbpp"] = datasets.load_mbpp(split="test")[: cfg.eval.mbpp]
    if cfg.eval.humaneval:
        extra["humaneval"] = datasets.load_humaneval()
    if cfg.eval.codeio:
        extra["codeio"] = codeio_heldout(cfg.eval.codeio, t.codeio_tasks, executor)
    return Problems(sft_p if sft_data is None else sft_data, rl_p, heldout, extra)


def codeio_heldout(n: int, tasks: int = 0, executor=None) -> list:
    """The first n problems of CodeI/O's held-out split (of its first `tasks` source tasks, 0: all), graded on
    their hidden tests (--eval_codeio)."""
    from grpo_jax.codegen.codeio import load_codeio

    held = load_codeio("heldout", limit=tasks or None, executor=executor)[:n]
    return [q.with_grade_tests("private") for q in held]


def sft_data_problems(cfg: RunConfig, executor=None, print_fn=print) -> list:
    """The problems of --sft_data that carry a reference solution, its inputs concatenated in order: a dataset
    input read as --train_data is (load_data), "mbpp" (MBPP's train split) or "codeio" (the CodeI/O train
    split, the first --codeio_tasks source tasks). Those without a reference are left out with one count
    line; RunConfigError when none remains, or for a bad input (naming file, row and field). (A run without
    SFT is refused with --sft_data by its config: SFTConfig, after RunConfig resolves --sft_steps=auto.)"""
    flag = f"--sft_data={cfg.sft.data}"
    problems: list = []
    for name in sft_data_inputs(cfg.sft.data):
        if name == "mbpp":
            problems += datasets.load_mbpp(split="train")
        elif name == "codeio":
            from grpo_jax.codegen.codeio import load_codeio

            try:
                problems += load_codeio("train", limit=cfg.tasks.codeio_tasks or None, executor=executor)
            except (ImportError, OSError, ValueError) as e:
                raise RunConfigError(f"{flag}: codeio: {' '.join(str(e).split())}") from None
        else:
            problems += load_data(cfg, name, "all", print_fn)
    kept = [p for p in problems if p.reference]
    if not kept:
        raise RunConfigError(
            f"{flag}: none of its {len(problems)} problems has a reference solution (the SFT targets): give "
            "inputs with reference solutions, or drop --sft_data"
        )
    if len(kept) < len(problems):
        print_fn(
            f"--sft_data: {len(problems) - len(kept)} of {len(problems)} problems have no reference "
            "solution and are left out"
        )
    return kept


def load_data(cfg: RunConfig, path: str, grade_tests: str, print_fn=print) -> list:
    """The problems of a --train_data / --eval_data input (grpo_jax.data.load: --data_format, --max_problems,
    --difficulty, ...); a bad input is one RunConfigError naming the file, row and field. The rows left out
    as ungradable (interactive problems, checkers that do not compile) are counted on one line."""
    t = cfg.tasks
    skipped: Counter = Counter()
    try:
        problems = load(
            path,
            None if t.data_format == "auto" else t.data_format,
            grade_tests=grade_tests,
            visible_tests=None if t.visible_tests < 0 else t.visible_tests,
            max_tests=t.max_tests or None,
            max_problems=t.max_problems or None,
            difficulty=t.difficulty or None,
            skipped=skipped,
        )
    except (OSError, ValueError) as e:
        raise RunConfigError(" ".join((f"{path}: {e}" if path not in str(e) else str(e)).split())) from None
    if skipped:
        why = "; ".join(f"{n} {reason}" for reason, n in skipped.most_common())
        print_fn(f"{path}: {sum(skipped.values())} problems left out ({why})")
    return problems


def file_problems(cfg: RunConfig, print_fn=print) -> tuple[list, list, list]:
    """(SFT, RL, held-out) of --train_data: SFT on the problems that carry a reference solution; without
    --eval_data, --heldout_per_level problems chosen by a hash of their task ids are held out (graded on
    their hidden tests) and kept out of training."""
    import hashlib

    t = cfg.tasks
    train = load_data(cfg, t.train_data, t.grade_tests, print_fn)
    heldout = []
    if not t.eval_data:
        order = sorted(train, key=lambda p: hashlib.sha256(p.task_id.encode()).hexdigest())
        held = {p.task_id for p in order[: t.heldout_per_level]}
        if len(held) >= len(train):
            raise RunConfigError(
                f"{t.train_data}: {len(train)} problems, all held out by --heldout_per_level="
                f"{t.heldout_per_level}: give --eval_data=PATH or a smaller --heldout_per_level"
            )
        heldout = [p.with_grade_tests("private") for p in train if p.task_id in held]
        train = [p for p in train if p.task_id not in held]
    return [p for p in train if p.reference], train, heldout
