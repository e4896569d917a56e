"""Bad inputs to `kdist.initialize`, `kdist.ClusterConfig` and `kdist.cluster_from_tf_config`: refused with a kdist
error that names the argument, the value and what is accepted, before JAX is touched."""

import json

import pytest

import kdist
from kdist.cluster.join import (
    JOB_ADDRESSES,
    NUM_PROCESSES,
    PROCESS_ID,
    TF_CONFIG,
    ClusterConfig,
    cluster_from_env,
)


def _tf(cluster, task_type="worker", index=0):
    return json.dumps({"cluster": cluster, "task": {"type": task_type, "index": index}})


CONFIGS = [
    # (ClusterConfig arguments, error class, words)
    (("h:1", 0, 0), kdist.ClusterError, ["num_processes must be at least 1", "0"]),
    (("h:1", -1, 0), kdist.ClusterError, ["num_processes", "-1"]),
    (("h:1", 2, 2), kdist.ClusterError, ["process_id=2 is out of range", "0 to 1"]),
    (("h:1", 2, -1), kdist.ClusterError, ["process_id=-1"]),
    (("h:1", "2", 0), kdist.ArgumentTypeError, ["num_processes", "'2'", "integer"]),
    (("h:1", 2, 1.0), kdist.ArgumentTypeError, ["process_id", "1.0", "integer"]),
    (("h:1", True, 0), kdist.ArgumentTypeError, ["num_processes", "True"]),
    ((None, 2, 0), kdist.ArgumentTypeError, ["coordinator_address", "None", "host:port"]),
    ((1234, 2, 0), kdist.ArgumentTypeError, ["coordinator_address", "1234"]),
    (("h", 2, 0), kdist.ClusterError, ["'h'", "host:port"]),
    (("h:", 2, 0), kdist.ClusterError, ["'h:'"]),
    (("h:99999", 2, 0), kdist.ClusterError, ["'h:99999'", "1 to 65535"]),
    (("h:-1", 2, 0), kdist.ClusterError, ["'h:-1'"]),
    (("h h:1", 2, 0), kdist.ClusterError, ["'h h:1'"]),
    (("http://h:1", 2, 0), kdist.ClusterError, ["'http://h:1'"]),
    (("h:1\n", 2, 0), kdist.ClusterError, ["host:port"]),
]


@pytest.mark.parametrize("arguments, error, words", CONFIGS, ids=[repr(c[0]) for c in CONFIGS])
def test_bad_cluster_configs_are_refused(arguments, error, words):
    with pytest.raises(error) as caught:
        ClusterConfig(*arguments)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


def test_good_addresses_are_accepted():
    for address in ("127.0.0.1:1", "localhost:65535", "[::1]:1234", "host-1.example.com:8476", "10.0.0.1:80"):
        assert ClusterConfig(address, 2, 1).coordinator_address == address


TF_CONFIGS = [
    (None, kdist.ArgumentTypeError, ["tf_config", "None", "JSON string or its decoded dict"]),
    (42, kdist.ArgumentTypeError, ["tf_config", "42"]),
    (["cluster"], kdist.ArgumentTypeError, ["tf_config", "list"]),
    ("", kdist.ClusterError, ["not valid JSON"]),
    ("{not json", kdist.ClusterError, ["not valid JSON"]),
    ("[1, 2]", kdist.ClusterError, ["must be a JSON object"]),
    (b"\xff", kdist.ClusterError, ["TF_CONFIG is not UTF-8 text"]),
    ("null", kdist.ClusterError, ["must be a JSON object"]),
    ({}, kdist.ClusterError, ['non-empty "cluster"']),
    ({"cluster": [], "task": {}}, kdist.ClusterError, ['non-empty "cluster"']),
    ({"cluster": {"worker": ["a:1"]}, "task": "worker"}, kdist.ClusterError, ['"task" object']),
    (_tf({"worker": "a:1"}), kdist.ClusterError, ['cluster["worker"] must be a list']),
    (_tf({"worker": [1]}), kdist.ClusterError, ['cluster["worker"] must be a list of "host:port" strings']),
    (_tf({"worker": ["a:1"]}, index=-1), kdist.ClusterError, ["worker:-1 is out of range"]),
    (_tf({"worker": ["a:1"]}, index=True), kdist.ClusterError, ["index must be an integer", "True"]),
    (_tf({"worker": ["a:1"]}, index=1.0), kdist.ClusterError, ["index must be an integer", "1.0"]),
    (_tf({"worker": ["a:1"]}, task_type="boss"), kdist.ClusterError, ["'boss'", "chief", "worker"]),
    (_tf({"worker": []}), kdist.ClusterError, ['no "chief" or "worker" addresses']),
    (_tf({"worker": ["a:1", "a b:2"]}), kdist.ClusterError, ["'a b:2'", "host:port"]),
    (_tf({"worker": ["a:1"], "ps": ["p:1"]}), kdist.ClusterError, ["ParameterServerStrategy"]),
]


@pytest.mark.parametrize("tf_config, error, words", TF_CONFIGS, ids=[repr(c[0])[:50] for c in TF_CONFIGS])
def test_bad_tf_configs_are_refused(tf_config, error, words):
    with pytest.raises(error) as caught:
        kdist.cluster_from_tf_config(tf_config)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


INITIALIZE = [
    ({"job_addresses": 1234, "num_processes": 2, "process_id": 0}, kdist.ArgumentTypeError, ["job_addresses", "1234"]),
    ({"job_addresses": "h:1", "num_processes": "2", "process_id": 0}, kdist.ArgumentTypeError, ["num_processes"]),
    ({"job_addresses": "h:1", "num_processes": 2, "process_id": 0.0}, kdist.ArgumentTypeError, ["process_id", "0.0"]),
    ({"job_addresses": "h:1", "num_processes": 2}, kdist.ClusterError, ["together", "process_id=None"]),
    ({"job_addresses": "h:1", "num_processes": 2, "process_id": 5}, kdist.ClusterError, ["process_id=5"]),
    ({"job_addresses": "h:1,h:2,h:3", "num_processes": 2, "process_id": 0}, kdist.ClusterError, ["3 processes"]),
    ({"job_addresses": "nohost", "num_processes": 2, "process_id": 0}, kdist.ClusterError, ["'nohost'"]),
    ({"cpu_collectives": "nccl"}, kdist.ClusterError, ["cpu_collectives", "'gloo' or 'mpi'", "'nccl'"]),
    ({"cpu_collectives": 1}, kdist.ArgumentTypeError, ["cpu_collectives", "1"]),
    ({"bind_address": "everywhere"}, kdist.ClusterError, ["bind_address", "'everywhere'", "host:port"]),
    ({"bind_address": 80}, kdist.ArgumentTypeError, ["bind_address", "80"]),
]


@pytest.mark.parametrize("arguments, error, words", INITIALIZE, ids=[repr(c[0])[:60] for c in INITIALIZE])
def test_bad_initialize_arguments_are_refused_before_jax_is_touched(arguments, error, words, monkeypatch):
    for name in (JOB_ADDRESSES, NUM_PROCESSES, PROCESS_ID, TF_CONFIG):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(error) as caught:
        kdist.initialize(**arguments)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))


@pytest.mark.parametrize(
    "env, words",
    [
        ({"KERAS_DISTRIBUTION_NUM_PROCESSES": "2"}, ["set all three or none"]),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2.5",
                "KERAS_DISTRIBUTION_PROCESS_ID": "0",
            },
            ["KERAS_DISTRIBUTION_NUM_PROCESSES='2.5' is not an integer", "to the number of processes (e.g. 2)"],
        ),
        (
            {
                "KERAS_DISTRIBUTION_JOB_ADDRESSES": "h:1",
                "KERAS_DISTRIBUTION_NUM_PROCESSES": "2",
                "KERAS_DISTRIBUTION_PROCESS_ID": "-1",
            },
            ["process_id=-1 is out of range"],
        ),
        ({"TF_CONFIG": "{"}, ["TF_CONFIG is not valid JSON"]),
        ({"TF_CONFIG": "[" * 10_000 + "]" * 10_000}, ["TF_CONFIG nests 10000 levels", "at most 64"]),
    ],
)
def test_bad_environments_are_refused(env, words):
    with pytest.raises(kdist.ClusterError) as caught:
        cluster_from_env(env)
    for word in words:
        assert word in str(caught.value), (word, str(caught.value))
