"""Running Python snippets in a fresh interpreter, with a clean JAX/Keras environment."""

import os
import subprocess
import sys

_INHERITED = ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS", "KDIST_FAKE_DEVICES", "KERAS_BACKEND")
# The suite's XLA flags (tests/conftest.py sets them for this process): LLVM's optimisations took most of
# the suite's compile time, and every comparison a test makes compiles both of its sides alike.
SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0"


def clean_env():
    """This process's environment without its device and backend settings, with the suite's XLA flags."""
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env["XLA_FLAGS"] = SUITE_XLA_FLAGS
    return env


def compilation_cache_env(directory):
    """Variables giving a process JAX's persistent compilation cache in `directory`, for every program however
    small or quick to compile (a cache hit still emits the compile event `jax_internals.count_compiles` counts)."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(directory),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0",
    }


def run_python(code, env=None, timeout=240):
    clean = clean_env()
    clean["TF_CPP_MIN_LOG_LEVEL"] = "2"
    clean.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=timeout)
