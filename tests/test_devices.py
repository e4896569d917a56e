import jax
import pytest

import kdist
from kdist import FakeDevicesError
from tests.subprocess_utils import run_python


def test_suite_runs_on_eight_fake_devices():
    assert jax.device_count() == 8
    assert {d.platform for d in jax.devices()} == {"cpu"}


def test_same_count_again_is_a_no_op():
    kdist.fake_devices(8)
    assert jax.device_count() == 8


def test_other_count_after_initialisation_says_how_to_fix():
    with pytest.raises(
        FakeDevicesError, match=r"after JAX initialised with 8 cpu device\(s\).*before anything imports jax"
    ):
        kdist.fake_devices(4)


@pytest.mark.parametrize("n", [0, -1, 2.5, "8", True])
def test_bad_count(n):
    with pytest.raises(ValueError, match="positive integer"):
        kdist.fake_devices(n)


def test_before_jax_imports_in_a_fresh_process():
    result = run_python("import kdist; kdist.fake_devices(4); import jax; print(jax.device_count())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "4"


def test_after_jax_import_but_before_initialisation():
    result = run_python("import jax, kdist; kdist.fake_devices(3); print(len(jax.devices()))")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "3"


def test_environment_variable():
    result = run_python("import kdist, jax; print(jax.device_count())", env={"KDIST_FAKE_DEVICES": "6"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-1] == "6"


def test_bad_environment_variable_names_it():
    result = run_python("import kdist", env={"KDIST_FAKE_DEVICES": "eight"})
    assert result.returncode != 0
    assert "KDIST_FAKE_DEVICES='eight' is not an integer" in result.stderr


def test_fake_devices_env_replaces_the_device_count_and_keeps_other_flags():
    from kdist.devices import fake_devices_env

    env = fake_devices_env(4, "--xla_cpu_foo=1 --xla_force_host_platform_device_count=8 --xla_bar")
    assert env == {
        "JAX_NUM_CPU_DEVICES": "4",
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_cpu_foo=1 --xla_bar --xla_force_host_platform_device_count=4",
    }
    assert fake_devices_env(2)["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2"


@pytest.mark.parametrize("size_var", ["KERAS_DISTRIBUTION_NUM_PROCESSES", "OMPI_COMM_WORLD_SIZE"])
def test_in_a_multi_process_job_the_jobs_devices_per_process_stay(monkeypatch, size_var):
    monkeypatch.setenv("KDIST_FAKE_DEVICES", "4")  # 2 processes x 4 devices, as `kdist launch -n 2` sets them
    monkeypatch.setenv(size_var, "2")
    with pytest.raises(
        FakeDevicesError,
        match=rf"fake_devices\(6\) was called in a process of a 2-process job "
        rf"\({size_var}=2\) with 4 fake devices per process .* Ask for 8 \(or 4\)",
    ):
        kdist.fake_devices(6)
    # 8 (the whole job, as the README's example asks) and 4 keep 4 per process; here jax has 8 already:
    for n in (8, 4):
        with pytest.raises(FakeDevicesError, match=r"fake_devices\(4\) was called after JAX initialised with 8"):
            kdist.fake_devices(n)
    monkeypatch.setenv(size_var, "1")
    kdist.fake_devices(8)  # one process: as before
