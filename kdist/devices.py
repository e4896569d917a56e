"""Fake CPU devices, so that meshes of any size can be tried on one CPU."""

import os
import re
import sys

from kdist.errors import FakeDevicesError

ENV_VAR = "KDIST_FAKE_DEVICES"
_XLA_FLAG = "--xla_force_host_platform_device_count"
_XLA_FLAG_SETTING = re.compile(rf"{_XLA_FLAG}=\S*")


def fake_devices(n):
    """Give JAX `n` CPU devices. Must run before JAX initialises its backends.

    Sets `JAX_NUM_CPU_DEVICES`, the `XLA_FLAGS` host device count and
    `JAX_PLATFORMS=cpu` (or the matching `jax.config` options when jax is
    already imported but has not initialised). Calling it again with the same
    count is a no-op.

    Example:

    ```python
    import kdist
    kdist.fake_devices(8)
    import jax
    assert len(jax.devices()) == 8
    ```

    Args:
        n: number of CPU devices, a positive integer.

    Raises:
        FakeDevicesError: JAX already initialised with a different device count.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"fake_devices(n) needs a positive integer; received n={n!r}.")
    if _backends_initialized():
        import jax

        have = jax.device_count()
        platform = jax.devices()[0].platform
        if have == n and platform == "cpu":
            return
        raise FakeDevicesError(
            f"fake_devices({n}) was called after JAX initialised with {have} "
            f"{platform} device(s). Call kdist.fake_devices({n}) (or set "
            f"{ENV_VAR}={n}) before anything imports jax or keras, or run "
            f"`kdist ... --fake-devices {n}`."
        )
    os.environ.update(fake_devices_env(n, os.environ.get("XLA_FLAGS", "")))
    if "jax" in sys.modules:
        import jax

        jax.config.update("jax_num_cpu_devices", n)
        jax.config.update("jax_platforms", "cpu")


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
    """Apply `KDIST_FAKE_DEVICES` if it is set. Returns the count, or None."""
    value = os.environ.get(ENV_VAR)
    if not value:
        return None
    try:
        n = int(value)
    except ValueError:
        raise ValueError(
            f"{ENV_VAR}={value!r} is not an integer; set it to a device count such as 8."
        ) from None
    fake_devices(n)
    return n


def _backends_initialized():
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge

    return xla_bridge.backends_are_initialized()
