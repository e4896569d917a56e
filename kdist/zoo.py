"""Models the CLI can name: built-in zoo entries or "module:function"."""

import importlib

from kdist import models

# name -> (build function, description)
ENTRIES = {
    "mlp": (models.mnist_mlp, "the Keras distribution guide's MNIST-sized MLP"),
    "cnn": (models.small_cnn, "a small CNN for 28x28x1 images"),
    "tiny-transformer": (models.tiny_transformer, "a tiny decoder LM of Keras core layers"),
}


def register(name, build, description):
    """Add a zoo entry: `build()` returns a Keras model."""
    ENTRIES[name] = (build, description)


def load_model(name, *, abstract=True):
    """Build the model `name` names: a zoo entry or "module:function".

    With `abstract=True` (the default) the model is built without allocating
    weights (see `kdist.abstract_model`).
    """
    from kdist.abstract import abstract_model

    build = _builder(name)
    return abstract_model(build) if abstract else build()


def _builder(name):
    if name in ENTRIES:
        return ENTRIES[name][0]
    if ":" in name:
        module_name, _, function_name = name.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise ValueError(f"Cannot import module {module_name!r} of model {name!r}: {e}.") from None
        build = getattr(module, function_name, None)
        if not callable(build):
            raise ValueError(f"Module {module_name!r} has no function {function_name!r} (model {name!r}).")
        return build
    raise ValueError(
        f"Unknown model {name!r}. Name a zoo entry ({', '.join(sorted(ENTRIES))}) or "
        "'module:function' returning a Keras model."
    )
