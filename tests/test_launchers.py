"""launch/slurm.sbatch, launch/tpu_pod.sh, launch/k8s_jobset.yaml: checked here without SLURM, a TPU or
Kubernetes. The shell scripts must parse (`bash -n`) and, run against stand-ins for srun / gcloud / curl on
PATH, must start experiments.codegen with --dist_cluster=auto and the caller's arguments ("$@") in order,
--workdir last. The manifest must be a JobSet whose explicit --dist_* flags agree with its own process count
and with JobSet's pod DNS names; its shell script is run with a stand-in for python. Nothing here talks to a
cluster (launch/local.py is tested by the distributed tests)."""

import os
import re
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAUNCH = ROOT / "launch"
SLURM = LAUNCH / "slurm.sbatch"
TPU = LAUNCH / "tpu_pod.sh"
K8S = LAUNCH / "k8s_jobset.yaml"

pytestmark = pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")

# A stand-in for experiments.codegen's interpreter: one line per argument, then the device ids JAX would get.
FAKE_PYTHON = """#!/usr/bin/env bash
for a in "$@"; do printf 'ARG %s\\n' "$a"; done
echo "JAX_LOCAL_DEVICE_IDS=${JAX_LOCAL_DEVICE_IDS:-unset}"
echo "PYTHONUNBUFFERED=${PYTHONUNBUFFERED:-unset}"
"""


def _exe(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _code(text: str) -> str:
    """The script without its comment lines (#SBATCH lines stay: they are directives)."""
    return "\n".join(
        ln for ln in text.splitlines() if not ln.lstrip().startswith("#") or ln.startswith("#SBATCH")
    )


def _args(out: str) -> list[str]:
    return [ln[4:] for ln in out.splitlines() if ln.startswith("ARG ")]


USER_ARGS = ["--flagfile=experiments/flagfiles/quickstart.flags", "--seed=3", "--note=a b;$HOME `id`"]


@pytest.mark.parametrize("script", [SLURM, TPU], ids=lambda p: p.name)
def test_shell_scripts_parse_and_pass_arguments_through(script):
    subprocess.run(["bash", "-n", str(script)], check=True, capture_output=True)
    code = _code(script.read_text())
    assert '"$@"' in code and "experiments.codegen" in code and "--dist_cluster=auto" in code


# --- SLURM ---------------------------------------------------------------------------------------------


def _sbatch(tmp_path, env_extra, args=USER_ARGS):
    """Run slurm.sbatch as sbatch would, with an srun that runs its command once, here, as one task."""
    bin_dir = tmp_path / "bin"
    _exe(
        bin_dir / "srun",
        '#!/usr/bin/env bash\necho "SRUN $*" | head -c 300 >&2; echo >&2\n'
        'while [[ "$1" == --* ]]; do shift; done\nexec "$@"\n',
    )
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "SLURM_SUBMIT_DIR": str(ROOT),
        "SLURM_JOB_NAME": "t",
        "SLURM_JOB_ID": "7",
        "SLURM_NNODES": "1",
        "SLURM_NTASKS": "1",
        "WORKDIR": str(tmp_path / "wd"),
        "PYTHON": str(_exe(tmp_path / "python", FAKE_PYTHON)),
        **env_extra,
    }
    return subprocess.run(
        ["bash", str(SLURM), *args], env=env, capture_output=True, text=True, timeout=20, cwd=tmp_path
    )


def test_slurm_command_line(tmp_path):
    r = _sbatch(tmp_path, {"SLURM_CPUS_PER_TASK": "4"})
    assert r.returncode == 0, r.stderr
    assert _args(r.stdout) == [
        "-m",
        "experiments.codegen",
        "--dist_cluster=auto",
        *USER_ARGS,
        f"--workdir={tmp_path / 'wd'}",  # last: a flagfile's own --workdir must not win
    ]
    srun = next(ln for ln in r.stderr.splitlines() if ln.startswith("SRUN "))
    assert "--kill-on-bad-exit=1" in srun and "--cpus-per-task=4" in srun
    assert f"--output={tmp_path / 'wd'}/logs/%x-%j-%t.out" in srun
    assert "PYTHONUNBUFFERED=1" in r.stdout and (tmp_path / "wd" / "logs").is_dir()


@pytest.mark.parametrize(
    "visible, per_task, expected",
    [
        ("3", "1", "0"),  # bound to one GPU: it is device 0 of the task, whatever SLURM_LOCALID says
        ("4,5", "2", "0,1"),
        ("0,1,2,3,4,5,6,7", "gpu:8", "0,1,2,3,4,5,6,7"),  # one process per node with all its GPUs
        ("0,1,2,3", "1", "unset"),  # every task sees the node's GPUs: JAX's [SLURM_LOCALID] is right
        ("0,1,2,3", None, "unset"),  # no --gpus-per-task (e.g. --gres): JAX's own choice
        (None, "1", "unset"),  # CPU only
    ],
)
def test_slurm_local_device_ids(tmp_path, visible, per_task, expected):
    env = {"CUDA_VISIBLE_DEVICES": visible, "SLURM_GPUS_PER_TASK": per_task}
    r = _sbatch(tmp_path, {k: v for k, v in env.items() if v is not None}, args=[])
    assert r.returncode == 0, r.stderr
    assert f"JAX_LOCAL_DEVICE_IDS={expected}" in r.stdout.splitlines()


def test_slurm_exported_local_device_ids_win(tmp_path):
    env = {"CUDA_VISIBLE_DEVICES": "3", "SLURM_GPUS_PER_TASK": "1", "JAX_LOCAL_DEVICE_IDS": "5"}
    r = _sbatch(tmp_path, env, args=[])
    assert "JAX_LOCAL_DEVICE_IDS=5" in r.stdout.splitlines()


def test_slurm_outside_slurm_is_an_error(tmp_path):
    r = subprocess.run(
        ["bash", str(SLURM)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=20
    )
    assert r.returncode != 0 and "not running under SLURM" in r.stderr


def test_slurm_directives():
    directives = [ln for ln in SLURM.read_text().splitlines() if ln.startswith("#SBATCH")]
    keys = {ln.split()[1].split("=")[0] for ln in directives}
    assert {"--nodes", "--ntasks-per-node", "--gpus-per-task", "--output"} <= keys
    assert "#SBATCH --output=logs/%x-%j.out" in directives


# --- TPU VM slice ----------------------------------------------------------------------------------------


def _tpu(tmp_path, mode, args=(), env_extra=None):
    """Run tpu_pod.sh with a stand-in gcloud: it checks every remote script with `bash -n` (and keeps it in
    remote.sh), then runs it here as worker 0 (home: tmp_path/home) unless FAKE_NO_RUN is set; describe
    reports two workers, scp copies from that home."""
    bin_dir, home = tmp_path / "bin", tmp_path / "home"
    _exe(
        bin_dir / "gcloud",
        """#!/usr/bin/env bash
echo "GCLOUD $*" | head -c 300 >&2; echo >&2
for a in "$@"; do case "$a" in --command=*) cmd="${a#--command=}";; esac; done
if [[ -n "${cmd:-}" ]]; then
  b64="${cmd#*echo }"; b64="${b64%% |*}"
  printf '%s' "$b64" | base64 -d >"$FAKE_HOME/../remote.sh"
  bash -n "$FAKE_HOME/../remote.sh" || exit 99
  [[ -n "${FAKE_NO_RUN:-}" ]] && exit 0
  HOME="$FAKE_HOME" exec bash -c "$cmd"
fi
case "$4" in
  describe) echo '{"networkEndpoints": [{"ipAddress": "10.0.0.1"}, {"ipAddress": "10.0.0.2"}]}' ;;
  scp) cp "$FAKE_HOME/${5#*:}" "$6" ;;
esac
""",
    )
    _exe(bin_dir / "curl", "#!/usr/bin/env bash\necho 0\n")  # the metadata server: agent-worker-number 0
    _exe(home / "grpo_jax" / ".venv" / "bin" / "python", FAKE_PYTHON)
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "HOME": str(tmp_path),
        "FAKE_HOME": str(home),
        "TPU_NAME": "tpu1",
        "ZONE": "zone1",
        "PROJECT": "proj1",
        "WORKDIR": "runs/x",
        **(env_extra or {}),
    }
    return subprocess.run(
        ["bash", str(TPU), mode, *args], env=env, capture_output=True, text=True, timeout=20, cwd=tmp_path
    )


def _worker_log(tmp_path) -> str:
    """Worker 0's log once its (background, nohup) process has written everything."""
    log = tmp_path / "home" / "grpo_jax" / "runs" / "x" / "logs" / "worker_0.log"
    deadline = time.monotonic() + 10
    while "PYTHONUNBUFFERED" not in (log.read_text() if log.exists() else "") and time.monotonic() < deadline:
        time.sleep(0.02)
    return log.read_text()


def test_tpu_run_on_all_workers(tmp_path):
    r = _tpu(tmp_path, "run", USER_ARGS, {"XLA_FLAGS": "--xla_a=1 --xla_b='c d'"})
    assert r.returncode == 0, r.stderr
    gcloud = next(ln for ln in r.stderr.splitlines() if ln.startswith("GCLOUD "))
    assert "compute tpus tpu-vm ssh tpu1 --zone=zone1 --project=proj1 --worker=all --command=" in gcloud
    out = _worker_log(tmp_path)
    assert _args(out) == ["-m", "experiments.codegen", "--dist_cluster=auto", *USER_ARGS, "--workdir=runs/x"]
    assert "PYTHONUNBUFFERED=1" in out
    assert "export XLA_FLAGS=" in (tmp_path / "remote.sh").read_text()
    pid = tmp_path / "home" / "grpo_jax" / "runs" / "x" / "logs" / "worker_0.pid"
    assert pid.read_text().strip().isdigit()


def test_tpu_without_arguments_passes_none(tmp_path):
    r = _tpu(tmp_path, "run")
    assert r.returncode == 0, r.stderr
    expected = ["-m", "experiments.codegen", "--dist_cluster=auto", "--workdir=runs/x"]
    assert _args(_worker_log(tmp_path)) == expected


def test_tpu_setup_script(tmp_path):
    r = _tpu(tmp_path, "setup", env_extra={"REPO_URL": "https://example.org/a b.git", "FAKE_NO_RUN": "1"})
    assert r.returncode == 0, r.stderr
    assert "--worker=all" in r.stderr
    remote = (tmp_path / "remote.sh").read_text()  # passed bash -n in the fake gcloud
    assert "REPO_URL=https://example.org/a\\ b.git" in remote
    assert "pip install --quiet -r requirements.txt" in remote and "jax[tpu]==$jax_version" in remote


def test_tpu_logs_and_stop(tmp_path):
    assert _tpu(tmp_path, "run").returncode == 0
    _worker_log(tmp_path)
    r = _tpu(tmp_path, "logs", ["got"])
    assert r.returncode == 0, r.stderr
    assert "PYTHONUNBUFFERED=1" in (tmp_path / "got" / "worker_0.log").read_text()
    assert "warning: no log from worker 1" in r.stderr and "logs of 2 worker(s) in got" in r.stdout
    r = _tpu(tmp_path, "stop")  # the stand-in has exited: nothing is killed
    assert r.returncode == 0 and "worker 0: no running process recorded" in r.stdout


@pytest.mark.parametrize("missing", ["TPU_NAME", "ZONE", "PROJECT", "WORKDIR"])
def test_tpu_missing_setting_is_named(tmp_path, missing):
    r = _tpu(tmp_path, "run", env_extra={missing: ""})
    assert r.returncode != 0 and f"{missing}: set {missing}" in r.stderr


def test_tpu_unknown_mode_prints_usage(tmp_path):
    r = _tpu(tmp_path, "launch")
    assert r.returncode == 2 and "tpu_pod.sh run" in r.stderr


# --- Kubernetes JobSet -----------------------------------------------------------------------------------


def _k8s_script(text: str) -> str:
    """The container's `bash -c` script: the block scalar after `args:` / `- |`, dedented."""
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.strip() == "- |" and lines[i - 1].strip() == "args:")
    indent = len(lines[start + 1]) - len(lines[start + 1].lstrip())
    body = []
    for ln in lines[start + 1 :]:
        if ln.strip() and len(ln) - len(ln.lstrip()) < indent:
            break
        body.append(ln[indent:])
    return "\n".join(body) + "\n"


def _env_value(text: str, name: str) -> str:
    m = re.search(rf"- name: {name}\n\s+value: \"?([^\"\n]*)\"?", text)
    assert m, name
    return m.group(1)


def test_k8s_manifest_shape():
    text = K8S.read_text()
    assert "\t" not in text
    assert re.search(r"^apiVersion: jobset\.x-k8s\.io/v1alpha2$", text, re.M)
    assert re.search(r"^kind: JobSet$", text, re.M)
    assert re.search(r"^kind: PersistentVolumeClaim$", text, re.M)
    code = _code(text)
    assert "experiments.codegen" in code and "--dist_cluster=auto" not in code  # explicit flags, see header
    assert "completionMode: Indexed" in code and "enableDNSHostnames: true" in code
    # the coordinator's name relies on the default subdomain (the JobSet name)
    assert "subdomain:" not in code
    n = int(_env_value(text, "NUM_PROCESSES"))
    assert re.search(rf"^\s+parallelism: {n}$", code, re.M)
    assert re.search(rf"^\s+completions: {n}$", code, re.M)
    jobset = re.search(r"kind: JobSet\nmetadata:\n\s+name: (\S+)", text).group(1)
    rjob = re.search(r"replicatedJobs:\n\s+- name: (\S+)", text).group(1)
    port = re.search(r"containerPort: (\d+)", text).group(1)
    coordinator = f"$(JOBSET_NAME)-$(REPLICATED_JOB_NAME)-0-0.$(JOBSET_NAME):{port}"
    assert _env_value(text, "COORDINATOR") == coordinator
    assert "metadata.labels['jobset.sigs.k8s.io/jobset-name']" in text
    assert "metadata.labels['jobset.sigs.k8s.io/replicatedjob-name']" in text
    assert len(f"{jobset}-{rjob}-0-{n - 1}") <= 63  # a pod's hostname
    pvc = re.search(r"kind: PersistentVolumeClaim\nmetadata:\n\s+name: (\S+)", text).group(1)
    assert f"claimName: {pvc}" in text and "mountPath: /workdir" in text and "ReadWriteMany" in text


def test_k8s_manifest_parses_if_pyyaml_is_installed():
    yaml = pytest.importorskip("yaml")
    pvc, js = yaml.safe_load_all(K8S.read_text())
    assert pvc["kind"] == "PersistentVolumeClaim" and js["kind"] == "JobSet"
    (rjob,) = js["spec"]["replicatedJobs"]
    job = rjob["template"]["spec"]
    pod = job["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e for e in c["env"]}
    assert rjob["replicas"] == 1
    assert job["parallelism"] == job["completions"] == int(env["NUM_PROCESSES"]["value"])
    assert job["completionMode"] == "Indexed" and job["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
    assert c["command"] == ["bash", "-c"] and c["args"] == [_k8s_script(K8S.read_text())]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == pvc["metadata"]["name"]


def test_k8s_container_script(tmp_path):
    """The container's script, python stood in for: explicit flags, the log on the 'PVC', the exit code."""
    _exe(tmp_path / "bin" / "python", FAKE_PYTHON + "exit 3\n")
    env = {
        "PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}",
        "WORKDIR": str(tmp_path / "run"),
        "JOB_COMPLETION_INDEX": "1",
        "NUM_PROCESSES": "2",
        "COORDINATOR": "grpo-codegen-workers-0-0.grpo-codegen:1234",
    }
    script = _k8s_script(K8S.read_text())
    r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=20)
    assert r.returncode == 3, r.stderr
    log = (tmp_path / "run" / "logs" / "process_1.log").read_text()
    args = _args(log)
    assert args[:2] == ["-m", "experiments.codegen"] and args[-1] == f"--workdir={tmp_path / 'run'}"
    assert "--dist_coordinator=grpo-codegen-workers-0-0.grpo-codegen:1234" in args
    assert "--dist_num_processes=2" in args and "--dist_process_id=1" in args
    assert "ARG --dist_process_id=1" in r.stdout  # streamed to `kubectl logs` as well
