"""Join a multi-process JAX run: `kdist.initialize()` from KERAS_DISTRIBUTION_* or TF_CONFIG.

Every process of a multi-process (multi-host) run calls `kdist.initialize()`
before anything else touches JAX devices. It reads where the run's
coordinator is, how many processes there are and which one this is, from

- arguments, else
- the `KERAS_DISTRIBUTION_JOB_ADDRESSES`, `KERAS_DISTRIBUTION_NUM_PROCESSES`
  and `KERAS_DISTRIBUTION_PROCESS_ID` variables (what `kdist launch` sets and
  what `keras.distribution.initialize` reads), else
- a `TF_CONFIG` cluster spec as written for `tf.distribute.MultiWorkerMirroredStrategy`,

and calls `keras.distribution.initialize` (that is `jax.distributed.initialize`).
"""

import contextlib
import dataclasses
import json
import os
import re

import jax
import keras

from kdist.checks import is_int
from kdist.errors import ArgumentTypeError, ClusterError
from kdist.jax_internals import backends_initialized, in_distributed_run

JOB_ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
TF_CONFIG = "TF_CONFIG"
CPU_COLLECTIVES = "KDIST_CPU_COLLECTIVES"
BIND_ADDRESS = "JAX_COORDINATOR_BIND_ADDRESS"  # where process 0's coordination service listens (read by jax)
_ADDRESS = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+):([0-9]{1,5})")

# TF_CONFIG task types that take part in training, in process-id order: with
# MultiWorkerMirroredStrategy the chief is worker 0 and the workers follow it.
_TRAINING_TASKS = ("chief", "worker")
_NOT_ON_JAX = {
    "ps": "parameter servers (ParameterServerStrategy) have no JAX equivalent: JAX runs one "
    "SPMD program on every process, with the variables sharded over the mesh instead",
}


@dataclasses.dataclass(frozen=True)
class ClusterConfig:
    """Where a multi-process run's coordinator is, and which process this is.

    Attributes:
        coordinator_address: "host:port" of process 0, where JAX's coordination service listens.
        num_processes: number of processes in the run.
        process_id: this process, in `[0, num_processes)`.
        source: where the values came from ("arguments", "KERAS_DISTRIBUTION_*" or "TF_CONFIG").
    """

    coordinator_address: str
    num_processes: int
    process_id: int
    source: str = "arguments"

    def __post_init__(self):
        if not isinstance(self.source, str):
            raise ArgumentTypeError(f"ClusterConfig: source must be a string; received source={self.source!r}.")
        if not isinstance(self.coordinator_address, str):
            raise ArgumentTypeError(
                f'{self.source}: coordinator_address must be a "host:port" string; '
                f"received {self.coordinator_address!r} ({type(self.coordinator_address).__name__})."
            )
        _check_address(self.coordinator_address, self.source)
        for name in ("num_processes", "process_id"):
            value = getattr(self, name)
            if not is_int(value):
                raise ArgumentTypeError(
                    f"{self.source}: {name} must be an integer; received {name}={value!r} ({type(value).__name__})."
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


def cluster_from_tf_config(tf_config):
    """Translate a `TF_CONFIG` cluster spec into a `ClusterConfig`.

    Processes are numbered chief first (if any), then the workers in order, as
    `MultiWorkerMirroredStrategy` numbers them; the coordinator is process 0's
    address. "evaluator" tasks are side jobs outside the training cluster and
    are not counted; "ps" (parameter server) tasks are refused.

    Example:

    ```python
    tf_config = {"cluster": {"worker": ["host1:12345", "host2:23456"]},
                 "task": {"type": "worker", "index": 1}}
    kdist.cluster_from_tf_config(tf_config)
    # ClusterConfig(coordinator_address='host1:12345', num_processes=2, process_id=1, source='TF_CONFIG')
    ```

    Args:
        tf_config: the JSON string (as in the TF_CONFIG variable) or the decoded dict.

    Raises:
        ClusterError: the spec is not valid JSON, lacks "cluster" or "task",
            names a task that is not in the cluster, or uses parameter servers.
    """
    spec = _decode_tf_config(tf_config)
    cluster, task = spec.get("cluster"), spec.get("task")
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterError(
            f'TF_CONFIG needs a non-empty "cluster" object such as {{"worker": ["host1:port", "host2:port"]}}; '
            f"received cluster={cluster!r}."
        )
    if not isinstance(task, dict) or "type" not in task or "index" not in task:
        raise ClusterError(
            f'TF_CONFIG needs a "task" object with "type" and "index", such as {{"type": "worker", "index": 0}}; '
            f"received task={task!r}."
        )
    for job, reason in _NOT_ON_JAX.items():
        if cluster.get(job):
            raise ClusterError(f'TF_CONFIG has a "{job}" job, but {reason}. Remove the "{job}" job.')
    unknown = sorted(set(cluster) - set(_TRAINING_TASKS) - {"evaluator"})
    if unknown:
        raise ClusterError(
            f"TF_CONFIG cluster has unknown job(s) {unknown}; expected 'chief', 'worker' or 'evaluator'."
        )
    for job in _TRAINING_TASKS:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise ClusterError(
                f'TF_CONFIG cluster["{job}"] must be a list of "host:port" strings; received {addresses!r}.'
            )
        for a in addresses:
            _check_address(a, f'TF_CONFIG cluster["{job}"]')
    if len(cluster.get("chief", [])) > 1:
        raise ClusterError(f'TF_CONFIG may have at most one chief; received cluster["chief"]={cluster["chief"]!r}.')

    task_type, index = task["type"], task["index"]
    if task_type == "evaluator":
        raise ClusterError(
            "TF_CONFIG task is an evaluator, which is not part of the training cluster: "
            "run evaluation in a separate single-process job without kdist.initialize()."
        )
    if task_type not in _TRAINING_TASKS:
        raise ClusterError(f"TF_CONFIG task type {task_type!r} is not one of {list(_TRAINING_TASKS)}.")
    members = [(job, i) for job in _TRAINING_TASKS for i in range(len(cluster.get(job, [])))]
    addresses = [a for job in _TRAINING_TASKS for a in cluster.get(job, [])]
    if not members:
        raise ClusterError('TF_CONFIG cluster lists no "chief" or "worker" addresses.')
    if isinstance(index, bool) or not isinstance(index, int):
        raise ClusterError(f"TF_CONFIG task index must be an integer; received {index!r}.")
    jobs = cluster.get(task_type, [])
    if not 0 <= index < len(jobs):
        raise ClusterError(
            f"TF_CONFIG task {task_type}:{index} is out of range: the cluster has "
            f"{len(jobs)} {task_type} address(es) ({jobs})."
        )
    duplicates = sorted({a for a in addresses if addresses.count(a) > 1})
    if duplicates:
        raise ClusterError(f"TF_CONFIG cluster lists the same address more than once: {duplicates}.")
    return ClusterConfig(addresses[0], len(members), members.index((task_type, index)), source="TF_CONFIG")


def cluster_from_env(environ=None):
    """The `ClusterConfig` described by the environment, or None if it describes none.

    Reads KERAS_DISTRIBUTION_* first, then TF_CONFIG; when both are set they
    must agree on the coordinator, process count and process id.

    Raises:
        ClusterError: a variable is malformed, only some KERAS_DISTRIBUTION_*
            variables are set, or the two sources disagree.
    """
    environ = os.environ if environ is None else environ
    keras_config = _from_keras_env(environ)
    tf_config = cluster_from_tf_config(environ[TF_CONFIG]) if environ.get(TF_CONFIG) else None
    if keras_config and tf_config and not _same_cluster(keras_config, tf_config):
        raise ClusterError(
            f"KERAS_DISTRIBUTION_* describe {_describe(keras_config)} but TF_CONFIG describes "
            f"{_describe(tf_config)}. Unset one of them."
        )
    return keras_config or tf_config


def initialize(job_addresses=None, num_processes=None, process_id=None, *, cpu_collectives=None, bind_address=None):
    """Join a multi-process run: `keras.distribution.initialize` from arguments, KERAS_DISTRIBUTION_* or TF_CONFIG.

    Call it first thing in every process, before building a preset. Without
    any configuration it does nothing and returns None, so the same script
    runs on one process too. On CPU devices it enables cross-process CPU
    collectives (gloo, or `cpu_collectives` / KDIST_CPU_COLLECTIVES).

    Example (run with `kdist launch -n 2 --devices-per-process 4 train.py`):

    ```python
    import kdist, keras
    kdist.initialize()                      # reads what `kdist launch` set
    keras.distribution.set_distribution(kdist.preset("2x4"))   # 8 devices over 2 processes
    ```

    Args:
        job_addresses: "host:port" of process 0, or comma-separated addresses of all processes.
        num_processes: number of processes.
        process_id: this process's id.
        cpu_collectives: "gloo" or "mpi"; default KDIST_CPU_COLLECTIVES, else "gloo" on CPU.
        bind_address: "host:port" where process 0's coordination service listens; default
            JAX_COORDINATOR_BIND_ADDRESS, else the coordinator address.

    Returns:
        The `ClusterConfig` in force, or None for a single-process run.

    Raises:
        ClusterError: the configuration is malformed or inconsistent, or JAX
            already ran a computation (too late to join a cluster).
    """
    global _initialized_config
    _check_kinds(job_addresses, num_processes, process_id, cpu_collectives, bind_address)
    if bind_address is not None:
        _check_address(bind_address, "kdist.initialize(bind_address)")
    if cpu_collectives is not None and cpu_collectives not in ("gloo", "mpi"):
        raise ClusterError(f"cpu_collectives must be 'gloo' or 'mpi'; received {cpu_collectives!r}.")
    config = _from_arguments(job_addresses, num_processes, process_id) or cluster_from_env()
    if config is None:
        return None
    if _initialized_config is not None:
        if _same_cluster(_initialized_config, config):
            return config
        raise ClusterError(
            f"kdist.initialize() already joined {_describe(_initialized_config)}; cannot join {_describe(config)}."
        )
    _check_jax_not_started()
    _set_cpu_collectives(cpu_collectives)
    bind = bind_address or os.environ.get(BIND_ADDRESS) or config.coordinator_address
    with _environment(BIND_ADDRESS, bind):  # keras.distribution.initialize passes no bind address to jax
        keras.distribution.initialize(config.coordinator_address, config.num_processes, config.process_id)
    _initialized_config = config
    return config


_initialized_config = None  # the ClusterConfig this process joined


def _check_kinds(job_addresses, num_processes, process_id, cpu_collectives, bind_address):
    for name, value, accepted in (
        ("job_addresses", job_addresses, 'a "host:port" string (or comma-separated addresses)'),
        ("cpu_collectives", cpu_collectives, "'gloo' or 'mpi'"),
        ("bind_address", bind_address, 'a "host:port" string'),
    ):
        if value is not None and not isinstance(value, str):
            raise ArgumentTypeError(f"kdist.initialize: {name} must be {accepted} or None; received {name}={value!r}.")
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and not is_int(value):
            raise ArgumentTypeError(f"kdist.initialize: {name} must be an integer or None; received {name}={value!r}.")


@contextlib.contextmanager
def _environment(name, value):
    """Set environment variable `name` to `value` inside the block, and restore it after."""
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def _same_cluster(a, b):
    """Whether two configs describe the same process of the same run, wherever they came from."""
    return (a.coordinator_address, a.num_processes, a.process_id) == (
        b.coordinator_address,
        b.num_processes,
        b.process_id,
    )


def _from_arguments(job_addresses, num_processes, process_id):
    given = [v is not None for v in (job_addresses, num_processes, process_id)]
    if not any(given):
        return None
    if not all(given):
        raise ClusterError(
            "kdist.initialize() needs job_addresses, num_processes and process_id together; received "
            f"job_addresses={job_addresses!r}, num_processes={num_processes!r}, process_id={process_id!r}."
        )
    return _config_from_values(job_addresses, num_processes, process_id, "arguments")


def _from_keras_env(environ):
    names = (JOB_ADDRESSES, NUM_PROCESSES, PROCESS_ID)
    values = [environ.get(n) or None for n in names]
    if not any(values):
        return None
    if not all(values):
        missing = [n for n, v in zip(names, values) if v is None]
        raise ClusterError(f"Some KERAS_DISTRIBUTION_* variables are set but {missing} are not; set all three or none.")
    source = "KERAS_DISTRIBUTION_*"
    ints = []
    for name, value in zip(names[1:], values[1:]):
        try:
            ints.append(int(value))
        except ValueError:
            raise ClusterError(f"{name}={value!r} is not an integer.") from None
    return _config_from_values(values[0], *ints, source)


def _config_from_values(job_addresses, num_processes, process_id, source):
    addresses = [a.strip() for a in str(job_addresses).split(",")]
    if len(addresses) > 1 and len(addresses) != num_processes:
        raise ClusterError(
            f"{source}: job addresses {addresses} list {len(addresses)} processes, but num_processes={num_processes}."
        )
    return ClusterConfig(addresses[0], num_processes, process_id, source=source)


def _decode_tf_config(tf_config):
    if isinstance(tf_config, dict):
        return tf_config
    if not isinstance(tf_config, (str, bytes)):
        raise ArgumentTypeError(
            f"tf_config must be a TF_CONFIG JSON string or its decoded dict; received {tf_config!r} "
            f"({type(tf_config).__name__})."
        )
    try:
        spec = json.loads(tf_config)
    except (TypeError, json.JSONDecodeError) as e:
        raise ClusterError(f"TF_CONFIG is not valid JSON ({e}); received {tf_config!r}.") from None
    if not isinstance(spec, dict):
        raise ClusterError(f'TF_CONFIG must be a JSON object with "cluster" and "task"; received {tf_config!r}.')
    return spec


def _check_address(address, source):
    match = _ADDRESS.fullmatch(address) if isinstance(address, str) else None
    if not match or not 0 < int(match.group(2)) < 65536:
        where = f"{source}: " if source else ""
        raise ClusterError(
            f'{where}address {address!r} is not of the form "host:port" (a host name, an IPv4 address or '
            "[IPv6 address], and a port from 1 to 65535)."
        )


def _describe(config):
    return (
        f"process {config.process_id} of {config.num_processes} with coordinator "
        f"{config.coordinator_address} ({config.source})"
    )


def _check_jax_not_started():
    if backends_initialized() and not in_distributed_run():
        raise ClusterError(
            "kdist.initialize() was called after JAX had initialised its devices. Call it first "
            "thing in the script, before building a preset, a model or any array."
        )


def _set_cpu_collectives(name):
    name = name or os.environ.get(CPU_COLLECTIVES) or "gloo"
    if name not in ("gloo", "mpi"):
        raise ClusterError(f"cpu_collectives must be 'gloo' or 'mpi'; received {name!r}.")
    jax.config.update("jax_cpu_collectives_implementation", name)
