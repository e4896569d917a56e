import keras

import kdist


def test_abstract_model_allocates_nothing_and_stays_abstract():
    model = kdist.abstract_model(kdist.models.mnist_mlp)
    assert [tuple(v.shape) for v in model.trainable_variables] == [(784, 200), (200,), (200, 10), (10,)]
    assert all(v._value is None for v in model.variables)
    with keras.StatelessScope():  # on exit, Keras initializes the variables still pending
        pass
    assert all(v._value is None for v in model.variables)


class _Scaled(keras.layers.Layer):
    """A layer whose weight's initializer returns a Python number, as keras-hub's CLIPHead's does."""

    def build(self, input_shape):
        self.scale = self.add_weight(shape=(), initializer=lambda *args, **kwargs: 0.5, name="scale")

    def call(self, x):
        return x * keras.ops.exp(self.scale)


def _scaled_model():
    inputs = keras.Input((4,))
    return keras.Model(inputs, keras.layers.Dense(3)(_Scaled()(inputs)))


def test_a_weight_a_python_number_initializes_traces_while_abstract():
    model = kdist.abstract_model(_scaled_model)
    assert tuple(model.compute_output_spec(keras.KerasTensor((2, 4))).shape) == (2, 3)
    assert all(v._value is None for v in model.variables)
