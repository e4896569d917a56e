"""Running Python snippets in a fresh interpreter, with a clean JAX/Keras environment."""

import os
import subprocess
import sys

_INHERITED = ("JAX_NUM_CPU_DEVICES", "XLA_FLAGS", "JAX_PLATFORMS", "KDIST_FAKE_DEVICES", "KERAS_BACKEND")


def run_python(code, env=None, timeout=240):
    clean = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    clean["TF_CPP_MIN_LOG_LEVEL"] = "2"
    clean.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=clean, timeout=timeout)
