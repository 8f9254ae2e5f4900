"""N processes of the main job on this machine (multi-controller JAX over 127.0.0.1; what the tests use).

    python launch/local.py --num_processes=2 --devices_per_process=2 -- \
        --flagfile=experiments/flagfiles/quickstart.flags --workdir=runs/dist

Starts `python -m experiments.codegen <flags> --dist_coordinator=127.0.0.1:<port> --dist_num_processes=N
--dist_process_id=i` for i = 0..N-1, each with its own sandbox workers. Environment set per process:
XLA_FLAGS=--xla_force_host_platform_device_count=<devices_per_process> (CPU: D forced devices per process;
leave --devices_per_process=0 on a GPU host and set --visible_devices instead), CUDA_VISIBLE_DEVICES when
--visible_devices is given (comma groups per process, e.g. "0,1;2,3"), PYTHONUNBUFFERED=1,
TF_CPP_MIN_LOG_LEVEL=2. CPU collectives use gloo (set by the job itself).

Logs: process i writes <workdir>/logs/process_<i>.log (stdout and stderr); process 0's is also echoed here;
<workdir>/logs/pids.json maps each process index to its pid (to signal one).
Checkpoints, TensorBoard and results are the job's own, under --workdir (process 0 writes them; checkpoints
are written by all processes together). If one process exits non-zero, the others are given
--grace_s seconds to exit on their own (their own failure detection names the lost process) and are then
killed; this launcher exits with the first failing process's status. Resume: run the same command again.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def workdir_of(job_args: list[str]) -> str | None:
    """The --workdir the job will use (the last one given), to put the per-process logs next to it."""
    wd = None
    for i, a in enumerate(job_args):
        if a.startswith("--workdir="):
            wd = a.split("=", 1)[1]
        elif a == "--workdir" and i + 1 < len(job_args):
            wd = job_args[i + 1]
    return wd


def _echo(path: Path, stop: threading.Event) -> None:
    """Follow process 0's log on this console."""
    with open(path, encoding="utf-8", errors="replace") as f:
        while True:
            line = f.readline()
            if line:
                sys.stdout.write(line)
                sys.stdout.flush()
            elif stop.is_set():
                return
            else:
                time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, job = argv[:i], argv[i + 1 :]
    else:
        own, job = argv, []
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--num_processes", type=int, default=2)
    ap.add_argument(
        "--devices_per_process", type=int, default=1, help="forced CPU devices (0: leave XLA_FLAGS)"
    )
    ap.add_argument("--visible_devices", default="", help='accelerators per process, e.g. "0,1;2,3"')
    ap.add_argument("--port", type=int, default=0, help="coordinator port (0: a free one)")
    ap.add_argument(
        "--grace_s", type=float, default=60.0, help="after a failure, seconds before killing the rest"
    )
    ap.add_argument("--python", default=sys.executable)
    args = ap.parse_args(own)
    if args.num_processes < 1:
        ap.error(f"--num_processes={args.num_processes}: must be >= 1")
    groups = [g for g in args.visible_devices.split(";") if g] if args.visible_devices else []
    if groups and len(groups) != args.num_processes:
        ap.error(f"--visible_devices has {len(groups)} groups for --num_processes={args.num_processes}")
    wd = workdir_of(job)
    if wd is None:
        ap.error("the job needs --workdir=... (after --): the per-process logs go to <workdir>/logs/")
    logs = Path(wd) / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    port = args.port or free_port()
    procs, files = [], []
    for i in range(args.num_processes):
        env = dict(os.environ, PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")
        if args.devices_per_process > 0:
            env["XLA_FLAGS"] = (
                env.get("XLA_FLAGS", "")
                + f" --xla_force_host_platform_device_count={args.devices_per_process}"
            ).strip()
        if groups:
            env["CUDA_VISIBLE_DEVICES"] = groups[i]
        dist = [
            f"--dist_coordinator=127.0.0.1:{port}",
            f"--dist_num_processes={args.num_processes}",
            f"--dist_process_id={i}",
        ]
        f = open(logs / f"process_{i}.log", "w", encoding="utf-8")  # noqa: SIM115 (closed below)
        files.append(f)
        cmd = [args.python, "-m", "experiments.codegen", *job, *dist]
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT))
    (logs / "pids.json").write_text(json.dumps({str(i): p.pid for i, p in enumerate(procs)}))
    print(
        f"launch/local.py: {args.num_processes} processes (coordinator 127.0.0.1:{port}); logs in {logs}/",
        flush=True,
    )
    stop = threading.Event()
    echo = threading.Thread(target=_echo, args=(logs / "process_0.log", stop), daemon=True)
    echo.start()

    def forward(signum, frame):  # Ctrl-C / SIGTERM reach every process: each saves and stops at a step
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, forward)
    status, failed_at = 0, None
    while any(p.poll() is None for p in procs):
        for i, p in enumerate(procs):
            rc = p.poll()
            if rc not in (None, 0) and status == 0:
                status, failed_at = rc, time.time()
                print(f"launch/local.py: process {i} exited with status {rc}", file=sys.stderr, flush=True)
        if failed_at is not None and time.time() - failed_at > args.grace_s:
            for i, p in enumerate(procs):
                if p.poll() is None:
                    print(
                        f"launch/local.py: killing process {i} (still running)", file=sys.stderr, flush=True
                    )
                    p.kill()
        time.sleep(0.2)
    for i, p in enumerate(procs):
        if p.returncode and status == 0:
            status = p.returncode
            print(
                f"launch/local.py: process {i} exited with status {p.returncode}", file=sys.stderr, flush=True
            )
    stop.set()
    echo.join(timeout=5)
    for f in files:
        f.close()
    return 128 - status if status < 0 else status  # killed by signal N: 128 + N, as a shell reports it


if __name__ == "__main__":
    sys.exit(main())
