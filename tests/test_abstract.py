import keras

import kdist


def test_abstract_model_allocates_nothing_and_stays_abstract():
    model = kdist.abstract_model(kdist.models.mnist_mlp)
    assert [tuple(v.shape) for v in model.trainable_variables] == [(784, 200), (200,), (200, 10), (10,)]
    assert all(v._value is None for v in model.variables)
    with keras.StatelessScope():  # on exit, Keras initializes the variables still pending
        pass
    assert all(v._value is None for v in model.variables)
