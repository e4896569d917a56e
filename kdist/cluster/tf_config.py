"""Translate a TensorFlow `TF_CONFIG` cluster spec (MultiWorkerMirroredStrategy's) into a `ClusterConfig`."""

from kdist.checks import shown
from kdist.cluster.config import ClusterConfig, check_address
from kdist.errors import ArgumentTypeError, ClusterError
from kdist.textdata import parse_json

# TF_CONFIG task types that take part in training, in process-id order: with
# MultiWorkerMirroredStrategy the chief is worker 0 and the workers follow it.
_TRAINING_TASKS = ("chief", "worker")
_NOT_ON_JAX = {
    "ps": "parameter servers (ParameterServerStrategy) have no JAX equivalent: JAX runs one "
    "SPMD program on every process, with the variables sharded over the mesh instead",
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
    # ClusterConfig(coordinator_address='host1:12345', num_processes=2, process_id=1, source='TF_CONFIG',
    #               engine='tf-config', ...)
    ```

    Args:
        tf_config: the JSON string (as in the TF_CONFIG variable) or the decoded dict.

    Raises:
        ClusterError: the spec is not valid JSON, lacks "cluster" or "task",
            names a task that is not in the cluster, or uses parameter servers.
    """
    spec = _decode(tf_config)
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
            check_address(a, f'TF_CONFIG cluster["{job}"]')
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


def _decode(tf_config):
    if isinstance(tf_config, dict):
        return tf_config
    if not isinstance(tf_config, (str, bytes)):
        raise ArgumentTypeError(
            f"tf_config must be a TF_CONFIG JSON string or its decoded dict; received {shown(tf_config)} "
            f"({type(tf_config).__name__})."
        )
    if isinstance(tf_config, bytes):
        try:
            tf_config = tf_config.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ClusterError(f"TF_CONFIG is not UTF-8 text: {e}.") from None
    spec = parse_json(tf_config, "TF_CONFIG", ClusterError)
    if not isinstance(spec, dict):
        raise ClusterError(f'TF_CONFIG must be a JSON object with "cluster" and "task"; received {shown(tf_config)}.')
    return spec
