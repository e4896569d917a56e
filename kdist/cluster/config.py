"""`ClusterConfig`: where a multi-process run's coordinator is, which process this is, and what started it."""

import dataclasses
import re

from kdist.checks import is_int, shown
from kdist.errors import ArgumentTypeError, ClusterError

JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
TF_CONFIG = "TF_CONFIG"
CPU_COLLECTIVES = "KDIST_CPU_COLLECTIVES"
BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"  # where process 0's coordination service listens (read by jax)
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")

_ENGINES_OF_SOURCES = {"arguments": "arguments", "KERAS_DISTRIBUTION_*": "keras-env", "TF_CONFIG": "tf-config"}


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where a multi-process run's coordinator is, and which process this is.

    Attributes:
        coordinator_address: "host:port" of process 0, where JAX's coordination service listens.
        num_processes: number of processes in the run.
        process_id: this process, in `[0, num_processes)`.
        source: where the values came from ("arguments", "KERAS_DISTRIBUTION_*", "TF_CONFIG", or the
            variables of a cluster engine such as "OMPI_COMM_WORLD_*").
        engine: what started the processes: "arguments", "keras-env", "tf-config" (from `source`), or a
            cluster engine found in the environment: "slurm", "openmpi", "mpi", "pmix", "kubernetes",
            "gke-tpu", "gce-tpu".
        local_process_id: this process's rank among the processes on its host, where the engine says.
        local_num_processes: the processes on its host, where the engine says.
    """

    coordinator_address: str
    num_processes: int
    process_id: int
    source: str = "arguments"
    engine: str | None = None
    local_process_id: int | None = None
    local_num_processes: int | None = None

    def __post_init__(self):
        if not isinstance(self.source, str):
            raise ArgumentTypeError(f"ClusterConfig: source must be a string; received source={self.source!r}.")
        if self.engine is None:
            object.__setattr__(self, "engine", _ENGINES_OF_SOURCES.get(self.source, self.source))
        if not isinstance(self.engine, str):
            raise ArgumentTypeError(f"ClusterConfig: engine must be a string; received engine={self.engine!r}.")
        for name in ("local_process_id", "local_num_processes"):
            value = getattr(self, name)
            if value is not None and not is_int(value):
                raise ArgumentTypeError(f"ClusterConfig: {name} must be an integer or None; received {shown(value)}.")
        if not isinstance(self.coordinator_address, str):
            raise ArgumentTypeError(
                f'{self.source}: coordinator_address must be a "host:port" string; '
                f"received {self.coordinator_address!r} ({type(self.coordinator_address).__name__})."
            )
        check_address(self.coordinator_address, self.source)
        for name in ("num_processes", "process_id"):
            value = getattr(self, name)
            if not is_int(value):
                raise ArgumentTypeError(
                    f"{self.source}: {name} must be an integer; "
                    f"received {name}={shown(value)} ({type(value).__name__})."
                )
            object.__setattr__(self, name, int(value))
        if self.num_processes < 1:
            raise ClusterError(f"{self.source}: num_processes must be at least 1; received {self.num_processes}.")
        if not 0 <= self.process_id < self.num_processes:
            raise ClusterError(
                f"{self.source}: process_id={self.process_id} is out of range for "
                f"num_processes={self.num_processes}; expected 0 to {self.num_processes - 1}."
            )

    def env(self):
        """The KERAS_DISTRIBUTION_* variables that describe this process."""
        return {
            JOB_ADDRESSES: self.coordinator_address,
            NUM_PROCESSES: str(self.num_processes),
            PROCESS_ID: str(self.process_id),
        }


def check_address(address, source):
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if not match or not 0 < int(match.group(2)) < 65536:
        where = f"{source}: " if source else ""
        raise ClusterError(
            f'{where}address {address!r} is not of the form "host:port" (a host name, an IPv4 address or '
            "[IPv6 address], and a port from 1 to 65535)."
        )


def split_address(address):
    """("host", "port") of a "host:port" address, an IPv6 host without its brackets."""
    host, port = address.rsplit(":", 1)
    return host.strip("[]"), port


def describe(config):
    return (
        f"process {config.process_id} of {config.num_processes} with coordinator "
        f"{config.coordinator_address} ({config.source})"
    )


def same_cluster(a, b):
    """Whether two configs describe the same process of the same run, wherever they came from."""
    return (a.coordinator_address, a.num_processes, a.process_id) == (
        b.coordinator_address,
        b.num_processes,
        b.process_id,
    )
