import keras

import kdist
from tests.helpers import float_scaled_model


def test_abstract_model_allocates_nothing_and_stays_abstract():
    model = kdist.abstract_model(kdist.models.mnist_mlp)
    assert [tuple(v.shape) for v in model.trainable_variables] == [(784, 200), (200,), (200, 10), (10,)]
    assert all(v._value is None for v in model.variables)
    with keras.StatelessScope():  # on exit, Keras initializes the variables still pending
        pass
    assert all(v._value is None for v in model.variables)


def test_a_weight_a_python_number_initializes_traces_while_abstract():
    model = kdist.abstract_model(float_scaled_model)
    assert tuple(model.compute_output_spec(keras.KerasTensor((2, 8))).shape) == (2, 16)
    assert all(v._value is None for v in model.variables)
