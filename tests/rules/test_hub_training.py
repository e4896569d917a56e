"""A training step of tiny keras-hub models under the 2x4 preset matches one device."""

import contextlib

import jax
import keras
import numpy as np
import pytest

import kdist
from kdist.zoo import tiny_entries

keras_hub = pytest.importorskip("keras_hub")

TINY = tiny_entries()
# Both runs compile the same way; skipping XLA's expensive CPU passes halves the compile time.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}
RNG = np.random.default_rng(0)
IDS = RNG.integers(0, 256, (2, 9)).astype("int32")
TOKENS = {"token_ids": IDS[:, :-1], "padding_mask": np.ones((2, 8), "int32")}


def next_token_loss(logits):
    return keras.ops.mean(keras.ops.sparse_categorical_crossentropy(IDS[:, 1:], logits, from_logits=True))


def regression_loss(outputs):
    outputs = outputs["sequence_output"] if isinstance(outputs, dict) else outputs
    target = np.random.default_rng(1).standard_normal(outputs.shape).astype("float32")
    return keras.ops.mean(keras.ops.square(outputs - target))


def causal_lm(family, task):
    return lambda: getattr(keras_hub.models, task)(backbone=TINY[family](num_layers=1), preprocessor=None)


CASES = {
    "decoder LM (Llama)": (causal_lm("llama", "LlamaCausalLM"), TOKENS, next_token_loss),
    "MoE (Mixtral)": (causal_lm("mixtral", "MixtralCausalLM"), TOKENS, next_token_loss),
    "encoder (BERT)": (
        lambda: TINY["bert"](num_layers=1),
        dict(TOKENS, segment_ids=np.zeros((2, 8), "int32")),
        regression_loss,
    ),
    "vision (ViT)": (lambda: TINY["vit"](num_layers=1), RNG.random((2, 32, 32, 3)).astype("float32"), regression_loss),
}


def loss_and_grads(model, inputs, loss_fn):
    """One training step's loss and gradients, computed statelessly."""
    trainable = [v.value for v in model.trainable_variables]
    non_trainable = [v.value for v in model.non_trainable_variables]

    def loss(values):
        outputs, _ = model.stateless_call(values, non_trainable, inputs, training=False)
        return loss_fn(outputs)

    step = jax.jit(jax.value_and_grad(loss)).lower(trainable).compile(compiler_options=FAST_COMPILE)
    value, grads = step(trainable)
    return float(value), [np.asarray(g) for g in grads]


@pytest.mark.parametrize("case", list(CASES))
def test_training_step_under_2x4_matches_one_device(case):
    build, inputs, loss_fn = CASES[case]
    keras.utils.set_random_seed(0)
    reference = build()
    expected_loss, expected_grads = loss_and_grads(reference, inputs, loss_fn)

    keras.distribution.set_distribution(kdist.preset("2x4"))  # rules="auto": no family named
    model = build()
    model.set_weights(reference.get_weights())
    sharded = [v.path for v in model.weights if "model" in tuple(v.value.sharding.spec)]
    assert len(sharded) >= 6, sharded
    loss, grads = loss_and_grads(model, inputs, loss_fn)

    np.testing.assert_allclose(loss, expected_loss, rtol=1e-5)
    scale = max(float(np.abs(g).max()) for g in expected_grads)
    worst = max(float(np.abs(a - b).max()) for a, b in zip(grads, expected_grads))
    assert worst <= 1e-4 * scale, f"gradients differ by {worst} (largest gradient {scale})"


def test_llama_backbone_is_sharded_by_the_llama_rules_without_naming_them():
    keras.distribution.set_distribution(kdist.preset("2x4"))
    model = causal_lm("llama", "LlamaCausalLM")()
    specs = {v.path: tuple(v.value.sharding.spec) for v in model.weights}
    assert specs["transformer_layer_0/self_attention/query/kernel"] == (None, "model", None)
    assert specs["transformer_layer_0/self_attention/key/kernel"] == (None, None, "model")  # 2 kv heads: head_dim
    assert specs["transformer_layer_0/feedforward_output_dense/kernel"] == ("model", None)
    assert specs["token_embedding/reverse_embeddings"] == (None, "model")
    placement = keras.distribution.distribution().placements["transformer_layer_0/self_attention/query/kernel"]
    assert "llama" in placement.rule.families and placement.source == "rule"


def test_adafactors_factored_state_under_2x4_trains_like_one_device():
    """Adafactor names its factored moments after their weight, one dimension short of the rules' layouts."""
    inputs, labels = TOKENS, IDS[:, 1:] % 4

    def fit(distribution):
        keras.utils.set_random_seed(0)
        with distribution.scope() if distribution else contextlib.nullcontext():
            backbone = TINY["gpt2"](num_layers=1)
            model = keras.Model(backbone.input, keras.layers.Dense(4)(backbone.output))
            model.compile(optimizer=keras.optimizers.Adafactor(), loss="sparse_categorical_crossentropy")
            losses = model.fit(inputs, labels, batch_size=2, epochs=2, verbose=0).history["loss"]
        return losses, model

    expected, _ = fit(None)
    distribution = kdist.preset("2x4")
    losses, model = fit(distribution)
    np.testing.assert_allclose(losses, expected, rtol=1e-5)
    factored = distribution.placements[f"{model.optimizer.name}/embeddings"]
    assert factored.axes == (None,) and "optimizer state of rank 1" in factored.reason
    assert any("model" in tuple(v.value.sharding.spec) for v in model.optimizer.variables)  # slots follow weights
