"""Fault campaign: every fault of docs/SECURITY.md "Reliability" against short runs of the real main
job (`python -m experiments.codegen`, tiny flags, 4 GRPO steps, a checkpoint every 2) and, where cheap,
the evaluator (`python -m experiments.evaluate`), each in its own process; one table and a summary line.

    python -m experiments.fault_campaign [--workdir=DIR] [--only=a,b]

One uninterrupted reference run is made first; a resume after a fault must end with the same
final_params_sha256. Columns: the fault | what the program did (its first stderr line, trimmed) | exit
status | resume bit-identical to the reference | leftovers (stray sandbox processes, orbax temporary
directories, a workdir written by a refused run); paths in the table are relative to the fault's own
directory under --workdir. A fault is survived when the documented behaviour held (one line and the
expected exit, a bit-identical resume where there is one, no leftovers); lost when a verdict, a checkpoint
or the run's state was lost. Summary: `faults: N tried, M survived, K lost`; exit 0 iff all survived.
Progress lines go to stderr. Faults: truncated_safetensors, truncated_gguf, corrupt_checkpoint, sigkill,
sigterm, disk_full (root only), lock, compile_cache, sandbox_worker.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = "--flagfile=experiments/flagfiles/tiny_test.flags"
SHORT = (TINY, "--sft_steps=0", "--eval_samples=0", "--eval_ks=", "--steps=4", "--checkpoint_every=2")
# --init_from runs: the model's shape is the file's (the tiny flags' shape flags would be refused)
LOADED = (*SHORT[1:], "--prompt_format=plain", "--sandbox_workers=1")
EXIT_BAD_INPUT, EXIT_DISK_FULL = 2, 74
ENV = dict(os.environ, PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")


def progress(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def codegen(*args) -> list[str]:
    return [sys.executable, "-m", "experiments.codegen", *args]


def run(cmd, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout)


def start(cmd, log: Path) -> subprocess.Popen:
    with open(log, "w") as err:  # a file, not a pipe: nothing blocks the run's writes
        return subprocess.Popen(cmd, cwd=ROOT, env=ENV, stdout=subprocess.DEVNULL, stderr=err)


_HERE: list[str] = []  # the running fault's directory: stripped from the lines shown


def first_line(text: str, width: int = 130) -> str:
    lines = [x for x in text.splitlines() if x.strip()]
    if not lines:
        return "(nothing on stderr)"
    line = re.sub(r"^[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] ", "", lines[0].strip()).replace("|", "/")
    for prefix in _HERE:
        line = line.replace(prefix, "")
    # the head names the file, the tail what is valid or what to do: keep both
    return line if len(line) <= width else f"{line[: width - 55]} ... {line[-50:]}"


def sha(wd: Path) -> str | None:
    try:
        return json.loads((wd / "results.json").read_text())["final_params_sha256"]
    except (OSError, ValueError, KeyError):
        return None


def leftovers(*wds: Path) -> list[str]:
    from grpo_jax.sandbox.isolation import stray_sandbox_pids

    out = [f"stray sandbox pid {p}" for p in stray_sandbox_pids()]
    for wd in wds:
        if wd.exists():
            out += [str(p.relative_to(wd)) for p in wd.rglob("*orbax-checkpoint-tmp*")]
    return out


def wait_for(path: Path, proc: subprocess.Popen, timeout=300) -> bool:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class Row(dict):
    """fault, did, exit, resume, left, ok, lost."""


def row(fault, did, exit_, resume, left, ok, lost=False) -> Row:
    return Row(fault=fault, did=did, exit=exit_, resume=resume, left=left, ok=ok, lost=lost)


def bitwise(got: str | None, ref: str) -> str:
    return "yes" if got == ref else ("NO (no results.json)" if got is None else "NO (sha differs)")


def left_text(items) -> str:
    return "none" if not items else "; ".join(items)[:100]


# ---------------------------------------------------------------------------------------------------------
# bad input files


def tiny_hf_dir(where: Path) -> Path:
    import jax

    import grpo_jax
    from grpo_jax.policies.transformer import TransformerConfig, init_params
    from grpo_jax.tokenization import CodeTokenizer

    tok = CodeTokenizer()
    cfg = TransformerConfig(
        vocab_size=tok.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32
    )
    return Path(grpo_jax.save_pretrained(str(where), cfg, init_params(cfg, jax.random.key(0)), tokenizer=tok))


def tiny_gguf(path: Path) -> Path:
    """A tiny qwen2 GGUF (llama.cpp's keys and names), as tests/test_gguf.py writes it."""
    import gguf
    import jax
    import numpy as np

    from grpo_jax.policies.transformer import TransformerConfig, init_params

    cfg = TransformerConfig(
        vocab_size=96,
        d_model=64,
        n_layers=1,
        n_heads=4,
        n_kv_heads=2,
        d_ff=96,
        qkv_bias=True,
        tie_embeddings=False,
    )
    p = jax.tree.map(np.asarray, init_params(cfg, jax.random.key(0)))
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_block_count(cfg.n_layers)
    w.add_context_length(256)
    w.add_embedding_length(cfg.d_model)
    w.add_feed_forward_length(cfg.d_ff)
    w.add_head_count(cfg.n_heads)
    w.add_head_count_kv(cfg.n_kv_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt2")
    w.add_token_list([chr(0x100 + i) for i in range(cfg.vocab_size)])
    w.add_token_merges([f"{chr(0x100)} {chr(0x101)}"])
    w.add_bos_token_id(0)
    w.add_eos_token_id(1)
    tensors = {
        "token_embd.weight": p["embed"],
        "output_norm.weight": p["final_norm"],
        "output.weight": p["lm_head"].T,
    }
    names = dict(q_proj="attn_q", k_proj="attn_k", v_proj="attn_v", o_proj="attn_output")
    names.update(gate_proj="ffn_gate", up_proj="ffn_up", down_proj="ffn_down")
    lp = p["layers"]
    for i in range(cfg.n_layers):
        tensors[f"blk.{i}.attn_norm.weight"] = lp["attn_norm"][i]
        tensors[f"blk.{i}.ffn_norm.weight"] = lp["mlp_norm"][i]
        for ours, theirs in names.items():
            tensors[f"blk.{i}.{theirs}.weight"] = lp[ours]["kernel"][i].T
            if "bias" in lp[ours]:
                tensors[f"blk.{i}.{theirs}.bias"] = lp[ours]["bias"][i]
    for name, arr in tensors.items():
        w.add_tensor(name, np.ascontiguousarray(arr))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def bad_input(fault: str, cmd: list[str], wd: Path, needle: str) -> Row:
    r = run(cmd)
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    left = leftovers() + ([f"{wd} written"] if wd.exists() else [])
    one = len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0]
    ok = one and r.returncode == EXIT_BAD_INPUT and not left
    return row(fault, first_line(r.stderr), r.returncode, "n/a (refused at load)", left_text(left), ok)


def cut_in_half(src: Path, dst: Path | None = None) -> Path:
    """dst (default: src itself) = the first half of src's bytes: a file cut short by a crash or a copy."""
    raw = src.read_bytes()
    dst = dst or src
    dst.write_bytes(raw[: len(raw) // 2])
    return dst


def f_truncated_safetensors(base: Path, ref: str) -> list[Row]:
    d = tiny_hf_dir(base / "hf")
    cut_in_half(d / "model.safetensors")
    wd = base / "wd"
    rows = [
        bad_input(
            "truncated model.safetensors (--init_from), main job",
            codegen(*LOADED, f"--init_from={d}", f"--workdir={wd}"),
            wd,
            "(truncated)",
        )
    ]
    out = base / "eval_out"
    rows.append(
        bad_input(
            "truncated model.safetensors (--init_from), evaluator",
            [
                sys.executable,
                "-m",
                "experiments.evaluate",
                f"--init_from={d}",
                "--problems=mbpp",
                "--limit=1",
                "--num_samples=1",
                f"--out_dir={out}",
            ],
            out,
            "(truncated)",
        )
    )
    return rows


def f_truncated_gguf(base: Path, ref: str) -> list[Row]:
    cut = cut_in_half(tiny_gguf(base / "m.gguf"), base / "cut.gguf")
    wd = base / "wd"
    cmd = codegen(*LOADED, f"--init_from={cut}", f"--workdir={wd}")
    return [bad_input("truncated GGUF (--init_from), main job", cmd, wd, "(truncated")]


# ---------------------------------------------------------------------------------------------------------
# checkpoints and signals


def f_corrupt_checkpoint(base: Path, ref: str, ref_wd: Path) -> list[Row]:
    """A copy of the reference run (checkpoints 2 and 4); three chunk files of step 4 overwritten. The
    evaluator on step 4: one line, exit 2, nothing written; the main job rerun to 4 steps: one line naming the
    damaged step, resumes from step 2, ends bit-identical."""
    wd = base / "wd"
    shutil.copytree(ref_wd, wd)
    (wd / "results.json").unlink()
    ck = wd / "checkpoints"
    chunks = sorted(p for p in (ck / "4" / "state").rglob("*") if p.is_file() and p.parent.name == "d")
    for p in chunks[:3]:
        p.write_bytes(b"\xa5" * p.stat().st_size)
    rows = []
    out = base / "eval_out"
    ev = run(
        [
            sys.executable,
            "-m",
            "experiments.evaluate",
            f"--checkpoint={wd}:4",
            "--problems=heldout",
            "--limit=1",
            "--num_samples=1",
            f"--out_dir={out}",
        ]
    )
    lines = [x for x in ev.stderr.splitlines() if x.strip() and not x.startswith("[")]
    left = leftovers(wd) + ([f"{out} written"] if out.exists() else [])
    ok = ev.returncode == EXIT_BAD_INPUT and len(lines) == 1 and "corrupt" in lines[0] and not left
    rows.append(
        row(
            "corrupt newest checkpoint (3 chunks of step 4), evaluator --checkpoint=WD:4",
            first_line(ev.stderr),
            ev.returncode,
            "n/a (refused)",
            left_text(left),
            ok,
        )
    )
    r = run(codegen(*SHORT, f"--workdir={wd}"))
    said = [x for x in r.stdout.splitlines() if "is corrupt" in x]
    got = sha(wd)
    res = json.loads((wd / "results.json").read_text()) if got else {}
    left = leftovers(wd)
    resumed = res.get("resumed_from_step") == 2 and res.get("skipped_corrupt_steps") == [4]
    ok = r.returncode == 0 and len(said) == 1 and resumed and got == ref and not left
    rows.append(
        row(
            "corrupt newest checkpoint (3 chunks of step 4), main job rerun",
            first_line("\n".join(said) or r.stderr),
            r.returncode,
            bitwise(got, ref) + (" (from step 2)" if resumed else " (NOT from step 2)"),
            left_text(left),
            ok,
            lost=got is None,
        )
    )
    return rows


def signalled(base: Path, ref: str, sig: int, name: str) -> list[Row]:
    """The main job signalled once its step-2 checkpoint exists; then the same command again. SIGKILL: the
    process dies by the signal; SIGTERM: the loop checkpoints the step it is on, says so and exits 0."""
    wd = base / "wd"
    out_log, err_log = base / "first.out", base / "first.err"
    with open(out_log, "w") as o, open(err_log, "w") as e:  # files, not pipes: nothing blocks the run
        proc = subprocess.Popen(codegen(*SHORT, f"--workdir={wd}"), cwd=ROOT, env=ENV, stdout=o, stderr=e)
    hit = wait_for(wd / "checkpoints" / "2", proc)
    if hit and proc.poll() is None:
        proc.send_signal(sig)
    try:
        code = proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        code = proc.wait()
    finished_anyway = (wd / "results.json").exists()
    err = err_log.read_text()
    if sig == signal.SIGTERM:
        said = [x for x in out_log.read_text().splitlines() if "signal received" in x]
        did = said[0].strip() if said else "no 'signal received' line"
        if err.strip():
            did += f"; stderr: {first_line(err, 60)}"
        expected, behaved = 0, bool(said)
    else:
        did = first_line(err) if err.strip() else "(nothing on stderr)"
        expected, behaved = -sig, True
    r = run(codegen(*SHORT, f"--workdir={wd}"))
    got = sha(wd)
    left = leftovers(wd)
    resumed = "resumed from" in r.stdout
    ok = code == expected and behaved and not finished_anyway and r.returncode == 0 and resumed
    ok = ok and got == ref and not left
    if finished_anyway:
        did = "the run finished before the signal (fault not exercised)"
    return [
        row(
            f"{name} after the step-2 checkpoint, then the same command",
            did,
            f"{code}, rerun {r.returncode}",
            bitwise(got, ref) + ("" if resumed else " (did not resume)"),
            left_text(left),
            ok,
            lost=got is None,
        )
    ]


def f_sigkill(base: Path, ref: str) -> list[Row]:
    return signalled(base, ref, signal.SIGKILL, "SIGKILL")


def f_sigterm(base: Path, ref: str) -> list[Row]:
    return signalled(base, ref, signal.SIGTERM, "SIGTERM")


# ---------------------------------------------------------------------------------------------------------
# the surroundings: disk, lock, compilation cache, sandbox


def f_disk_full(base: Path, ref: str) -> list[Row]:
    """A 1200 KiB tmpfs (as tests/test_run_faults.py): the step-0 and step-2 checkpoints (~530 KiB each) and
    the logs fit, the step-4 one does not. One line naming the newest intact step N, exit 74; with more space
    the same command resumes from step N and ends bit-identical."""
    fault = "disk full (1200 KiB tmpfs) during a save, rerun with space"
    disk = base / "disk"
    disk.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        return [row(fault, "skipped: mounting a size-capped tmpfs needs root", "-", "-", "-", None)]
    m = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1200k", "tmpfs", str(disk)], capture_output=True)
    if m.returncode:
        why = m.stderr.decode(errors="replace").strip()[:80]
        return [row(fault, f"skipped: mount -t tmpfs not permitted ({why})", "-", "-", "-", None)]
    try:
        wd = disk / "run"
        r = run(codegen(*SHORT, f"--workdir={wd}"))
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        named = re.search(r"the newest intact checkpoint is step (\d+)", lines[0]) if lines else None
        one = len(lines) == 1 and "disk full" in lines[0] and named is not None
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        r2 = run(codegen(*SHORT, f"--workdir={wd}"))
        got = sha(wd)
        left = leftovers(wd)
        step = named.group(1) if named else "?"
        resumed = named is not None and f"at GRPO step {step}" in r2.stdout
        ok = r.returncode == EXIT_DISK_FULL and one and r2.returncode == 0 and resumed and got == ref
        return [
            row(
                fault,
                first_line(r.stderr),
                f"{r.returncode}, rerun {r2.returncode}",
                bitwise(got, ref) + (f" (from step {step})" if resumed else f" (NOT from step {step})"),
                left_text(left),
                ok and not left,
                lost=got is None,
            )
        ]
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def f_lock(base: Path, ref: str) -> list[Row]:
    """A long first run (--steps=1000) holds the workdir; a second one on it is refused; the first goes on,
    and stops (exit 0) at the SIGTERM the campaign sends it after its step-2 checkpoint."""
    wd = base / "wd"
    args = (*SHORT[:-2], "--steps=1000", "--checkpoint_every=2", f"--workdir={wd}")
    first = start(codegen(*args), base / "first.err")
    try:
        deadline = time.monotonic() + 120
        while not ((wd / ".lock").exists() and (wd / ".lock").read_text()):
            if first.poll() is not None or time.monotonic() > deadline:
                return [
                    row(
                        "second run on a workdir in use",
                        "the first run never held the lock",
                        "-",
                        "-",
                        "-",
                        False,
                    )
                ]
            time.sleep(0.05)
        second = run(codegen(*args), timeout=120)
        alive = first.poll() is None
        wait_for(wd / "checkpoints" / "2", first, timeout=120)  # the loop's SIGTERM handler is in place
    finally:
        first.send_signal(signal.SIGTERM)
        try:
            code = first.wait(timeout=120)
        except subprocess.TimeoutExpired:
            first.kill()
            code = first.wait()
    lines = [x for x in second.stderr.splitlines() if x.strip()]
    one = len(lines) == 1 and "is in use by another run" in lines[0]
    left = leftovers(wd)
    ok = second.returncode == EXIT_BAD_INPUT and one and alive and code == 0 and not left
    resume = "n/a (first run went on; SIGTERM: exit " + f"{code})"
    return [
        row(
            "second run on a workdir in use (lock)",
            first_line(second.stderr),
            second.returncode,
            resume,
            left_text(left),
            ok,
        )
    ]


def f_compile_cache(base: Path, ref: str) -> list[Row]:
    """--compilation_cache naming a regular file: one warning line, the run compiles and ends as the
    reference (not a resume: the same bits without the cache)."""
    wd = base / "wd"
    f = base / "cache_is_a_file"
    f.write_text("x")
    r = run(codegen(*SHORT, f"--compilation_cache={f}", f"--workdir={wd}"))
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    got = sha(wd)
    left = leftovers(wd)
    one = len(lines) == 1 and lines[0].startswith("warning: compilation cache directory")
    ok = r.returncode == 0 and one and got == ref and not left
    return [
        row(
            "--compilation_cache is a regular file",
            first_line(r.stderr),
            r.returncode,
            bitwise(got, ref) + " (whole run, no resume)",
            left_text(left),
            ok,
            lost=got is None,
        )
    ]


def f_sandbox_worker(base: Path, ref: str) -> list[Row]:
    """12 jobs of 0.3 s on 2 slots; one slot's zygote SIGKILLed 0.2 s in. Each job one verdict, in order
    (odd jobs are wrong, so a lost, duplicated or reordered verdict shows), one retry, one restart."""
    from grpo_jax.sandbox.executor import Executor
    from grpo_jax.sandbox.isolation import stray_sandbox_pids
    from grpo_jax.sandbox.types import Job, Limits
    from grpo_jax.sandbox.types import TestCase as TC

    tests = (TC("add(1, 2)", 3), TC("add(2, 2)", 4))
    jobs = [
        Job(
            f"import time\ntime.sleep(0.3)\ndef add(a, b):\n    return a + b{' + 1' * (i % 2)}  # {i}\n",
            tests,
        )
        for i in range(12)
    ]
    with Executor(num_workers=2, limits=Limits(wall_s=2.0, cpu_s=2)) as ex:
        (victim, _) = ex._zygote_pids()
        killer = threading.Timer(0.2, os.kill, (victim, signal.SIGKILL))
        killer.start()
        got = ex.run(jobs)
        killer.join()
        st = ex.stats()
        strays = stray_sandbox_pids(ex.uids)
    right = len(got) == 12 and [v.passed for v in got] == [i % 2 == 0 for i in range(12)]
    retried = sum(v.retried for v in got)
    left = [f"stray sandbox pid {p}" for p in strays + stray_sandbox_pids()]
    ok = right and retried == 1 and st["restarts"] == 1 and not left
    did = f"{len(got)} verdicts for 12 jobs, {'all right, in order' if right else 'WRONG'}; "
    did += f"{retried} retried, {st['restarts']} slot restart"
    return [
        row(
            "sandbox worker SIGKILLed mid-batch (Executor, 12 jobs)",
            did,
            "n/a (in process)",
            "n/a",
            left_text(left),
            ok,
            lost=not right,
        )
    ]


FAULTS = {
    "truncated_safetensors": f_truncated_safetensors,
    "truncated_gguf": f_truncated_gguf,
    "corrupt_checkpoint": f_corrupt_checkpoint,
    "sigkill": f_sigkill,
    "sigterm": f_sigterm,
    "disk_full": f_disk_full,
    "lock": f_lock,
    "compile_cache": f_compile_cache,
    "sandbox_worker": f_sandbox_worker,
}
NEEDS_REF = {"corrupt_checkpoint", "sigkill", "sigterm", "disk_full", "compile_cache"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="", help="where the runs go (default: a new temporary directory)")
    ap.add_argument("--only", default="", help=f"comma-separated subset of {','.join(FAULTS)}")
    a = ap.parse_args()
    only = [x for x in a.only.split(",") if x] or list(FAULTS)
    bad = [x for x in only if x not in FAULTS]
    if bad:
        print(f"error: --only={a.only}: unknown {bad} (valid: {','.join(FAULTS)})", file=sys.stderr)
        return 2
    base = Path(a.workdir or tempfile.mkdtemp(prefix="fault_campaign_")).resolve()
    base.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    ref, ref_wd = "", base / "reference"
    if NEEDS_REF & set(only):
        progress(f"reference: uninterrupted run in {ref_wd}")
        if ref_wd.exists():
            shutil.rmtree(ref_wd)
        r = run(codegen(*SHORT, f"--workdir={ref_wd}"))
        ref = sha(ref_wd) or ""
        if r.returncode or not ref:
            print(
                f"error: the reference run failed (exit {r.returncode}): {first_line(r.stderr)}",
                file=sys.stderr,
            )
            return 1
        progress(f"reference: final_params_sha256 {ref[:16]}... ({time.monotonic() - t0:.0f} s)")
    rows: list[Row] = []
    for name in only:
        t = time.monotonic()
        progress(f"{name} ...")
        d = base / name
        if d.exists():
            shutil.rmtree(d)
        d.mkdir()
        _HERE[:] = [f"{d}/", f"{base}/"]
        try:
            fn = FAULTS[name]
            got = fn(d, ref, ref_wd) if name == "corrupt_checkpoint" else fn(d, ref)
        except Exception as e:  # the campaign's own failure is a lost fault, never a crash of the table
            got = [
                row(name, f"campaign error: {type(e).__name__}: {e}"[:110], "-", "-", "-", False, lost=True)
            ]
        for x in got:
            verdict = "skipped" if x["ok"] is None else ("survived" if x["ok"] else "NOT survived")
            progress(f"{name}: {x['fault']}: {verdict} ({time.monotonic() - t:.0f} s)")
        rows += got
    head = (
        "fault | what the program did (first stderr line) | exit | resume bit-identical | leftovers | verdict"
    )
    print(f"| {head} |")
    print("|---|---|---|---|---|---|")
    for x in rows:
        verdict = "skipped" if x["ok"] is None else ("survived" if x["ok"] else "**NOT survived**")
        print(f"| {x['fault']} | {x['did']} | {x['exit']} | {x['resume']} | {x['left']} | {verdict} |")
    tried = [x for x in rows if x["ok"] is not None]
    survived = sum(bool(x["ok"]) for x in tried)
    lost = sum(bool(x["lost"]) for x in tried)
    print(f"faults: {len(tried)} tried, {survived} survived, {lost} lost")
    print(f"wall time: {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return 0 if survived == len(tried) else 1


if __name__ == "__main__":
    sys.exit(main())
