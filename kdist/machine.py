"""Where a run happened: platform, CPU count, devices and versions, for benchmark and sweep results."""

import importlib.metadata
import os
import platform
import time

import jax
import jaxlib
import keras

from kdist.version import __version__


def machine_info(devices=None):
    """Where a sweep or benchmark ran: platform, CPU count, devices and versions."""
    devices = list(devices) if devices is not None else jax.devices()
    platform_name = devices[0].platform
    return {
        "platform": platform_name,
        "device_kind": devices[0].device_kind,
        "device_count": len(devices),
        "fake_devices": platform_name == "cpu" and len(devices) > 1,
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
        "os": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "keras": keras.__version__,
        "kdist": __version__,
        "keras_hub": _version("keras-hub"),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def _version(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
