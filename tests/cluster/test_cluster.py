import json
import socket
import subprocess
import sys

import pytest

import kdist
from kdist.cluster import join
from kdist.cluster.join import ClusterConfig, cluster_from_env
from kdist.cluster.launcher import free_port, process_env


def _tf_config(cluster, task_type, index):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


def test_tf_config_with_two_workers_is_translated():
    cluster = {"worker": ["host1:12345", "host2:23456"]}
    first = kdist.cluster_from_tf_config(_tf_config(cluster, "worker", 0))
    second = kdist.cluster_from_tf_config(_tf_config(cluster, "worker", 1))
    assert first == ClusterConfig("host1:12345", 2, 0, source="TF_CONFIG")
    assert second == ClusterConfig("host1:12345", 2, 1, source="TF_CONFIG")
    assert second.env() == {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "host1:12345",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }


def test_chief_is_process_zero_and_workers_follow_evaluator_is_not_counted():
    cluster = {"chief": ["c:1"], "worker": ["w0:2", "w1:3"], "evaluator": ["e:4"]}
    assert kdist.cluster_from_tf_config(_tf_config(cluster, "chief", 0)) == ClusterConfig("c:1", 3, 0, "TF_CONFIG")
    assert kdist.cluster_from_tf_config(_tf_config(cluster, "worker", 1)) == ClusterConfig("c:1", 3, 2, "TF_CONFIG")
    with pytest.raises(kdist.ClusterError, match="evaluator, which is not part of the training cluster"):
        kdist.cluster_from_tf_config(_tf_config(cluster, "evaluator", 0))


@pytest.mark.parametrize(
    "tf_config, message",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({"task": {"type": "worker", "index": 0}}), 'non-empty "cluster"'),
        (json.dumps({"cluster": {"worker": ["a:1"]}}), 'needs a "task" object'),
        (_tf_config({"worker": ["a:1", "b:2"]}, "worker", 2), r"worker:2 is out of range: the cluster has 2 worker"),
        (_tf_config({"worker": ["a:1"]}, "chief", 0), r"chief:0 is out of range"),
        (_tf_config({"worker": ["a:1"], "ps": ["p:1"]}, "worker", 0), "ParameterServerStrategy"),
        (_tf_config({"chief": ["a:1", "b:2"]}, "chief", 0), "at most one chief"),
        (_tf_config({"worker": ["a:1", "a:1"]}, "worker", 0), "same address more than once"),
        (_tf_config({"worker": ["nohostport"]}, "worker", 0), "not of the form"),
        (_tf_config({"worker": ["a:1"], "trainer": ["b:2"]}, "worker", 0), "unknown job"),
        (_tf_config({"worker": ["a:1"]}, "worker", "0"), "index must be an integer"),
    ],
)
def test_malformed_tf_config_is_rejected_clearly(tf_config, message):
    with pytest.raises(kdist.ClusterError, match=message):
        kdist.cluster_from_tf_config(tf_config)


def test_environment_keras_variables_and_tf_config_must_agree():
    keras_env = {
        "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1,h:2",
        "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
        "KERAS_DISTRIBUTION_PROCESS_ID": "1",
    }
    assert cluster_from_env(keras_env) == ClusterConfig("h:1", 2, 1, "KERAS_DISTRIBUTION_*")
    agreeing = {**keras_env, "TF_CONFIG": _tf_config({"worker": ["h:1", "h:2"]}, "worker", 1)}
    assert cluster_from_env(agreeing).process_id == 1
    disagreeing = {**keras_env, "TF_CONFIG": _tf_config({"worker": ["h:1", "h:2"]}, "worker", 0)}
    with pytest.raises(kdist.ClusterError, match="but TF_CONFIG describes process 0 of 2"):
        cluster_from_env(disagreeing)
    assert cluster_from_env({}) is None


@pytest.mark.parametrize(
    "env, message",
    [
        ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2"}, "are not; set all three or none"),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "two",
                "KERAS_DISTRIBUTION_PROCESS_ID": "0",
            },
            "is not an integer",
        ),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                "KERAS_DISTRIBUTION_PROCESS_ID": "2",
            },
            "process_id=2 is out of range",
        ),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1,h:2,h:3",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                "KERAS_DISTRIBUTION_PROCESS_ID": "0",
            },
            "list 3 processes, but num_processes=2",
        ),
    ],
)
def test_malformed_keras_variables_are_rejected_clearly(env, message):
    with pytest.raises(kdist.ClusterError, match=message):
        cluster_from_env(env)


def test_initialize_without_configuration_is_a_single_process_no_op(monkeypatch):
    for name in (
        "KERAS_DISTRIBUTION_JOB_ADDRESSES",
        "KERAS_DISTRIBUTION_NUM_PROCESSES",
        "KERAS_DISTRIBUTION_PROCESS_ID",
        "TF_CONFIG",
    ):
        monkeypatch.delenv(name, raising=False)
    assert kdist.initialize() is None
    with pytest.raises(kdist.ClusterError, match="needs job_addresses, num_processes and process_id together"):
        kdist.initialize(num_processes=2)


def test_initialize_after_jax_started_says_it_is_too_late():
    import jax

    jax.devices()  # the test process's backend is up
    with pytest.raises(kdist.ClusterError, match="after JAX had initialised its devices"):
        kdist.initialize("127.0.0.1:1234", 2, 0)


def test_two_processes_join_one_run_from_tf_config_alone():
    """End to end: two interpreters with only TF_CONFIG (no KERAS_DISTRIBUTION_*) form one JAX run."""
    workers = [f"127.0.0.1:{free_port()}", "127.0.0.1:1"]  # only worker 0's port is listened on
    code = (
        "import kdist; config = kdist.initialize(); import jax; "
        "print(config.source, config.process_id, jax.process_index(), jax.process_count(), jax.device_count())"
    )
    procs = []
    for index in range(2):
        env = process_env(index, 2, 2, workers[0])
        for name in (
            "KERAS_DISTRIBUTION_JOB_ADDRESSES",
            "KERAS_DISTRIBUTION_NUM_PROCESSES",
            "KERAS_DISTRIBUTION_PROCESS_ID",
        ):
            del env[name]
        env["TF_CONFIG"] = _tf_config({"worker": workers}, "worker", index)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for index, (out, err) in enumerate(outputs):
        assert procs[index].returncode == 0, err[-2000:]
        assert out.strip().splitlines()[-1].split() == ["TF_CONFIG", str(index), str(index), "2", "4"]


def _listener(port):
    """A socket listening on 127.0.0.1:`port` as jax's coordinator (gRPC) listens: SO_REUSEADDR, SO_REUSEPORT."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen()
    return listener


def test_a_coordinator_port_another_process_listens_on_is_refused_before_joining():
    """jax's coordinator would start beside the other listener, and the two jobs' tasks would reach either one."""
    port = free_port()
    code = f"import kdist; kdist.initialize('127.0.0.1:{port}', 2, 0); print('JOINED')"
    with _listener(port):
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and "JOINED" not in run.stdout
    assert (
        f"kdist.errors.ClusterError: Port {port} of this job's coordinator (127.0.0.1:{port}; process 0 of 2 "
        "with coordinator" in run.stderr
    ), run.stderr[-2000:]
    assert "is in use on this host by another process. " in run.stderr and "JAX_COORDINATOR_PORT=PORT" in run.stderr


def test_a_port_whose_last_listener_has_closed_is_free_for_the_coordinator():
    """A coordinator that ran before on the port leaves its connections in TIME_WAIT; they do not own it."""
    port = free_port()
    config = ClusterConfig(f"127.0.0.1:{port}", 2, 0, "arguments")
    with _listener(port) as listener:
        with pytest.raises(kdist.ClusterError, match=f"Port {port} of this job's coordinator"):
            join._check_port_alone(config.coordinator_address, config)
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the listener's side closes first: its end of the connection waits in TIME_WAIT
        client.close()
    join._check_port_alone(config.coordinator_address, config)
