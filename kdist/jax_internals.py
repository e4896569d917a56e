"""Every use of jax's private or unstable API in kdist, in one place.

Checked against jax/jaxlib 0.10.2 (constraints.txt). `backends_are_initialized`, the distributed
client, XLA's memory analysis and the topology (deviceless) compilation are not stable API: when
jax changes, this is the module to mend.
"""

import contextlib
import importlib.util

import jax

from kdist.checks import missing_attributes
from kdist.errors import VersionError

CHECKED = "0.10.2"

try:
    from jax._src import cloud_tpu_init, clusters, distributed, monitoring, xla_bridge
    from jax.experimental import topologies
except ImportError as e:
    raise VersionError(
        f"kdist uses jax's internal module {e.name or e}, which jax {jax.__version__} lacks; kdist was checked "
        f"against jax {CHECKED}: pip install jax=={CHECKED} jaxlib=={CHECKED}."
    ) from e

NEEDED = {
    "jax._src.xla_bridge": (xla_bridge, ("backends_are_initialized",)),
    "jax._src.distributed": (distributed, ("global_state",)),
    "jax._src.monitoring": (
        monitoring,
        ("register_event_duration_secs_listener", "unregister_event_duration_listener"),
    ),
    "jax.experimental.topologies": (topologies, ("get_topology_desc",)),
    "jax._src.clusters": (
        clusters,
        ("ClusterEnv", "OmpiCluster", "SlurmCluster", "Mpi4pyCluster", "K8sCluster"),
    ),
    "jax._src.clusters.ClusterEnv": (
        getattr(clusters, "ClusterEnv", None),
        ("_cluster_types", "is_env_present", "get_coordinator_address", "get_process_count", "get_process_id"),
    ),
    "jax._src.cloud_tpu_init": (cloud_tpu_init, ("running_in_cloud_tpu_vm",)),
}


def check_internals(needed=NEEDED):
    """Raise `VersionError` naming each private attribute in `needed` that this jax lacks."""
    missing = missing_attributes(needed)
    if missing:
        raise VersionError(
            f"jax {jax.__version__} lacks {', '.join(missing)}, which kdist uses; kdist was checked against "
            f"jax {CHECKED}: pip install jax=={CHECKED} jaxlib=={CHECKED}."
        )


check_internals()

MEMORY_FIELDS = ("argument", "output", "alias", "temp")  # the *_size_in_bytes of XLA's memory analysis
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


def backends_initialized():
    """Whether JAX has started its devices (after which the device count cannot change)."""
    return xla_bridge.backends_are_initialized()


def in_distributed_run():
    """Whether `jax.distributed.initialize` has joined this process to a multi-process run."""
    return distributed.global_state.client is not None


# --- Cluster engines: jax's own detection (jax._src.clusters, checked against jax 0.10.2) --------------

_JAX_CLUSTERS = {  # kdist's engine name -> the jax ClusterEnv that knows its coordinator
    "openmpi": clusters.OmpiCluster,
    "slurm": clusters.SlurmCluster,
    "mpi": clusters.Mpi4pyCluster,
    "pmix": clusters.Mpi4pyCluster,
    "kubernetes": clusters.K8sCluster,
}
_JAX_CLUSTER_ENGINES = {  # jax ClusterEnv name -> the engine name kdist reports
    "OmpiCluster": "openmpi",
    "SlurmCluster": "slurm",
    "Mpi4pyCluster": "mpi",
    "K8sCluster": "kubernetes",
    "GkeTpuCluster": "gke-tpu",
    "GceTpuCluster": "gce-tpu",
}


def engine_cluster(engine, timeout_s, port=None):
    """(coordinator "host:port", num_processes) of `engine`'s job as jax's cluster detection sees it, or None.

    Open MPI: the launcher's first address (OMPI_MCA_orte_hnp_uri, Open MPI 4)
    and a port from the job id; SLURM: the step's first node and a port from
    the job id; MPI/PMIx: rank 0's host name, broadcast with mpi4py (when
    installed); Kubernetes: the Job's pod 0 and parallelism (needs the
    `kubernetes` package). `port` (JAX_COORDINATOR_PORT) replaces the derived port.
    """
    cluster = _JAX_CLUSTERS.get(engine)
    if cluster is None or not cluster.is_env_present():
        return None
    coordinator = cluster.get_coordinator_address(timeout_secs=timeout_s, override_coordinator_port=port)
    return coordinator, cluster.get_process_count()


def jax_detected_cluster(timeout_s, port=None):
    """(engine, coordinator, num_processes, process_id, local_process_id) from jax's own detection, or None.

    For the environments kdist does not read itself (TPU pods). Not tried: the
    opt-in mpi4py method, and Kubernetes (kdist reads an Indexed Job itself; jax
    would query the API from any pod, a notebook's too, and fail there).
    """
    for cluster in clusters.ClusterEnv._cluster_types:
        if cluster.opt_in_only_method or cluster is clusters.K8sCluster or not cluster.is_env_present():
            continue
        local = None if cloud_tpu_init.running_in_cloud_tpu_vm else cluster.get_local_process_id()
        return (
            _JAX_CLUSTER_ENGINES.get(cluster.__name__, cluster.__name__),
            cluster.get_coordinator_address(timeout_secs=timeout_s, override_coordinator_port=port),
            cluster.get_process_count(),
            cluster.get_process_id(),
            local,
        )
    return None


def on_cloud_tpu():
    """Whether jax found a Cloud TPU VM (then jax never narrows a process's local devices)."""
    return bool(cloud_tpu_init.running_in_cloud_tpu_vm)


def compile_train_step(model, state, batch):
    """`model.train_step` compiled ahead of time as Keras's `make_train_function` jits it.

    The state (trainable, non-trainable, optimizer and metric values) is
    donated and keeps its shardings. `state` and `batch` are arrays or
    `jax.ShapeDtypeStruct`s carrying shardings (then nothing is allocated).
    """
    shardings = jax.tree.map(lambda a: a.sharding, state)
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, shardings))
    return step.lower(state, batch).compile()


def xla_memory(compiled):
    """XLA's memory analysis of a compiled step, in bytes per device; {} where jax reports none.

    The MEMORY_FIELDS, "total" = argument + output - alias + temp (every buffer
    of the step counted once), and "peak" where jax reports one (the CPU
    backend's leaves temporaries out).
    """
    analysis = compiled.memory_analysis()
    if analysis is None:
        return {}
    memory = {k: int(getattr(analysis, f"{k}_size_in_bytes")) for k in MEMORY_FIELDS}
    memory["total"] = memory["argument"] + memory["output"] - memory["alias"] + memory["temp"]
    peak = getattr(analysis, "peak_memory_in_bytes", None)
    if peak is not None:
        memory["peak"] = int(peak)
    return memory


def memory_limit(device):
    """The bytes JAX lets `device` use (`memory_stats()["bytes_limit"]`), or None where the backend reports none."""
    try:
        stats = device.memory_stats() or {}
    except (RuntimeError, NotImplementedError):  # CPU: jax raises JaxRuntimeError (a RuntimeError): UNIMPLEMENTED
        stats = {}
    return stats.get("bytes_limit")


KERAS_STEPS = ("train_step", "test_step", "predict_step")  # the names of the functions Keras's trainer jits


@contextlib.contextmanager
def count_compiles(functions=None):
    """Count XLA compilations inside the block: `with count_compiles() as count: ...; count[0]`.

    With `functions` (names, e.g. `KERAS_STEPS`), only compilations of
    functions whose name contains one of them count.
    """
    count = [0]

    def listener(event, duration, fun_name="", **kwargs):
        if event == _COMPILE_EVENT and (functions is None or any(name in str(fun_name) for name in functions)):
            count[0] += 1

    monitoring.register_event_duration_secs_listener(listener)
    try:
        yield count
    finally:
        monitoring.unregister_event_duration_listener(listener)


# --- Deviceless GPU compilation (an optional CUDA PJRT plugin, no GPU needed) ----------------------

_CUDA_PLUGINS = ("jax_plugins.xla_cuda13", "jax_plugins.xla_cuda12")


def cuda_plugin_installed():
    """Whether a CUDA PJRT plugin for jax is installed (`jax-cuda13-pjrt` / `jax-cuda12-pjrt`), without importing it."""
    for name in _CUDA_PLUGINS:
        try:
            if importlib.util.find_spec(name) is not None:
                return True
        except ModuleNotFoundError:  # no jax_plugins namespace at all
            return False
    return False


def deviceless_gpu_devices(n, target_config):
    """`n` compile-only GPU devices of the GPU described by `target_config` (a GpuTargetConfigProto, text format).

    Uses the CUDA PJRT plugin's topology (`jax.experimental.topologies`,
    checked against jax 0.10.2 + jax-cuda13-pjrt 0.10.2): XLA:GPU compiles for
    them on a machine without a GPU. Never put arrays on them (jax crashes);
    compile from `jax.ShapeDtypeStruct`s carrying shardings on them only.
    Raises RuntimeError / NotImplementedError when the plugin did not register
    (it needs JAX_PLATFORMS=cpu or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 before jax starts).
    """
    topology = topologies.get_topology_desc(
        platform="cuda", topology_name="", target_config=target_config, topology=f"1x1x{n}"
    )
    return list(topology.devices)


@contextlib.contextmanager
def devices_seen_as(devices):
    """Inside the block `jax.devices()` and `jax.device_count()` answer `devices`, for code probing the platform."""
    real_devices, real_count = jax.devices, jax.device_count
    jax.devices = lambda backend=None: list(devices) if backend in (None, "cuda", "gpu") else real_devices(backend)
    jax.device_count = lambda backend=None: len(devices) if backend in (None, "cuda", "gpu") else real_count(backend)
    try:
        yield
    finally:
        jax.devices, jax.device_count = real_devices, real_count


def compile_train_step_with_options(model, state, batch, compiler_options):
    """`compile_train_step` with XLA debug options for this compilation only.

    E.g. `{"xla_gpu_enable_triton_gemm": False}`; XLA_FLAGS would be read only when jax starts.
    """
    shardings = jax.tree.map(lambda a: a.sharding, state)
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, shardings))
    return step.lower(state, batch).compile(compiler_options=compiler_options)
