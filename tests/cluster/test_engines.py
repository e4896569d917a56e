"""Reading the engines' task layout from their variables, and refusing to build a mesh in a task that has not joined.

These read environment dicts written as each engine writes them (checked
against Open MPI 4.1, SLURM 22.05 srun and sbatch on this machine); the
real engines run in test_mpirun.py and test_srun.py.
"""

import keras
import pytest

import kdist
from kdist.cli.main import main
from kdist.cluster import join
from kdist.cluster.config import ClusterConfig
from kdist.cluster.engines import alone_requested, engine_tasks

OPENMPI = {
    "OMPI_COMM_WORLD_SIZE": "2",
    "OMPI_COMM_WORLD_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
    "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    "PMIX_RANK": "1",
}
SRUN = {
    "SLURM_JOB_ID": "7",
    "SLURM_STEP_ID": "0",
    "SLURM_STEP_NUM_TASKS": "6",
    "SLURM_NTASKS": "6",
    "SLURM_PROCID": "4",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "2",
    "SLURM_STEP_TASKS_PER_NODE": "2(x2),2",
    "SLURM_STEP_NODELIST": "node[001-003]",
}


def test_each_engine_gives_its_layout():
    mpi = engine_tasks(OPENMPI)
    assert (mpi.engine, mpi.num_processes, mpi.process_id, mpi.local_process_id, mpi.local_num_processes) == (
        "openmpi",
        2,
        1,
        1,
        2,
    )
    assert mpi.several and mpi.single_host
    slurm = engine_tasks(SRUN)
    assert (slurm.engine, slurm.num_processes, slurm.process_id, slurm.local_process_id) == ("slurm", 6, 4, 1)
    assert slurm.local_num_processes == 2 and not slurm.single_host  # node 2 of "2(x2),2"
    one_node = {k: v for k, v in SRUN.items() if k != "SLURM_STEP_TASKS_PER_NODE"}
    assert engine_tasks({**one_node, "SLURM_STEP_NUM_NODES": "1"}).single_host
    assert engine_tasks(one_node).local_num_processes is None
    pmi = engine_tasks({"PMI_SIZE": "4", "PMI_RANK": "3", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"})
    assert (pmi.engine, pmi.num_processes, pmi.process_id, pmi.local_num_processes) == ("mpi", 4, 3, 2)
    pmix = engine_tasks({"PMIX_RANK": "1"})
    assert (pmix.engine, pmix.num_processes, pmix.several) == ("pmix", None, True)  # rank 1: at least 2 tasks
    k8s = engine_tasks({"JOB_COMPLETION_INDEX": "0", "KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    assert (k8s.engine, k8s.num_processes, k8s.several) == ("kubernetes", None, False)  # count not in the env


def test_a_batch_script_and_single_tasks_are_not_a_multi_task_job():
    batch = {"SLURM_JOB_ID": "7", "SLURM_NTASKS": "2", "SLURM_NPROCS": "2", "SLURM_PROCID": "0"}  # sbatch, no srun
    assert engine_tasks(batch) is None
    assert not engine_tasks({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}).several
    assert engine_tasks({}) is None


def test_malformed_engine_variables_are_named():
    with pytest.raises(kdist.ClusterError, match="OMPI_COMM_WORLD_SIZE='two' is not an integer"):
        engine_tasks({**OPENMPI, "OMPI_COMM_WORLD_SIZE": "two"})
    with pytest.raises(kdist.ClusterError, match="SLURM_PROCID is set .* but none of SLURM_STEP_NUM_TASKS"):
        engine_tasks({"SLURM_STEP_ID": "0", "SLURM_PROCID": "0"})
    with pytest.raises(kdist.ClusterError, match="KDIST_ALONE='yes' is not understood"):
        alone_requested({"KDIST_ALONE": "yes"})
    assert alone_requested({"KDIST_ALONE": "1"}) and not alone_requested({})


def test_a_preset_in_a_task_that_has_not_joined_is_refused(monkeypatch):
    for name, value in OPENMPI.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(kdist.ClusterError) as error:
        kdist.preset("dp")
    message = str(error.value)
    assert "task 1 of 2 tasks started by Open MPI (mpirun)" in message
    assert "OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=1" in message
    assert "call kdist.initialize() first thing" in message and "KDIST_ALONE=1" in message
    with pytest.raises(kdist.ClusterError, match="the mesh '2x4'"):
        kdist.mesh("2x4")
    monkeypatch.setenv("KDIST_ALONE", "1")
    assert kdist.preset("dp").device_mesh.shape == (8,)


def test_a_distribution_on_the_users_own_mesh_in_a_task_that_has_not_joined_is_refused(monkeypatch):
    mesh = keras.distribution.DeviceMesh((8,), ["data"], keras.distribution.list_devices())
    for name, value in OPENMPI.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(kdist.ClusterError, match="built a ShardedDistribution before joining the job"):
        kdist.ShardedDistribution(mesh)


def test_a_kdist_launch_child_that_has_not_joined_is_refused(monkeypatch):
    monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
    monkeypatch.setenv("KERAS_DISTRIBUTION_PROCESS_ID", "0")
    with pytest.raises(kdist.ClusterError, match=r"started by kdist launch \(KERAS_DISTRIBUTION_\*\)"):
        kdist.preset("2x4")


def test_the_engine_job_becomes_a_config_with_a_loopback_coordinator_on_one_host(monkeypatch):
    monkeypatch.setenv("JAX_COORDINATOR_PORT", "61234")
    env = {**OPENMPI, "OMPI_MCA_orte_hnp_uri": "2008678400.0;tcp://192.0.2.2:42555"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = join._from_engine(dict(env, JAX_COORDINATOR_PORT="61234"))
    assert config == ClusterConfig(
        "127.0.0.1:61234", 2, 1, config.source, engine="openmpi", local_process_id=1, local_num_processes=2
    )
    assert config.source.startswith("OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_RANK")
    given = join._from_engine({**env, "JAX_COORDINATOR_ADDRESS": "head:1234"})
    assert given.coordinator_address == "head:1234"


def test_an_engine_job_without_a_coordinator_says_how_to_give_one(monkeypatch):
    monkeypatch.delenv("OMPI_MCA_orte_hnp_uri", raising=False)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    with pytest.raises(kdist.ClusterError, match="Open MPI 5 no longer sets.*Set JAX_COORDINATOR_ADDRESS=HOST:PORT"):
        join._from_engine(OPENMPI)  # Open MPI 5 sets no OMPI_MCA_orte_hnp_uri


def test_local_device_ids_follow_the_argument_the_variable_or_the_engine(monkeypatch):
    monkeypatch.delenv("JAX_LOCAL_DEVICE_IDS", raising=False)
    one_of_two = ClusterConfig("h:1", 4, 1, engine="slurm", local_process_id=1, local_num_processes=2)
    alone_on_host = ClusterConfig("h:1", 2, 1, engine="slurm", local_process_id=0, local_num_processes=1)
    assert join._local_device_ids(None, one_of_two) == [1]  # one GPU per task, as jax does
    assert join._local_device_ids(None, alone_on_host) is None  # one task per host drives all its GPUs
    assert join._local_device_ids([0, 1, 2, 3], one_of_two) == [0, 1, 2, 3]
    monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0,1")
    assert join._local_device_ids(None, one_of_two) == [0, 1]
    monkeypatch.setenv("JAX_LOCAL_DEVICE_IDS", "0;1")
    with pytest.raises(kdist.ClusterError, match="JAX_LOCAL_DEVICE_IDS='0;1'"):
        join._local_device_ids(None, one_of_two)
    with pytest.raises(kdist.ArgumentTypeError, match="local_device_ids must be a device id"):
        kdist.initialize(local_device_ids="0,1")


def test_a_multi_host_coordinator_that_resolves_to_loopback_is_refused():
    config = ClusterConfig("localhost:1234", 4, 0, engine="slurm", local_process_id=0, local_num_processes=2)
    with pytest.raises(kdist.ClusterError, match="resolves to 127.0.0.1 here, a loopback address"):
        join._check_bind_reachable(config)
    join._check_bind_reachable(ClusterConfig("localhost:1234", 2, 0, engine="slurm", local_num_processes=2))


def test_config_names_its_engine():
    assert ClusterConfig("h:1", 2, 0, "KERAS_DISTRIBUTION_*").engine == "keras-env"
    assert ClusterConfig("h:1", 2, 0, "TF_CONFIG").engine == "tf-config"
    assert ClusterConfig("h:1", 2, 0).engine == "arguments"
    with pytest.raises(kdist.ArgumentTypeError, match="local_process_id must be an integer or None"):
        ClusterConfig("h:1", 2, 0, local_process_id="0")


def test_the_cli_commands_are_single_process_tools_inside_a_job(monkeypatch, capsys):
    for name, value in OPENMPI.items():
        monkeypatch.setenv(name, value)
    assert main(["inspect", "mlp", "--mesh", "2x4"]) == 0
    assert "mlp" in capsys.readouterr().out
    with pytest.raises(kdist.ClusterError, match="task 1 of 2 tasks"):  # outside the command: refused again
        kdist.preset("2x4")


def test_a_kubernetes_indexed_job_without_its_count_joins_only_when_told(monkeypatch):
    pod = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "1"}
    monkeypatch.setattr(join, "engine_cluster", lambda *args: None)  # no `kubernetes` package: jax cannot tell
    with pytest.raises(kdist.ClusterError, match="task 1 of a job started by a Kubernetes Indexed Job .*jax.k8s"):
        join._from_engine(pod)
    assert join._from_engine({**pod, "JOB_COMPLETION_INDEX": "0"}) is None  # pod 0 cannot tell: as one process
    monkeypatch.setattr(join, "engine_cluster", lambda *args: ("train-0.train:55527", 2))
    config = join._from_engine(pod)
    assert (config.engine, config.coordinator_address, config.num_processes, config.process_id) == (
        "kubernetes",
        "train-0.train:55527",
        2,
        1,
    )


def test_a_failing_jax_detection_is_a_cluster_error(monkeypatch):
    def api_error(*args):
        raise RuntimeError("Kubernetes API Error: 403 - Forbidden")

    monkeypatch.setattr(join, "engine_cluster", api_error)
    with pytest.raises(kdist.ClusterError, match="jax's detection of the kubernetes job failed: RuntimeError: Kube"):
        join._from_engine({"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "1"})
