"""Random inputs and targets that fit a model: for sweeps and demos of models without a dataset."""

import keras
import numpy as np

from kdist.errors import ArgumentError
from kdist.keras_internals import output_layer


def random_data(model, samples, seed=0):
    """Random inputs and targets that fit a built single-output model, and a loss for them.

    Float inputs are uniform in [0, 1); integer inputs (token ids) are below
    the smallest `Embedding.input_dim` of the model. A last output dimension
    of 1 gets float targets and "mse"; otherwise integer class targets and
    sparse categorical cross-entropy (from logits unless the output layer
    applies a softmax). Works on a model built by `kdist.abstract_model`.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    (x, y), loss = random_data(model, samples=256)
    ```

    Returns:
        `((x, y), loss)`.
    """
    if len(model.outputs) != 1:
        raise ArgumentError(
            f"random_data() handles single-output models; {model.name!r} has {len(model.outputs)} outputs. "
            "Pass your own (x, y) and loss to kdist.sweep."
        )
    rng = np.random.default_rng(seed)
    vocabulary = min(
        (layer.input_dim for layer in model._flatten_layers() if isinstance(layer, keras.layers.Embedding)), default=2
    )
    inputs = [_random_input(rng, t, samples, vocabulary) for t in model.inputs]
    x = inputs[0] if len(inputs) == 1 else inputs
    output = model.outputs[0]
    shape = tuple(output.shape[1:])
    if shape[-1] == 1:
        return (x, rng.random((samples, *shape), dtype=np.float32)), "mse"
    y = rng.integers(0, shape[-1], size=(samples, *shape[:-1]))
    layer = output_layer(output)
    softmax = getattr(layer, "activation", None) is keras.activations.softmax
    return (x, y), keras.losses.SparseCategoricalCrossentropy(from_logits=not softmax)


def _random_input(rng, tensor, samples, vocabulary):
    shape = (samples, *tensor.shape[1:])
    if None in shape:
        raise ArgumentError(
            f"Input {tensor.name!r} has an unknown dimension {tuple(tensor.shape)}; random_data() needs fixed shapes."
        )
    if np.issubdtype(np.dtype(tensor.dtype), np.integer):
        return rng.integers(0, vocabulary, size=shape).astype(tensor.dtype)
    return rng.random(shape, dtype=np.float32).astype(tensor.dtype)
