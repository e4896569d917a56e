import keras
import pytest

import kdist
from kdist.abstract import dtype_policy_scope
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


def test_a_variable_made_from_a_value_is_abstract_too():
    """keras-hub's tasks compile themselves when built: Keras makes the optimizer's step count and learning rate from
    values, which Keras's stateless scope refuses. Under `abstract_model` they are deferred like the weights."""
    keras_hub = pytest.importorskip("keras_hub")
    from kdist.zoo import TINY

    def build():
        return keras_hub.models.Llama3CausalLM(keras_hub.models.Llama3Backbone(**TINY["llama3"]), preprocessor=None)

    model = kdist.abstract_model(build)
    assert all(v._value is None for v in model.variables)
    assert model.optimizer.iterations._value is None and tuple(model.optimizer.iterations.shape) == ()
    assert "__init__" not in vars(keras.Variable)  # Keras's own again after the block
    assert keras.Variable(3.0).numpy() == 3.0


def test_a_model_built_in_a_dtype_policy_scope_takes_it_and_the_previous_policy_comes_back_after_an_error():
    before = keras.config.dtype_policy().name
    with dtype_policy_scope("mixed_bfloat16"):
        model = kdist.abstract_model(kdist.models.mnist_mlp)
    assert model.get_layer("d1").compute_dtype == "bfloat16" and keras.config.dtype_policy().name == before
    with pytest.raises(RuntimeError), dtype_policy_scope("bfloat16"):
        raise RuntimeError("building failed")
    assert keras.config.dtype_policy().name == before
    with dtype_policy_scope(None):  # None: the policy in force
        assert keras.config.dtype_policy().name == before
