"""Building models without allocating their weights."""

from keras.src.backend.common import global_state


def abstract_model(build, *args, **kwargs):
    """Call `build(*args, **kwargs)` with variable creation deferred: no weights are allocated.

    The variables have path, shape and dtype, but no value, so linting,
    inspecting and planning a 70B-parameter model runs on a laptop. They stay
    abstract: unlike a bare `keras.StatelessScope(initialize_variables=False)`,
    a later top-level `StatelessScope` (Keras opens them while training) does
    not initialize them behind your back.

    Example:

    ```python
    model = kdist.abstract_model(keras_hub.models.LlamaBackbone, vocabulary_size=128256, ...)
    kdist.inspect(model, distribution=kdist.preset("2x4"))
    ```
    """
    import keras

    pending = list(global_state.get_global_attribute("uninitialized_variables", []))
    try:
        with keras.StatelessScope(initialize_variables=False):
            return build(*args, **kwargs)
    finally:
        global_state.set_global_attribute("uninitialized_variables", pending)
