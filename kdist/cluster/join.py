"""Join a multi-process JAX run: `kdist.initialize()` from arguments, KERAS_DISTRIBUTION_*, TF_CONFIG or an engine.

Every process of a multi-process (multi-host) run calls `kdist.initialize()`
before anything else touches JAX devices. It reads where the run's
coordinator is, how many processes there are and which one this is, from

- arguments, else
- the `KERAS_DISTRIBUTION_JOB_ADDRESSES`, `KERAS_DISTRIBUTION_NUM_PROCESSES`
  and `KERAS_DISTRIBUTION_PROCESS_ID` variables (what `kdist launch` sets and
  what `keras.distribution.initialize` reads), else
- a `TF_CONFIG` cluster spec as written for `tf.distribute.MultiWorkerMirroredStrategy`, else
- the cluster engine that started the process (`engines.py`: SLURM's srun,
  Open MPI's mpirun, PMI/PMIx MPIs, a Kubernetes Indexed Job), with the
  coordinator address jax's own detection gives (`jax_internals`), else
- jax's detection alone (TPU pods, a Kubernetes Job read through its API),

then calls `jax.distributed.initialize` with kdist's bind rule (process 0
listens on the coordinator address only, loopback when the job is on one
host) and installs the exit-on-fault handler (`fault_exit.py`).
"""

import errno
import os
import socket

import jax

from kdist.checks import is_int, shown
from kdist.cluster import fault_exit
from kdist.cluster.config import (  # noqa: F401  (TF_CONFIG, ClusterConfig: importable from here, as before)
    BIND_ADDRESS,
    CPU_COLLECTIVES,
    JOB_ADDRESSES,
    NUM_PROCESSES,
    PROCESS_ID,
    TF_CONFIG,
    ClusterConfig,
    check_address,
    describe,
    same_cluster,
    split_address,
)
from kdist.cluster.engines import ENGINE_NAMES, alone_requested, engine_tasks
from kdist.cluster.tf_config import cluster_from_tf_config
from kdist.errors import ArgumentTypeError, ClusterError, cause
from kdist.jax_internals import (
    backends_initialized,
    engine_cluster,
    in_distributed_run,
    jax_detected_cluster,
    on_cloud_tpu,
)
from kdist.keras_internals import agree_on_random_seed

COORDINATOR = "JAX_COORDINATOR_ADDRESS"  # read by jax too: the coordinator of an engine's job, when set
COORDINATOR_PORT = "JAX_COORDINATOR_PORT"  # read by jax too: replaces the port derived from the job id
LOCAL_DEVICE_IDS = "JAX_LOCAL_DEVICE_IDS"  # read by jax too: "0,1,2,3", the devices this process drives
DETECTION_TIMEOUT_S = 300  # jax's default initialization_timeout
_PORT_FROM_JOB_ID = ("slurm", "openmpi")  # jax's SlurmCluster and OmpiCluster: 61440 + a number from the job id


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
    if keras_config and tf_config and not same_cluster(keras_config, tf_config):
        raise ClusterError(
            f"KERAS_DISTRIBUTION_* describe {describe(keras_config)} but TF_CONFIG describes "
            f"{describe(tf_config)}. Unset one of them."
        )
    return keras_config or tf_config


def initialize(
    job_addresses=None,
    num_processes=None,
    process_id=None,
    *,
    cpu_collectives=None,
    bind_address=None,
    local_device_ids=None,
):
    """Join a multi-process run: from arguments, KERAS_DISTRIBUTION_*, TF_CONFIG or the cluster engine that started it.

    Call it first thing in every process, before building a preset. Without
    any configuration it does nothing and returns None, so the same script
    runs on one process too. Under `srun`, `mpirun` (Open MPI, or an MPI with
    mpi4py installed) or a Kubernetes Indexed Job it joins the job's other
    tasks; set KDIST_ALONE=1 to run each task alone instead. After joining,
    an uncaught exception (or a non-zero `sys.exit`) in this process ends it
    at once, so that the engine ends the job. On CPU devices it enables
    cross-process CPU collectives (gloo, or `cpu_collectives` / KDIST_CPU_COLLECTIVES).

    Example (run with `kdist launch -n 2 --devices-per-process 4 train.py`,
    `mpirun -n 2 python train.py` or `srun -n 2 python train.py`):

    ```python
    import kdist, keras
    kdist.initialize()                      # reads what `kdist launch`, srun or mpirun set
    keras.distribution.set_distribution(kdist.preset("2x4"))   # 8 devices over 2 processes
    ```

    Args:
        job_addresses: "host:port" of process 0, or comma-separated addresses of all processes.
        num_processes: number of processes.
        process_id: this process's id.
        cpu_collectives: "gloo" or "mpi"; default KDIST_CPU_COLLECTIVES, else "gloo" on CPU.
        bind_address: "host:port" where process 0's coordination service listens; default
            JAX_COORDINATOR_BIND_ADDRESS, else the coordinator address.
        local_device_ids: the accelerator ids this process drives (an id or a list); default
            JAX_LOCAL_DEVICE_IDS, else all of the host's when the engine started one process on it,
            else the one of its local rank (as jax does). Not used on CPU.

    Returns:
        The `ClusterConfig` in force (with the engine and the process layout), or None for a
        single-process run.

    Raises:
        ClusterError: the configuration is malformed or inconsistent, the engine's job has no
            coordinator kdist can find, or JAX already ran a computation (too late to join a cluster).
    """
    global _initialized_config
    _check_kinds(job_addresses, num_processes, process_id, cpu_collectives, bind_address, local_device_ids)
    if bind_address is not None:
        check_address(bind_address, "kdist.initialize(bind_address)")
    if cpu_collectives is not None and cpu_collectives not in ("gloo", "mpi"):
        raise ClusterError(f"cpu_collectives must be 'gloo' or 'mpi'; received {cpu_collectives!r}.")
    arguments = _from_arguments(job_addresses, num_processes, process_id)
    if arguments is None and _initialized_config is not None:
        return _initialized_config
    config = arguments or cluster_from_env() or (None if alone_requested() else _from_engine(os.environ))
    if config is None:
        return None
    if _initialized_config is not None:
        if same_cluster(_initialized_config, config):
            return _initialized_config
        raise ClusterError(
            f"kdist.initialize() already joined {describe(_initialized_config)}; cannot join {describe(config)}."
        )
    _check_jax_not_started(config)
    _set_cpu_collectives(cpu_collectives)
    bind = bind_address or os.environ.get(BIND_ADDRESS) or config.coordinator_address
    if config.process_id == 0 and bind_address is None and not os.environ.get(BIND_ADDRESS):
        _check_bind_reachable(config)
    if config.process_id == 0:
        _check_port_alone(bind, config)
    jax.distributed.initialize(
        config.coordinator_address,
        config.num_processes,
        config.process_id,
        local_device_ids=_local_device_ids(local_device_ids, config),
        cluster_detection_method="deactivate",  # kdist found the job itself (jax's detection ignores the bind rule)
        coordinator_bind_address=bind,
    )
    agree_on_random_seed()  # as keras.distribution.initialize does
    _initialized_config = config
    fault_exit.install(config)
    return config


_initialized_config = None  # the ClusterConfig this process joined


def _from_engine(environ):
    """The `ClusterConfig` of the engine's job this process is a task of, or None outside one (or alone in it)."""
    port = environ.get(COORDINATOR_PORT) or None
    tasks = engine_tasks(environ)
    if tasks is None:
        found = _ask_jax("its cluster detection", lambda: jax_detected_cluster(DETECTION_TIMEOUT_S, port))
        if found is None or found[2] < 2:
            return None
        engine, coordinator, count, rank, local = found
        return ClusterConfig(coordinator, count, rank, "jax cluster detection", engine, local)
    count, given = tasks.num_processes, environ.get(COORDINATOR)
    if count is not None and count < 2:
        return None
    jax_view = None
    if not (given and count):
        jax_view = _ask_jax(tasks.engine, lambda: engine_cluster(tasks.engine, DETECTION_TIMEOUT_S, port))
    count = count or (jax_view and jax_view[1])
    if count == 1 or (count is None and not tasks.several):
        return None  # a job of one task; or rank 0 where the environment cannot tell (PMIx, Kubernetes)
    coordinator = given or (jax_view and jax_view[0])
    if not coordinator or not count:
        raise ClusterError(
            f"This process is task {tasks.process_id} of a job started by {ENGINE_NAMES[tasks.engine]} "
            f"({tasks.seen()}), but kdist cannot tell {'where its coordinator is' if count else 'its task count'}: "
            f"{_NO_COORDINATOR_FIX.get(tasks.engine, '')}Set {COORDINATOR}=HOST:PORT (process 0's host and a free "
            f"port) and KERAS_DISTRIBUTION_NUM_PROCESSES, or KERAS_DISTRIBUTION_* in full, in every task's "
            "environment; or set KDIST_ALONE=1 to run each task alone."
        )
    if tasks.single_host and not given:
        coordinator = "127.0.0.1:" + split_address(coordinator)[1]  # every task is here: loopback
    source = ", ".join(tasks.variables)
    return ClusterConfig(
        coordinator, count, tasks.process_id, source, tasks.engine, tasks.local_process_id, tasks.local_num_processes
    )


def _ask_jax(what, ask):
    """`ask()` (jax's cluster detection), with its failures (a Kubernetes API error) raised as ClusterError."""
    try:
        return ask()
    except (RuntimeError, ValueError, KeyError, OSError) as e:
        raise ClusterError(
            f"jax's detection of the {what} job failed: {cause(e)}. Give the job's layout "
            f"yourself: KERAS_DISTRIBUTION_* in every task's environment (or {COORDINATOR}=HOST:PORT), or set "
            "KDIST_ALONE=1 to run each task alone."
        ) from e


_NO_COORDINATOR_FIX = {
    "openmpi": "jax reads the coordinator from OMPI_MCA_orte_hnp_uri, which Open MPI 5 no longer sets. ",
    "mpi": "jax finds rank 0's host through mpi4py, which is not installed (pip install mpi4py). ",
    "pmix": "jax finds rank 0's host through mpi4py, which is not installed (pip install mpi4py). ",
    "kubernetes": (
        "the task count and pod 0's address are in the Job object, which jax reads only with the `kubernetes` "
        "package (pip install 'jax[k8s]') and a service account allowed to read pods and jobs. "
    ),
}


def _local_device_ids(argument, config):
    """The accelerator ids this process drives: the argument, JAX_LOCAL_DEVICE_IDS, or the engine's layout."""
    if argument is not None:
        return [int(argument)] if is_int(argument) else [int(i) for i in argument]
    value = os.environ.get(LOCAL_DEVICE_IDS, "").strip()
    if value:
        try:
            return [int(i) for i in value.split(",")]
        except ValueError:
            raise ClusterError(
                f"{LOCAL_DEVICE_IDS}={shown(value)} is not a comma-separated list of device ids such as 0,1,2,3."
            ) from None
    if config.local_num_processes == 1 or config.local_process_id is None or on_cloud_tpu():
        return None  # every device of the host
    return [config.local_process_id]  # one device per process, as jax does under an engine


def _check_bind_reachable(config):
    """A job over several hosts must not have its coordinator listen on a loopback address only."""
    if config.local_num_processes is None or config.local_num_processes == config.num_processes:
        return
    host, port = split_address(config.coordinator_address)
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return
    if address.startswith("127."):
        raise ClusterError(
            f"The job spans several hosts, but its coordinator {config.coordinator_address} resolves to "
            f"{address} here, a loopback address the other hosts cannot reach (Debian's /etc/hosts maps the host "
            f"name to 127.0.1.1). Set {BIND_ADDRESS}=[::]:{port} (every "
            f"interface) or to this host's address on the job's network."
        )


def _check_port_alone(bind, config):
    """Process 0's coordinator must have its port alone. jax's listens with SO_REUSEPORT: beside another
    listener on the port (another job's coordinator, whose port jax derived from its job id as it did this
    one's) it starts without an error, and the tasks of both jobs reach either coordinator."""
    host, port = split_address(bind)
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a closed coordinator's TIME_WAIT: no owner
        try:
            probe.bind((host, int(port)))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return  # not an address of this host: jax's own bind says why
            owner = "another process"
            if config.engine in _PORT_FROM_JOB_ID and not os.environ.get(COORDINATOR_PORT):
                owner += ", often another job's coordinator (jax derives the port from the job id)"
            raise ClusterError(
                f"Port {port} of this job's coordinator ({bind}; {describe(config)}) is in use on this host by "
                f"{owner}. jax's coordinator would listen beside it and the tasks of both jobs would reach either "
                f"one. Give this job a free port: {COORDINATOR_PORT}=PORT in every task's environment under an "
                "engine, or another port in the coordinator address (job_addresses, KERAS_DISTRIBUTION_JOB_ADDRESSES)."
            ) from None


def _check_kinds(job_addresses, num_processes, process_id, cpu_collectives, bind_address, local_device_ids):
    for name, value, accepted in (
        ("job_addresses", job_addresses, 'a "host:port" string (or comma-separated addresses)'),
        ("cpu_collectives", cpu_collectives, "'gloo' or 'mpi'"),
        ("bind_address", bind_address, 'a "host:port" string'),
    ):
        if value is not None and not isinstance(value, str):
            raise ArgumentTypeError(
                f"kdist.initialize: {name} must be {accepted} or None; received {name}={shown(value)}."
            )
    for name, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and not is_int(value):
            raise ArgumentTypeError(
                f"kdist.initialize: {name} must be an integer or None; received {name}={shown(value)}."
            )
    ids = [local_device_ids] if is_int(local_device_ids) else local_device_ids
    if ids is not None and (
        isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__") or not all(is_int(i) and i >= 0 for i in ids)
    ):
        raise ArgumentTypeError(
            "kdist.initialize: local_device_ids must be a device id, a list of device ids (integers >= 0) or None; "
            f"received local_device_ids={local_device_ids!r}."
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
            raise ClusterError(
                f"{name}={shown(value)} is not an integer. Set it to a whole number: "
                f"{names[1]} to the number of processes (e.g. 2), {names[2]} to this process's index "
                f"from 0 to {names[1]} - 1."
            ) from None
    return _config_from_values(values[0], *ints, source)


def _config_from_values(job_addresses, num_processes, process_id, source):
    addresses = [a.strip() for a in str(job_addresses).split(",")]
    if len(addresses) > 1 and len(addresses) != num_processes:
        raise ClusterError(
            f"{source}: job addresses {addresses} list {len(addresses)} processes, but num_processes={num_processes}."
        )
    return ClusterConfig(addresses[0], num_processes, process_id, source=source)


def _check_jax_not_started(config):
    if backends_initialized() and not in_distributed_run():
        raise ClusterError(
            f"kdist.initialize() was called after JAX had initialised its devices, too late to join "
            f"{describe(config)}. Call it first thing in the script, before building a preset, a model or any array."
        )


def _set_cpu_collectives(name):
    name = name or os.environ.get(CPU_COLLECTIVES) or "gloo"
    if name not in ("gloo", "mpi"):
        raise ClusterError(f"cpu_collectives must be 'gloo' or 'mpi'; received {name!r}.")
    jax.config.update("jax_cpu_collectives_implementation", name)
