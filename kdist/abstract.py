"""Building models without allocating their weights."""

import contextlib

from keras.src.backend.common import global_state


@contextlib.contextmanager
def deferred():
    """Create variables without values, and keep them abstract.

    Like `keras.StatelessScope(initialize_variables=False)`, but the variables
    created inside are taken off Keras's initialise-later list, so a later
    top-level `StatelessScope` (Keras opens them while training) does not
    allocate them behind your back.
    """
    import keras

    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(pending)
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield
    finally:
        pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
        del pending[before:]


def abstract_model(build, *args, **kwargs):
    """Call `build(*args, **kwargs)` with variable creation deferred: no weights are allocated.

    The variables have path, shape and dtype, but no value, so linting,
    inspecting and planning a 70B-parameter model runs on a laptop.

    Example:

    ```python
    model = kdist.abstract_model(keras_hub.models.LlamaBackbone, vocabulary_size=128256, ...)
    kdist.inspect(model, distribution=kdist.preset("2x4"))
    ```
    """
    with deferred():
        return build(*args, **kwargs)
