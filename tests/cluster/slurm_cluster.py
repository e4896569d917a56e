"""A single-node SLURM cluster for the tests: munged + slurmctld + slurmd from the Debian packages, in a tmp dir.

`start_slurm(directory)` writes a slurm.conf for this host (its own munge
socket and key, free ports, state and logs under `directory`), starts the
three daemons in the foreground as children of this process and waits until
the node is idle. It returns a `Slurm` whose `env` makes srun/sbatch use it
and whose `stop()` ends the daemons; or it raises `SlurmUnavailable` with the
reason (missing programs, a daemon that would not start), for the test to skip.
"""

import os
import pwd
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from kdist.cluster.launcher import free_port

PROGRAMS = ("munged", "slurmctld", "slurmd", "srun", "sinfo", "squeue", "scancel")


class SlurmUnavailable(Exception):
    """SLURM cannot run on this machine; the message says why."""


class Slurm:
    def __init__(self, directory, env, processes):
        self.directory, self.env, self.processes = directory, env, processes

    def stop(self):
        """End the daemons, after the jobs (at most 20 s), and any step daemon (slurmstepd) of theirs left."""
        try:
            _wait(lambda: _no_jobs(self.env), 20, "jobs still running")
        except SlurmUnavailable:
            pass
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.terminate()
        for proc in reversed(self.processes):
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        for pid in _step_daemons(self.env["SLURM_CONF"]):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def logs(self):
        return "\n".join(
            f"--- {p.name}:\n" + p.read_text(errors="replace")[-1500:] for p in sorted(self.directory.glob("*.log"))
        )


def start_slurm(directory, cpus=8, timeout=30):
    missing = [p for p in PROGRAMS if shutil.which(p) is None]
    if missing:
        raise SlurmUnavailable(f"{missing} not installed (apt-get install slurm-wlm munge)")
    directory = Path(directory)
    for sub in ("state", "spool"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    user = pwd.getpwuid(os.geteuid()).pw_name
    node = socket.gethostname().split(".")[0]
    key = directory / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    socket_path = directory / "munge.socket"
    conf = directory / "slurm.conf"
    # A random first job id: jax derives the coordinator's port from the job id, and two clusters (pytest-xdist
    # workers, or a cluster a killed run left) numbering jobs alike would give their jobs the same port. Drawn from
    # the OS: the tests seed `random` (keras.utils.set_random_seed), so two workers could draw alike from it.
    first_job = random.SystemRandom().randrange(1, 1 << 20)
    conf.write_text(
        _CONF.format(
            d=directory, user=user, node=node, cpus=cpus, ctld=free_port(), slurmd=free_port(), first_job=first_job
        )
    )
    env = {**os.environ, "SLURM_CONF": str(conf)}
    processes = []
    slurm = Slurm(directory, env, processes)
    daemons = [
        [
            shutil.which("munged"),
            "--foreground",
            "--force",
            f"--socket={socket_path}",
            f"--key-file={key}",
            f"--pid-file={directory / 'munged.pid'}",
            f"--log-file={directory / 'munged.log'}",
            f"--seed-file={directory / 'munge.seed'}",
        ],
        [shutil.which("slurmctld"), "-D", "-i", "-f", str(conf)],
        [shutil.which("slurmd"), "-D", "-N", node, "-f", str(conf)],
    ]
    try:
        for command in daemons:
            out = open(directory / f"{Path(command[0]).name}.out.log", "w")  # noqa: SIM115 (the daemon keeps it)
            processes.append(subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT))
            if command[0].endswith("munged"):
                _wait(lambda: socket_path.exists(), timeout, "munged did not create its socket")
        _wait(lambda: _node_state(env) == "idle", timeout, "the node did not become idle")
    except SlurmUnavailable as e:
        slurm.stop()
        raise SlurmUnavailable(f"{e}:\n{slurm.logs()}") from None
    return slurm


def _wait(ready, timeout, what):
    end = time.time() + timeout
    while time.time() < end:
        if ready():
            return
        time.sleep(0.3)
    raise SlurmUnavailable(f"{what} within {timeout} s")


def _no_jobs(env):
    try:
        result = subprocess.run(["squeue", "-h"], env=env, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return False
    return result.returncode == 0 and not result.stdout.strip()


def _step_daemons(conf):
    """Pids of the slurmstepd processes started by this cluster's slurmd (their environment names its slurm.conf)."""
    marker = f"SLURM_CONF={conf}".encode()
    found = []
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                if not f.read().startswith(b"slurmstepd"):
                    continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if marker in f.read().split(b"\0"):
                    found.append(int(name))
        except OSError:
            continue
    return found


def _node_state(env):
    try:
        result = subprocess.run(["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:
        return None
    return result.stdout.strip()


_CONF = """\
ClusterName=kdisttest
FirstJobId={first_job}
SlurmctldHost={node}(127.0.0.1)
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={d}/munge.socket
SlurmctldPort={ctld}
SlurmdPort={slurmd}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
ReturnToService=2
KillWait=5
# sbatch --wait polls for the job's end every 2 s at first, longer and longer while MinJobAge allows: with the
# default (300) the sbatch test took 42 s for a job of about 18 s, with 6 it takes 18 s.
MinJobAge=6
SlurmdParameters=config_overrides
NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
"""
