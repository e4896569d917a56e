"""Peak memory while a block runs: bytes per device held by live jax arrays, and the process's host RSS.

`PeakMemory` samples on a background thread (every `interval` seconds) and
whenever a kdist load reads a slice or stages a variable (`sample_active`),
so a load's peaks are seen even between the thread's samples. Per-device
bytes count each live jax array's shard on each device that holds one
(`jax.live_arrays()`): they miss XLA's temporary buffers inside a compiled
computation and any memory outside jax. On fake CPU devices every "device"
is host memory, so the RSS holds all of them together: a proxy for a real
accelerator's memory, not a measurement of one.
"""

import gc
import math
import os
import resource
import threading

import jax

_ACTIVE = []  # PeakMemory objects inside their `with` block
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def device_bytes():
    """{device: bytes} of every live jax array's shards, by the device that holds them."""
    out = {}
    for array in jax.live_arrays():
        try:
            sharding = array.sharding
            shard = math.prod(sharding.shard_shape(array.shape)) * array.dtype.itemsize
            devices = sharding.addressable_devices
        except Exception:  # an array deleted while we looked (another thread): it holds nothing now
            continue
        for device in devices:
            out[device] = out.get(device, 0) + shard
    return out


def host_rss():
    """The process's resident set size in bytes now (Linux /proc; else the peak so far from getrusage)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * _PAGE
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def sample_active():
    """Take a sample in every active `PeakMemory` (kdist's loads call this after each slice and variable)."""
    for tracker in list(_ACTIVE):
        tracker.sample()


class PeakMemory:
    """Peak per-device bytes (live jax arrays) and peak host RSS inside a `with` block.

    Example:

    ```python
    with PeakMemory() as peak:
        model = kdist.load("/tmp/preset")
    peak.device_peak       # {device: bytes} at its highest during the block
    peak.rss_peak          # bytes
    ```

    Garbage is collected when the block begins, so the baseline holds only
    arrays something still uses.

    Attributes:
        device_baseline / device_peak / device_final: {device: bytes} when
            the block began, at its highest, when it ended.
        rss_baseline / rss_peak / rss_final: host RSS in bytes, the same way.
        samples: how many samples were taken.
    """

    def __init__(self, interval=0.002):
        self.interval = interval
        self.device_baseline = self.device_peak = self.device_final = {}
        self.rss_baseline = self.rss_peak = self.rss_final = 0
        self.samples = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def sample(self):
        devices, rss = device_bytes(), host_rss()
        with self._lock:
            self.samples += 1
            self.rss_peak = max(self.rss_peak, rss)
            peak = dict(self.device_peak)
            for device, size in devices.items():
                peak[device] = max(peak.get(device, 0), size)
            self.device_peak = peak
        return devices, rss

    def growth(self):
        """{device: peak - baseline bytes}: what the block added at its highest, per device."""
        return {d: size - self.device_baseline.get(d, 0) for d, size in self.device_peak.items()}

    def __enter__(self):
        gc.collect()  # arrays only garbage holds would otherwise be in the baseline, and could be freed inside
        self.device_baseline, self.rss_baseline = device_bytes(), host_rss()
        self.device_peak, self.rss_peak = dict(self.device_baseline), self.rss_baseline
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="kdist-peak-memory", daemon=True)
        self._thread.start()
        _ACTIVE.append(self)
        return self

    def __exit__(self, *exc):
        _ACTIVE.remove(self)
        self._stop.set()
        self._thread.join()
        self.device_final, self.rss_final = self.sample()
        return False

    def _run(self):
        while not self._stop.wait(self.interval):
            self.sample()
