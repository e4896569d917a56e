"""Building models: without allocating their weights, and under a dtype policy."""

import contextlib

import keras

from kdist.checks import shown
from kdist.errors import ArgumentTypeError
from kdist.keras_internals import deferred


def abstract_model(build, *args, **kwargs):
    """Call `build(*args, **kwargs)` with variable creation deferred: no weights are allocated.

    The variables have path, shape and dtype, but no value, so linting,
    inspecting and planning a 405B-parameter model runs on a laptop.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer, hidden_dim=128)
    kdist.inspect(model, distribution=kdist.preset("2x4"))
    ```
    """
    if not callable(build):
        raise ArgumentTypeError(
            f"abstract_model needs a function that builds a model; received {type(build).__name__} {shown(build)}."
        )
    with deferred():
        return build(*args, **kwargs)


@contextlib.contextmanager
def dtype_policy_scope(policy):
    """Keras's global dtype policy set to `policy` (a name or `keras.DTypePolicy`; None: left as it is) inside the
    block and the previous one restored after it, also when the block raises: a model built inside takes `policy`."""
    previous = keras.config.dtype_policy()
    if policy is not None:
        keras.config.set_dtype_policy(policy)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)
