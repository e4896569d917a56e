"""Which cluster engine started this process, and how many tasks it started: read from the environment only.

SLURM (`srun`), Open MPI (`mpirun`), other MPIs (MPICH / Intel MPI's
PMI_*, PMIx), a Kubernetes Indexed Job and `kdist launch` each tell every
process its rank and the task count in environment variables. Reading them
costs nothing (no jax, no network), so a preset can check, every time it
builds a mesh, that a process started as one of several tasks has joined
their job instead of training alone (`check_not_alone`). Joining itself
(`kdist.initialize()`) is in `join.py`.
"""

import contextlib
import dataclasses
import os
import re

from kdist.errors import ClusterError
from kdist.jax_internals import in_distributed_run

ALONE = "KDIST_ALONE"  # =1: this process means to run alone although the engine started several
_TASKS_PER_NODE = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@dataclasses.dataclass(frozen=True)
class EngineTasks:
    """The task layout an engine gave this process.

    Attributes:
        engine: "slurm", "openmpi", "mpi", "pmix", "kubernetes" or "kdist-launch".
        num_processes: tasks in the job, None where the engine does not say (PMIx, Kubernetes).
        process_id: this task's rank.
        local_process_id: its rank among the tasks on this host, None where unknown.
        local_num_processes: tasks on this host, None where unknown.
        variables: the variables read, {name: value}, for messages.
    """

    engine: str
    num_processes: int | None
    process_id: int
    local_process_id: int | None
    local_num_processes: int | None
    variables: dict

    @property
    def several(self):
        """Whether the job has more than one task (a rank above 0 is proof enough where the count is unknown)."""
        return (self.num_processes or 1) > 1 or self.process_id > 0

    @property
    def single_host(self):
        """Whether every task of the job runs on this host."""
        return self.num_processes is not None and self.local_num_processes == self.num_processes

    def seen(self):
        return ", ".join(f"{k}={v}" for k, v in self.variables.items())


ENGINE_NAMES = {
    "slurm": "SLURM (srun)",
    "openmpi": "Open MPI (mpirun)",
    "mpi": "MPI (PMI: MPICH, Intel MPI)",
    "pmix": "a PMIx launcher",
    "kubernetes": "a Kubernetes Indexed Job",
    "kdist-launch": "kdist launch (KERAS_DISTRIBUTION_*)",
}


def engine_tasks(environ=None):
    """The `EngineTasks` the environment describes, or None when no engine started this process.

    Engines are tried in this order: Open MPI, SLURM (inside an `srun` step
    only: a batch script is one task), PMI, PMIx, Kubernetes. A malformed
    value raises `ClusterError` naming the variable.
    """
    environ = os.environ if environ is None else environ
    for read in (_openmpi, _slurm, _pmi, _pmix, _kubernetes):
        tasks = read(environ)
        if tasks is not None:
            return tasks
    return None


def alone_requested(environ=None):
    """Whether KDIST_ALONE=1 says this process runs alone, whatever the engine started."""
    environ = os.environ if environ is None else environ
    value = environ.get(ALONE, "").strip()
    if value in ("", "0"):
        return False
    if value == "1":
        return True
    raise ClusterError(f"{ALONE}={value!r} is not understood; set {ALONE}=1 to run alone, or unset it.")


@contextlib.contextmanager
def running_alone():
    """Inside the block this process is a single-process tool (the `kdist` CLI's commands): its meshes are not refused.

    Unlike KDIST_ALONE=1 it does not reach the processes it starts (`kdist launch`'s children).
    """
    global _alone_here
    before, _alone_here = _alone_here, True
    try:
        yield
    finally:
        _alone_here = before


_alone_here = False


def check_not_alone(what="a preset"):
    """Raise `ClusterError` if this process is one of several tasks of a job it has not joined.

    Called wherever a mesh is built. Cheap: environment variables and
    whether JAX's distributed client is up. KDIST_ALONE=1 turns it off.
    """
    if _alone_here or in_distributed_run() or alone_requested():
        return
    tasks = engine_tasks() or _kdist_launch(os.environ)
    if tasks is not None and tasks.several:
        raise not_joined_error(tasks, f"built {what} before joining the job")


def not_joined_error(tasks, happened):
    """The `ClusterError` for a process that is one of several tasks but has not joined them."""
    count = f"{tasks.num_processes} tasks" if tasks.num_processes else "several tasks"
    return ClusterError(
        f"This process is task {tasks.process_id} of {count} started by {ENGINE_NAMES[tasks.engine]} "
        f"({tasks.seen()}), but it {happened}: it sees only its own devices and would train alone, "
        "on a copy of the model and all the data. Fix: call kdist.initialize() first thing in the script, before "
        "anything touches jax devices, so that the tasks form one job; or, to really run each task alone, set "
        f"{ALONE}=1."
    )


def _int(environ, name, required=True):
    value = environ.get(name)
    if value is None or value.strip() == "":
        if required:
            raise ClusterError(f"{name} is not set, but the other variables of its cluster engine are.")
        return None
    try:
        return int(value)
    except ValueError:
        raise ClusterError(f"{name}={value!r} is not an integer.") from None


def _seen(environ, names):
    return {n: environ[n] for n in names if n in environ}


def _openmpi(environ):
    names = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE")
    if "OMPI_COMM_WORLD_SIZE" not in environ:
        return None
    size, rank, local_rank, local_size = (_int(environ, n, required=i < 2) for i, n in enumerate(names))
    return EngineTasks("openmpi", size, rank, local_rank, local_size, _seen(environ, names))


def _slurm(environ):
    if "SLURM_STEP_ID" not in environ or "SLURM_PROCID" not in environ:
        return None  # outside an srun step (a batch script, salloc's shell): one task, this one
    names = ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS", "SLURM_PROCID", "SLURM_LOCALID")
    count_name = next((n for n in names[:3] if environ.get(n)), None)
    if count_name is None:
        raise ClusterError(
            "SLURM_PROCID is set (an srun step) but none of SLURM_STEP_NUM_TASKS, SLURM_NTASKS, SLURM_NPROCS is."
        )
    seen = _seen(environ, (count_name, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_TASKS_PER_NODE", "SLURM_NODEID"))
    count = _int(environ, count_name)
    local_count = _slurm_local_count(environ)
    if local_count is None and environ.get("SLURM_STEP_NUM_NODES", "").strip() == "1":
        local_count = count  # a one-node step: every task is on this node
    return EngineTasks(
        "slurm", count, _int(environ, "SLURM_PROCID"), _int(environ, "SLURM_LOCALID", required=False), local_count, seen
    )


def _slurm_local_count(environ):
    """Tasks on this node, from SLURM_STEP_TASKS_PER_NODE ("2(x3),1": 2 on each of nodes 0-2, 1 on node 3)."""
    layout, node = environ.get("SLURM_STEP_TASKS_PER_NODE"), environ.get("SLURM_NODEID")
    if not layout or node is None or not node.isdigit():
        return None
    counts = []
    for part in layout.split(","):
        match = _TASKS_PER_NODE.fullmatch(part.strip())
        if not match:
            return None
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts[int(node)] if int(node) < len(counts) else None


def _pmi(environ):
    names = ("PMI_SIZE", "PMI_RANK", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")
    if "PMI_SIZE" not in environ or "PMI_RANK" not in environ:
        return None
    size, rank, local_rank, local_size = (_int(environ, n, required=i < 2) for i, n in enumerate(names))
    return EngineTasks("mpi", size, rank, local_rank, local_size, _seen(environ, names))


def _pmix(environ):
    if "PMIX_RANK" not in environ:
        return None  # PMIx gives the rank but not the size in the environment
    return EngineTasks("pmix", None, _int(environ, "PMIX_RANK"), None, None, _seen(environ, ("PMIX_RANK",)))


def _kubernetes(environ):
    if "JOB_COMPLETION_INDEX" not in environ or "KUBERNETES_SERVICE_HOST" not in environ:
        return None  # the Job's completion count is not in the environment (only in the Job object)
    seen = _seen(environ, ("JOB_COMPLETION_INDEX",))
    return EngineTasks("kubernetes", None, _int(environ, "JOB_COMPLETION_INDEX"), None, None, seen)


def _kdist_launch(environ):
    names = ("KERAS_DISTRIBUTION_NUM_PROCESSES", "KERAS_DISTRIBUTION_PROCESS_ID")
    value = environ.get(names[0], "").strip()
    if not value.isdigit():
        return None
    rank = environ.get(names[1], "0").strip()
    rank = int(rank) if rank.isdigit() else 0
    return EngineTasks("kdist-launch", int(value), rank, None, None, _seen(environ, names))
