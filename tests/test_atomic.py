"""grpo_jax.atomic: a write replaces the target whole or leaves it as it was, with no temporary left."""

import json
import os

import pytest

from grpo_jax import atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    p = tmp_path / "sub" / "r.json"
    atomic.write_json(p, {"a": 1}, indent=1)
    assert p.read_text() == '{\n "a": 1\n}\n'
    atomic.write_text(p, "x")
    assert p.read_text() == "x" and os.listdir(p.parent) == ["r.json"]


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    p = tmp_path / "r.json"
    p.write_text("old")

    def boom(f):
        f.write(b"half")
        raise RuntimeError("disk")

    with pytest.raises(RuntimeError, match="disk"):
        atomic.write_with(p, boom)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]
    with pytest.raises(ValueError):  # NaN refused before anything is written
        atomic.write_json(p, {"x": float("nan")}, allow_nan=False)
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]


def test_a_directory_appears_complete_or_not_at_all(tmp_path):
    out = tmp_path / "out"
    atomic.write_dir(out, {"a.json": json.dumps([1]), "b.txt": "b"})
    assert sorted(os.listdir(out)) == ["a.json", "b.txt"] and (out / "b.txt").read_text() == "b"
    with pytest.raises(OSError):  # onto a non-empty directory: refused, the old one kept, no temporary
        atomic.write_dir(out, {"c": "c"})
    assert sorted(os.listdir(tmp_path)) == ["out"] and sorted(os.listdir(out)) == ["a.json", "b.txt"]
