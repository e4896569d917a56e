"""Building models without allocating their weights."""

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
