"""The SLURM launch script says what is wrong instead of exiting silently: without srun, or
without a way to know the node's GPUs, one ``error:`` line and exit status 2; with them, srun gets
``--cpus-per-task`` (Slurm >= 22.05 no longer passes sbatch's down)."""

import os
import stat
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SBATCH = os.path.join(REPO, "launch", "slurm_multinode.sbatch")


def _run(tmp_path, commands: dict[str, str], **env: str) -> subprocess.CompletedProcess:
    """The script under a PATH of only /bin-like tools plus ``commands`` (name -> shell body)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in commands.items():
        path = bin_dir / name
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    path = f"{bin_dir}:/usr/bin:/bin"
    return subprocess.run(
        ["bash", SBATCH, "--config", "c.py"],
        env={"PATH": path, "PYTHON": "/bin/true", **env},
        capture_output=True,
        text=True,
        cwd=str(tmp_path),
        timeout=30,
    )


def test_no_gpu_count_is_one_error_line(tmp_path):
    if any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK) for d in ("/usr/bin", "/bin")):
        return  # this host has nvidia-smi on the script's PATH: the case cannot arise here
    proc = _run(tmp_path, {"srun": 'echo "srun $*"'})
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1 and "error: SLURM_GPUS_ON_NODE is unset and nvidia-smi" in proc.stderr


def test_no_srun_is_one_error_line(tmp_path):
    proc = _run(tmp_path, {}, SLURM_GPUS_ON_NODE="2")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "error: srun not found" in proc.stderr


def test_srun_gets_cpus_per_task_and_every_gpu(tmp_path):
    proc = _run(
        tmp_path,
        {"srun": 'echo "srun $*"; echo "ids=$JAX_LOCAL_DEVICE_IDS"'},
        SLURM_GPUS_ON_NODE="4",
        SLURM_CPUS_PER_TASK="12",
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "srun --ntasks-per-node=1 --cpus-per-task=12 --kill-on-bad-exit=1 /bin/true -m cvs_jax.main --config c.py"
        in proc.stdout
    )
    assert "ids=0,1,2,3" in proc.stdout
