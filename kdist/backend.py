"""Selects the JAX backend for Keras before Keras is first imported."""

import os
import sys

from kdist.errors import BackendError


def require_jax_backend():
    """Make sure Keras runs on JAX, setting `KERAS_BACKEND=jax` if Keras is not loaded yet.

    Raises:
        BackendError: Keras was already imported with another backend, or
            `KERAS_BACKEND` names another backend.
    """
    requested = os.environ.get("KERAS_BACKEND")
    if "keras" in sys.modules:
        import keras  # already loaded: importing it at the top would load it before its backend is chosen

        backend = keras.backend.backend()
        if backend != "jax":
            raise BackendError(
                f"Keras was already imported with the {backend!r} backend, but "
                "kdist needs 'jax'. Import kdist before keras, or set "
                "KERAS_BACKEND=jax before Python starts."
            )
        return
    if requested not in (None, "", "jax"):
        raise BackendError(
            f"KERAS_BACKEND={requested!r}, but kdist needs 'jax' (only the JAX "
            "backend implements keras.distribution model parallelism). Unset "
            "KERAS_BACKEND or set KERAS_BACKEND=jax."
        )
    os.environ["KERAS_BACKEND"] = "jax"
