"""What the model trains and is evaluated on: the problems (the procedural suite, MBPP, CodeI/O, problem
files), how they are prompted, and the supervised warm start on them."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from grpo_jax.codegen.pipeline import DEFAULT_INSTRUCTION, PROGRAM_INSTRUCTION, PromptFormat
from grpo_jax.codegen.tasks import LEVELS
from grpo_jax.config.base import Mechanism, _check_sub_settings, _choice, _is_int, _positive, opt
from grpo_jax.data import registry as data_registry
from grpo_jax.errors import fail

TASK_SOURCES = ("procedural", "mbpp", "codeio", "mbpp+codeio", "file")
CODEIO_SOURCES = ("codeio", "mbpp+codeio")  # the sources that read the CodeI/O tasks
# problem-file formats (the registry of grpo_jax.data: every format, then the aliases), and which tests grade
DATA_FORMATS = ("auto", *data_registry.names())
GRADE_TESTS = ("all", "private")
PROMPT_FORMATS = ("plain", "chat")
# the inputs of --sft_data that are words, not paths: MBPP's train split, the CodeI/O train split
SFT_DATA_WORDS = ("mbpp", "codeio")


def sft_data_inputs(text: str) -> list[str]:
    """The inputs of --sft_data (comma-separated, each a dataset path or one of SFT_DATA_WORDS), in order."""
    return [x.strip() for x in text.split(",")] if text.strip() else []


@dataclasses.dataclass(frozen=True)
class TaskConfig:
    """What the model trains and is evaluated on, and how it is prompted.

    source "procedural": the function-synthesis suite (grpo_jax.codegen.tasks; levels, sizes, held-out split
    by construction); "mbpp": the bundled MBPP, RL on its train split (task ids 601-974), held-out = its test
    split (11-510). prompt_format "plain" continues the prompt; "chat" wraps it in an instruction through the
    tokenizer's chat template and grades the first ```python block of the reply (instruct models).
    """

    FLAG_PREFIX: ClassVar[str] = ""
    source: str = opt(
        "auto",
        "Problems: procedural (the synthetic suite), mbpp (train split for RL, test split held out), codeio "
        "(the CodeI/O tasks of the reasoning-gym wheel, docs/data/CODEIO.md: train split for RL, held-out "
        "split), mbpp+codeio (both train splits for SFT and RL, MBPP's test split held out; CodeI/O's "
        "held-out split with --eval_codeio), file (--train_data); auto (the default) = file when "
        "--train_data is given, else procedural.",
        choices=("auto", *TASK_SOURCES),
    )
    train_data: str = opt(
        "",
        "A problems file to train on, in any format and container of docs/DATA_FORMATS.md (.jsonl, "
        ".jsonl.gz, .json, .parquet: a file, a directory of shards or a glob, .arrow, a datasets "
        "save_to_disk directory); selects --source=file.",
    )
    eval_data: str = opt(
        "",
        "A problems file for the held-out evaluation, graded on its hidden tests only (any source); empty: "
        "the source's own held-out split (--source=file: --heldout_per_level problems of --train_data, "
        "chosen by a hash of their ids and kept out of training).",
    )
    data_format: str = opt(
        "auto",
        "The format of --train_data / --eval_data and of --sft_data's files; auto = detected from the "
        "columns (parquet / Arrow) or the first row's fields (JSON), for each input.",
        choices=DATA_FORMATS,
    )
    grade_tests: str = opt(
        "all",
        "Which tests grade the training reward of file problems: all (public + hidden) or private (hidden "
        "only). Held-out evaluation always grades on the hidden tests.",
        choices=GRADE_TESTS,
    )
    visible_tests: int = opt(
        0,
        "Public tests of a file problem shown in its prompt (-1: all; 0: none, since the statements of APPS, "
        "CodeContests and LiveCodeBench already show their examples).",
    )
    max_tests: int = opt(0, "Keep at most this many hidden tests per file problem (0: all).")
    max_problems: int = opt(
        0,
        "Read at most this many problems of each --train_data / --eval_data / --sft_data file, in file order "
        "(0: all); a large file is read only as far as needed.",
    )
    difficulty: str = opt(
        "",
        "Keep only the file problems of these difficulties: comma-separated labels (easy,medium; any case) "
        "or inclusive integer ranges (800-1200), matched against the format's difficulty field "
        "(docs/DATA_FORMATS.md); empty: all.",
    )
    codeio_tasks: int = opt(
        0,
        "--source=codeio: use the first N of the ~3 200 CodeI/O source tasks (0: all; the full set is built "
        "once, then cached: docs/data/CODEIO.md).",
    )
    prompt_format: str = opt(
        "auto",
        "plain (the model continues the prompt) or chat (the prompt in an instruction through the chat "
        "template; code = the reply's first ```python block); auto (the default) = chat for a pretrained "
        "--init_from model (an instruct model: give plain for a base model without a chat template), plain "
        "for a model trained from scratch.",
        choices=("auto", *PROMPT_FORMATS),
    )
    chat_instruction: str = opt(
        DEFAULT_INSTRUCTION,
        "The chat user turn for function-completion problems; {prompt} is replaced by the problem's prompt.",
    )
    program_instruction: str = opt(
        PROGRAM_INSTRUCTION,
        "The chat user turn for whole-program problems "
        "(MBPP); {prompt} is replaced by the problem's text with its tests.",
    )
    system_prompt: str = opt("", "A system turn for chat prompts (empty = the template's default).")
    sft_levels: tuple[int, ...] = opt((0, 1), "Task levels of the SFT warm start.")
    rl_levels: tuple[int, ...] = opt((0, 1), "Task levels GRPO trains on.")
    eval_levels: tuple[int, ...] = opt((0, 1), "Held-out task levels evaluated.")
    train_per_level: int = opt(300, "Training problems per level.")
    heldout_per_level: int = opt(40, "Held-out problems per level.")
    prompt_len: int = opt(64, "Prompt length in tokens (left-padded).")

    def __post_init__(self):
        for f in ("sft_levels", "rl_levels", "eval_levels"):
            levels = getattr(self, f)
            if not levels or any(lv not in LEVELS for lv in levels) or len(set(levels)) != len(levels):
                fail(self, f, f"must be distinct levels from {', '.join(map(str, LEVELS))}")
        _positive(self, ("train_per_level", "heldout_per_level", "prompt_len"))
        _choice(self, "source", ("auto", *TASK_SOURCES))
        if self.source == "auto":
            object.__setattr__(self, "source", "file" if self.train_data else "procedural")
        if self.source == "file" and not self.train_data:
            fail(self, "source", "--source=file needs --train_data=PATH (a problems file)")
        _choice(self, "data_format", DATA_FORMATS)
        _choice(self, "grade_tests", GRADE_TESTS)
        if self.visible_tests < -1:
            fail(self, "visible_tests", "must be -1 (all), 0 (none) or a positive count")
        _positive(self, ("max_tests", "max_problems", "codeio_tasks"), strict=False)
        _choice(self, "prompt_format", ("auto", *PROMPT_FORMATS))
        for name in ("chat_instruction", "program_instruction"):
            if "{prompt}" not in getattr(self, name):
                fail(self, name, "must contain {prompt} (where the problem's prompt goes)")
        _check_sub_settings(self, "tasks", SUB_SETTINGS)

    @property
    def prompt(self):
        """The grpo_jax.codegen.pipeline.PromptFormat of the problems of this config."""
        if self.prompt_format == "auto":
            raise ValueError(
                "TaskConfig.prompt_format='auto' is resolved by RunConfig (chat for a pretrained --init_from "
                "model, plain from scratch): read the prompt format of a RunConfig's tasks"
            )
        return PromptFormat(
            self.prompt_format, self.chat_instruction, self.system_prompt, self.program_instruction
        )


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Supervised warm start on the reference solutions (grpo_jax.train.sft)."""

    FLAG_PREFIX: ClassVar[str] = "sft_"
    steps: int | None = opt(
        None,
        "SFT minibatch steps (0 = no warm start); auto (the default) = 300 for a model trained from scratch, "
        "0 for a pretrained --init_from model (RunConfig resolves it).",
        none_word="auto",
    )
    batch: int = opt(32, "SFT batch size.")
    lr: float = opt(3e-3, "SFT learning rate (AdamW).")
    warmup_steps: int = opt(20, "SFT linear learning-rate warm-up steps (at most --sft_steps).")
    from_workdir: str = opt(
        "",
        "Take the post-SFT parameters from another run's workdir (its step-0 checkpoint, e.g. of a run "
        "with --steps=0) instead of running SFT here; that run must equal this one in every field that "
        "decides them (config.SFT_INPUTS: seed, model, SFT tasks and settings; checked). Empty = SFT here.",
        flag="sft_from",
    )
    bucket: int = opt(
        0,
        "Cut each SFT minibatch to its longest prompt and reference, rounded up to a multiple of this many "
        "tokens (only padding is cut; the same loss to float rounding, one compilation per width pair); 0 = "
        "rows padded to --prompt_len + --max_new_tokens.",
    )
    data: str = opt(
        "",
        "Run the warm start on the reference solutions of these problems instead of the source's SFT "
        "problems: comma-separated inputs, each a dataset input read as --train_data is (any format and "
        "container of docs/DATA_FORMATS.md, --data_format, --max_problems, --difficulty), or the word mbpp "
        "(MBPP's train split) or codeio (the CodeI/O train split); problems without a reference solution are "
        "left out. Needs --sft_steps > 0. Empty = the source's SFT problems.",
    )

    def __post_init__(self):
        if self.steps is not None and not (_is_int(self.steps) and self.steps >= 0):
            fail(self, "steps", "must be an integer >= 0, or auto (None)")
        if any(not x for x in sft_data_inputs(self.data)):
            fail(self, "data", "an empty input between commas: give PATH[,PATH...] (or mbpp, codeio)")
        if self.data and self.steps == 0:  # also after RunConfig resolves auto (a replace runs this again)
            fail(
                self,
                "data",
                "the SFT warm start's problems: needs --sft_steps > 0 (this run has 0; auto is 0 for a "
                "pretrained --init_from model): give --sft_steps=N, or drop --sft_data",
            )
        _positive(self, ("warmup_steps", "bucket"), strict=False)
        _positive(self, ("batch", "lr"))


def sft_data_files(text: str) -> list[str]:
    """The inputs of --sft_data that are dataset paths (not SFT_DATA_WORDS)."""
    return [x for x in sft_data_inputs(text) if x not in SFT_DATA_WORDS]


# the sub-settings of the tasks' optional mechanisms (base.Mechanism: one rule); problem_files and the last
# three are the run's (scope "": they read --sft_data or the evaluation's settings too), checked by RunConfig
SUB_SETTINGS: tuple[Mechanism, ...] = (
    Mechanism(
        "procedural",
        "tasks",
        "--source=procedural",
        "the procedural suite's levels and sizes; MBPP has its own splits",
        lambda t: t.source == "procedural",
        lambda t: f"--source={t.source}",
        ("sft_levels", "rl_levels", "eval_levels", "train_per_level"),
    ),
    Mechanism(
        "file_source",
        "tasks",
        "--source=file (--train_data)",
        "a problems file to train on",
        lambda t: t.source == "file",
        lambda t: f"--source={t.source}",
        ("train_data", "grade_tests"),
    ),
    Mechanism(
        "codeio_source",
        "tasks",
        "--source=codeio|mbpp+codeio",
        "the CodeI/O tasks",
        lambda t: t.source in CODEIO_SOURCES,
        lambda t: f"--source={t.source}",
        ("codeio_tasks",),
    ),
    Mechanism(  # the run's: --sft_data's files are read with these settings too
        "problem_files",
        "",
        "--train_data, --eval_data or a file in --sft_data",
        "problems read from a file",
        lambda c: bool(c.tasks.train_data or c.tasks.eval_data or sft_data_files(c.sft.data)),
        lambda c: "neither --train_data nor --eval_data nor a file in --sft_data",
        (
            "tasks.data_format",
            "tasks.visible_tests",
            "tasks.max_tests",
            "tasks.max_problems",
            "tasks.difficulty",
        ),
    ),
    Mechanism(
        "chat",
        "",
        "--prompt_format=chat",
        "chat prompts",
        lambda c: c.tasks.prompt_format == "chat",
        lambda c: f"--prompt_format={c.tasks.prompt_format}",
        ("tasks.system_prompt", "tasks.chat_instruction", "tasks.program_instruction"),
    ),
    Mechanism(
        "chat_function_problems",
        "",
        "--source=procedural|file, --eval_data or --eval_humaneval",
        "function-completion problems, the ones --chat_instruction words",
        lambda c: c.tasks.source in ("procedural", "file") or bool(c.tasks.eval_data) or c.eval.humaneval,
        lambda c: f"--source={c.tasks.source}, no --eval_data and no --eval_humaneval",
        ("tasks.chat_instruction",),
    ),
    Mechanism(
        "chat_program_problems",
        "",
        "--source=mbpp|codeio|mbpp+codeio|file, --eval_data, --eval_mbpp > 0 or --eval_codeio > 0",
        "whole-program problems (MBPP, CodeI/O, contest problems), the ones --program_instruction words",
        lambda c: (
            c.tasks.source in ("mbpp", *CODEIO_SOURCES, "file")
            or bool(c.tasks.eval_data)
            or c.eval.mbpp > 0
            or c.eval.codeio > 0
        ),
        lambda c: f"--source={c.tasks.source}, no --eval_data, --eval_mbpp=0 and --eval_codeio=0",
        ("tasks.program_instruction",),
    ),
)
