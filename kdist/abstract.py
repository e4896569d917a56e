"""Building models without allocating their weights."""


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
    import keras

    with keras.StatelessScope(initialize_variables=False):
        return build(*args, **kwargs)
