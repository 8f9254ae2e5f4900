"""The input pipeline: dataset files -> `grpo_jax.problem.Problem`s (stdlib + pyarrow, no JAX).

* `containers`: the files rows come from (JSON Lines, JSON lists, parquet files / shards / globs, Arrow,
  `datasets` save_to_disk directories), streamed;
* `formats/`: one module per dataset schema, each registering one `registry.Format`;
* `registry`: the formats, in detection order; every list of formats (config choices, errors, docs) is
  derived from it;
* `load`: `load(path, fmt=None, ...)`, a file's problems;
* `problems`: `load_problems(cfg)`, the main job's problem sets (procedural suite, MBPP, CodeI/O, files);
* `mbpp/`: the MBPP data file (not code).

docs/DATA_FORMATS.md documents every format field by field.
"""

import grpo_jax.data.formats  # noqa: F401  (registers every format before anything reads the registry)
from grpo_jax.data.common import DatasetError, Unsupported
from grpo_jax.data.load import detect_format, load

__all__ = ["DatasetError", "Unsupported", "detect_format", "load"]
