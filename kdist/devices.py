"""Devices: fake CPU devices for trying meshes on one CPU, and naming and choosing jax devices."""

import importlib.util
import os
import re

import jax

from kdist.checks import MAX_FAKE_DEVICES, positive_int, shown
from kdist.errors import FakeDevicesError, SpecError
from kdist.jax_internals import backends_initialized

ENV_VAR = "KDIST_FAKE_DEVICES"
_XLA_FLAG = "--xla_force_host_platform_device_count"
_XLA_FLAG_SETTING = re.compile(rf"{_XLA_FLAG}=\S*")
# The process count of the job this process was started in: `kdist launch`, Open MPI, an srun step, PMI.
_JOB_SIZE_VARS = ("KERAS_DISTRIBUTION_NUM_PROCESSES", "OMPI_COMM_WORLD_SIZE", "SLURM_STEP_NUM_TASKS", "PMI_SIZE")
_ACCELERATOR_PLUGINS = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")


def fake_devices(n):
    """Give JAX `n` CPU devices. Must run before JAX initialises its backends.

    Sets `JAX_NUM_CPU_DEVICES`, the `XLA_FLAGS` host device count and
    `JAX_PLATFORMS=cpu`, and the matching `jax.config` options. Calling it
    again with the same count is a no-op.

    Example:

    ```python
    import kdist
    kdist.fake_devices(8)
    import jax
    assert len(jax.devices()) == 8
    ```

    In a process of a multi-process job whose fake devices per process are
    already set (`kdist launch --devices-per-process D`, or `KDIST_FAKE_DEVICES=D`
    under an engine), the job's count stays: `n` may be the devices of the
    whole job (D x processes, as a script written for one 8-device process
    asks for 8) or D; any other `n` raises.

    Args:
        n: number of CPU devices, a positive integer (at most 4096).

    Raises:
        FakeDevicesError: JAX already initialised with a different device count,
            or `n` does not match the multi-process job this process belongs to.
    """
    n = positive_int(n, "fake_devices(n)", maximum=MAX_FAKE_DEVICES)
    n = _per_process_count_of_job(n)
    if backends_initialized():
        have, platform = jax.local_device_count(), jax.local_devices()[0].platform  # this process's, as n is
        if have == n and platform == "cpu":
            return
        raise FakeDevicesError(
            f"fake_devices({n}) was called after JAX initialised with {have} "
            f"{platform} device(s). Call kdist.fake_devices({n}) (or set "
            f"{ENV_VAR}={n}) before anything imports jax or keras, or run "
            f"`kdist ... --fake-devices {n}`."
        )
    os.environ.update(fake_devices_env(n, os.environ.get("XLA_FLAGS", "")))
    jax.config.update("jax_num_cpu_devices", n)
    jax.config.update("jax_platforms", "cpu")


def _per_process_count_of_job(n):
    """`n`, or in a job with KDIST_FAKE_DEVICES=D per process, D when `n` is D or the job's total."""
    per_process, processes, variable = os.environ.get(ENV_VAR, ""), None, None
    for variable in _JOB_SIZE_VARS:
        if os.environ.get(variable, "").isdigit():
            processes = int(os.environ[variable])
            break
    if not per_process.isdigit() or int(per_process) < 1 or not processes or processes < 2:
        return n
    per_process = int(per_process)
    if n in (per_process, per_process * processes):
        return per_process
    raise FakeDevicesError(
        f"fake_devices({n}) was called in a process of a {processes}-process job ({variable}={processes}) with "
        f"{per_process} fake devices per process ({ENV_VAR}={per_process}): {per_process * processes} devices in "
        f"all. Ask for {per_process * processes} (or {per_process}), or change the job's devices per process "
        f"(kdist launch --devices-per-process, {ENV_VAR})."
    )


def fake_devices_env(n, xla_flags=""):
    """The variables that give a JAX process `n` CPU devices, keeping the other flags of `xla_flags`."""
    return {
        "JAX_NUM_CPU_DEVICES": str(n),
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": " ".join([*xla_flags_without_device_count(xla_flags), f"{_XLA_FLAG}={n}"]),
    }


def xla_flags_without_device_count(xla_flags):
    """The flags of an XLA_FLAGS value, as a list, less its host device count."""
    return _XLA_FLAG_SETTING.sub("", xla_flags).split()


def fake_devices_from_env():
    """Apply `KDIST_FAKE_DEVICES` if it is set (0: the real devices). Returns the count, or None."""
    value = os.environ.get(ENV_VAR)
    if not value or value.strip() == "0":
        return None
    try:
        n = int(value)
    except ValueError:
        raise FakeDevicesError(f"{ENV_VAR}={value!r} is not an integer; set it to a device count such as 8.") from None
    fake_devices(n)
    return n


def has_accelerator_plugin():
    """Whether a GPU or TPU plugin for jax is installed (without starting jax)."""
    return any(importlib.util.find_spec(name) for name in _ACCELERATOR_PLUGINS)


def device_name(device):
    """ "cpu:3" for a jax device (or a device name string, lower-cased)."""
    if isinstance(device, str):
        return device.lower()
    return f"{device.platform}:{device.id}"


def device_sort_key(name):
    """Sorts "cpu:2" before "cpu:10"."""
    platform, _, number = name.rpartition(":")
    return (platform, int(number)) if number.isdigit() else (name, 0)


def resolve_devices(devices=None):
    """The jax devices `devices` names (jax devices or names such as "cpu:0"); all of them for None.

    Raises:
        SpecError: an empty list, an unknown name, a device listed twice, or
            something that is not a device.
    """
    if devices is None:
        return jax.devices()
    if isinstance(devices, (str, bytes)) or not hasattr(devices, "__iter__"):
        raise SpecError(f'devices must be a list of jax devices or names such as "cpu:0"; received {shown(devices)}.')
    by_name = {device_name(d): d for d in jax.devices()}
    resolved = []
    for d in _flat(devices):
        if isinstance(d, str):
            if d.lower() not in by_name:
                raise SpecError(f"Unknown device {d!r}; known devices are {sorted(by_name, key=device_sort_key)}.")
            d = by_name[d.lower()]
        elif not isinstance(d, jax.Device):
            raise SpecError(
                f'devices must hold jax devices or names such as "cpu:0"; received {shown(d)} ({type(d).__name__}).'
            )
        resolved.append(d)
    if not resolved:
        raise SpecError(f"devices is empty; pass at least one device, or None for all {len(by_name)}.")
    names = [device_name(d) for d in resolved]
    twice = sorted({n for n in names if names.count(n) > 1}, key=device_sort_key)
    if twice:
        raise SpecError(f"devices lists {twice[0]!r} more than once; each device may appear in a mesh once.")
    return resolved


def _flat(devices):
    for d in devices:
        if isinstance(d, (list, tuple)) or getattr(d, "ndim", 0) > 0:
            yield from _flat(list(d))
        else:
            yield d
