import json

import keras
import numpy as np
import pytest

import kdist
from kdist import PlanError, SpecError
from kdist.abstract import dtype_policy_scope
from kdist.errors import SizeError
from kdist.meshes import meshes
from kdist.models import mnist_mlp, tiny_transformer
from kdist.planning import verify
from kdist.units import human_bytes, parse_size
from tests.helpers import float_scaled_model


def _tiny_llama():
    from kdist import zoo

    pytest.importorskip("keras_hub")
    return zoo.load_model("tiny-llama3")


FAMILIES = {
    "mlp": (lambda: kdist.abstract_model(mnist_mlp), dict(batch_size=64)),
    "tiny-transformer": (lambda: kdist.abstract_model(tiny_transformer), dict(batch_size=16)),
    "tiny-llama3": (_tiny_llama, dict(batch_size=8, sequence_length=16)),
}


@pytest.fixture(scope="module")
def plans():
    out = {}
    for name, (build, options) in FAMILIES.items():
        model = build()
        out[name] = (model, kdist.plan(model, 8, **options))
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
def test_weight_and_optimizer_bytes_equal_the_inspectors_for_every_candidate(plans, family):
    model, result = plans[family]
    assert len(result.candidates) == len(meshes(8)) == 10
    for c in result.candidates:
        report = kdist.inspect(model, kdist.preset(c.spec), optimizer="adam")
        weights = report.device_bytes("trainable") + report.device_bytes("non_trainable")
        assert c.weights == int(weights.max()), c.spec
        assert c.optimizer == int(report.device_bytes("optimizer").max()), c.spec
        assert c.gradients == int(report.device_bytes("trainable").max()), c.spec
        assert 0 < c.optimizer - 2 * c.gradients <= 16  # Adam: momentum and velocity per weight, and two scalars
        # The peak holds the state, and what the step keeps alive then: on several devices the weight-gradient
        # kernels wait for their reduction and make their gradients there, so a peak in the backward may hold none.
        assert c.peak == c.weights + c.optimizer + c.activations + c.transient + c.other
        assert 0 <= c.live_gradients <= c.gradients and c.transient >= c.live_gradients
        if family != "mlp":  # the MLP's peak is at the end of its backward pass, its activations already freed
            assert c.activations > 0


def test_every_mesh_of_n_devices():
    assert meshes(4, ("data", "model")) == [{"data": 4}, {"data": 2, "model": 2}, {"model": 4}]
    assert len(meshes(512)) == 55  # ordered factorisations of 2**9 into three sizes
    assert all(np.prod(list(m.values())) == 12 for m in meshes(12))


def test_sharding_lowers_the_state_and_ranking_is_ordered(plans):
    _, result = plans["tiny-transformer"]
    by_spec = {c.spec: c for c in result.candidates}
    assert by_spec["fsdp=8"].optimizer < by_spec["data=8"].optimizer / 4
    assert by_spec["data=8"].comm["data"]["collectives"][0]["kind"] == "all-reduce"
    assert {"fsdp"} == set(by_spec["fsdp=8"].comm)
    assert "model" in by_spec["data=2,model=4"].comm
    assert [c.rank for c in result.candidates] == list(range(1, 11))
    times = [c.step_seconds for c in result.candidates]
    assert times == sorted(times)  # by estimated step time
    assert result.recommendation is result.candidates[0]
    assert "communication" in result.reason
    data = json.loads(result.to_json())
    assert data["recommendation"] == result.recommendation.spec and len(data["candidates"]) == 10
    assert "★" in str(result)


def test_alpha_beta_cost_of_the_data_all_reduce(plans):
    _, result = plans["mlp"]
    c = result.candidate("data=8")
    grads = c.gradients
    # 4 variables of under 30 MiB in all: XLA's combiner makes them one all-reduce (one latency term)
    expected = 2 * 7 / 8 * grads / result.bandwidth + 2 * 7 * result.latency * 1
    assert c.comm["data"]["collectives"][0]["count"] == 4 and c.comm["data"]["collectives"][0]["launches"] == 1
    assert c.comm["data"]["bytes"] == grads
    assert c.comm["data"]["seconds"] == pytest.approx(expected)


def test_the_step_time_note_says_which_bandwidth_and_latency_the_communication_assumes(plans):
    model, default = plans["mlp"]
    assert any("communication at 100 GB/s per device and 0.01 ms per collective step" in n for n in default.notes)
    slower = kdist.plan(model, 8, batch_size=64, bandwidth="25GB/s", latency=2e-5)
    assert any("communication at 25 GB/s per device and 0.02 ms per collective step" in n for n in slower.notes)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("80GB", 80 * 10**9),
        ("80GiB", 80 * 2**30),
        ("8e10", 8 * 10**10),
        (" 1.5 kib", 1536),
        ("100GB/s", 10**11),
        (4096, 4096),
    ],
)
def test_memory_sizes(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["eighty", "80 GBs", "-1GB", "0", True])
def test_malformed_memory_sizes_are_rejected_clearly(text):
    with pytest.raises(SizeError, match="memory_per_device=.*(80GB|positive)"):
        parse_size(text, "memory_per_device")


def test_plan_rejects_a_malformed_memory_size(plans):
    model, _ = plans["mlp"]
    with pytest.raises(SizeError, match=r"memory_per_device='eighty' is not a size.*\"80GiB\""):
        kdist.plan(model, 8, batch_size=64, memory_per_device="eighty")


def test_bad_counts_name_the_argument(plans):
    model, _ = plans["mlp"]
    with pytest.raises(PlanError, match="devices must be a positive integer; received 0"):
        kdist.plan(model, 0, batch_size=64)
    with pytest.raises(PlanError, match="batch_size"):
        kdist.plan(model, 8, batch_size=-4)


def test_a_device_count_with_no_valid_mesh_gets_an_answer(plans):
    model, _ = plans["tiny-transformer"]
    result = kdist.plan(model, 7, batch_size=16)
    assert result.recommendation is None and result.candidates
    assert all(not c.valid for c in result.candidates)
    assert "No mesh of 7 devices is valid" in result.advice
    assert "does not divide by the 7 batch shards" in result.advice and "model=7" in result.advice
    with pytest.raises(PlanError, match="no recommendation"):
        result.preset()


def test_no_valid_mesh_suggests_the_smallest_batch_that_makes_one_valid(plans):
    """On 12 devices no weight of the MLP divides by a model axis of 3, 6 or 12, and batch 8 divides by none of the
    meshes' 3, 6 or 12 batch shards: batch 9 makes data=3,model=4 valid (12 was suggested before)."""
    model, _ = plans["mlp"]
    result = kdist.plan(model, 12, batch_size=8)
    assert result.recommendation is None and result.suggestions == {"batch_size": 9}
    assert "does not divide by the 3, 6 or 12 batch shards" in result.advice
    assert "batch_size=9, the smallest that makes a mesh valid (data=3,model=4)" in result.advice
    assert kdist.plan(model, 12, batch_size=9).candidate("data=3,model=4").valid


def test_batch_not_divisible_marks_those_candidates_invalid(plans):
    model, _ = plans["mlp"]
    result = kdist.plan(model, 8, batch_size=12)
    c = result.candidate("data=8")
    assert not c.valid and "batch size 12 does not divide by the 8 batch shards" in c.reason
    assert result.candidate("data=4,model=2").valid
    assert result.recommendation.valid


def test_a_budget_no_candidate_fits_says_what_would(plans):
    model, _ = plans["tiny-transformer"]
    result = kdist.plan(model, 8, batch_size=16, memory_per_device="6MB")  # the smallest mesh needs 5.8 MiB
    assert result.recommendation is None
    smallest = min(c.peak for c in result.candidates if c.valid)
    assert "No candidate fits" in result.advice
    assert f"{human_bytes(smallest)}" in result.advice
    assert "To fit:" in result.advice and "devices" in result.advice and "batch size of at most" in result.advice
    # The suggestions hold: a smaller batch fits on 8 devices, and the batch fits on more devices.
    batch, devices = result.suggestions["batch_size"], result.suggestions["devices"]
    assert f"batch size of at most {batch} on 8 devices" in result.advice and f"{devices} devices" in result.advice
    assert kdist.plan(model, 8, batch_size=batch, memory_per_device="6MB").recommendation is not None
    assert kdist.plan(model, devices, batch_size=16, memory_per_device="6MB").recommendation is not None


def test_a_budget_under_what_no_batch_or_mesh_shrinks_says_so_instead_of_suggesting_either(plans):
    """On a GPU the tiny transformer's smallest mesh peaks at a GEMM with its 4 MiB cuBLAS workspace: with the state,
    more than a 5 MB budget less its margin holds, whatever the batch or the device count."""
    model, _ = plans["tiny-transformer"]
    result = kdist.plan(model, 8, batch_size=16, memory_per_device="5MB")
    assert result.recommendation is None and not result.suggestions
    assert "Without activations it still needs" in result.advice and "4.00 MiB cuBLAS workspace" in result.advice
    assert "Use more devices or a smaller batch" not in result.advice


def test_auto_preset_uses_the_plans_recommendation(plans):
    model, result = plans["mlp"]
    dist = kdist.preset("auto", model=model, batch_size=64)
    assert isinstance(dist, kdist.ShardedDistribution)
    assert dist.spec == result.recommendation.spec
    assert dict(zip(dist.device_mesh.axis_names, dist.device_mesh.shape)) == result.recommendation.axes
    with pytest.raises(SpecError, match="needs the model and the batch size"):
        kdist.preset("auto", model=model)
    with pytest.raises(PlanError, match="No candidate fits"):
        kdist.preset("auto", model=model, batch_size=64, memory_per_device="10KB")


def test_verify_compiles_and_is_close_to_the_estimate():
    result = kdist.plan(mnist_mlp, 8, batch_size=64, verify=["data=8", "fsdp=2,model=4"])
    checked = [c for c in result.candidates if c.compiled]
    assert {c.spec for c in checked} == {"data=8", "fsdp=2,model=4"}
    for c in checked:
        figures = c.compiled
        assert figures["peak"] == figures["argument"] + figures["output"] - figures["alias"] + figures["temp"]
        # Donated state: the arguments hold at least the weights and the optimizer state.
        assert figures["argument"] >= c.weights + c.optimizer
        # The estimate is for a GPU (the default target); XLA:CPU's figure is a proxy that keeps a second
        # gradient copy around the all-reduce and fuses less, so it only brackets the estimate.
        assert figures["backend"] == "cpu"
        assert 0.7 <= c.ratio <= 1.4, (c.spec, c.peak, figures)
    assert any("CPU proxy" in note for note in result.notes)


def test_verify_with_remat_compiles_the_step_each_layer_recomputed_in():
    """With `remat=True` the compiled step recomputes each node's forward as the estimate does; keras-hub's decoders
    branch on `training`, which `keras.RematScope(mode="full")` would hand `jax.checkpoint` as a traced value. Until
    2026-12-04 verify compiled the step without remat, so `ratio` set a rematerialised estimate against a plain step."""
    plain, remat = (
        kdist.plan(_tiny_llama, 8, batch_size=16, sequence_length=16, remat=r, verify=["data=8"]).candidate("data=8")
        for r in (False, True)
    )
    # XLA's own count of the step's FLOPs grows by the recomputed forwards, as much as the estimate's does.
    assert plain.compiled["flops"] < remat.compiled["flops"]
    xla_growth, estimated_growth = remat.compiled["flops"] / plain.compiled["flops"], remat.flops / plain.flops
    assert abs(xla_growth - estimated_growth) < 0.05, (xla_growth, estimated_growth)


def _tiny_causal_lm():
    """keras-hub's Llama 3 causal LM (its backbone, a vocabulary-sized head), which compiles itself when built: Keras
    makes its Adam's step count and learning rate from values, which a stateless scope refuses."""
    keras_hub = pytest.importorskip("keras_hub")
    from kdist.zoo import TINY

    return keras_hub.models.Llama3CausalLM(keras_hub.models.Llama3Backbone(**TINY["llama3"]), preprocessor=None)


def test_a_keras_hub_task_that_compiles_itself_is_planned_and_verified():
    result = kdist.plan(_tiny_causal_lm, 8, batch_size=16, sequence_length=16, verify=["data=8"])
    checked = result.candidate("data=8")
    assert checked.compiled and 0.7 <= checked.ratio <= 1.4, (checked.peak, checked.compiled)
    assert checked.loss > 0  # the logits' gradient, at the peak


def _halving_model():
    """Token ids in, a strided convolution halving the sequence, logits out (as Whisper's encoder does)."""
    tokens = keras.Input((None,), dtype="int32")
    x = keras.layers.Embedding(64, 16)(tokens)
    x = keras.layers.Conv1D(16, 3, strides=2, padding="same")(x)
    return keras.Model(tokens, keras.layers.Dense(64)(x))


def test_verify_labels_each_output_at_its_own_length():
    result = kdist.plan(_halving_model, 8, batch_size=64, sequence_length=16, verify=["data=8"])
    checked = result.candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


class _FramesToBatch(keras.layers.Layer):
    """Folds frames into the batch and back, as VideoPrism's reshapes do: its output spec loses the batch size."""

    def call(self, x):
        return keras.ops.reshape(keras.ops.reshape(x, (-1, x.shape[-1])), (-1, *x.shape[1:]))

    def compute_output_shape(self, shape):
        return (None, *shape[1:])


def _frames_model():
    frames = keras.Input((4, 8))
    return keras.Model(frames, keras.layers.Dense(16)(_FramesToBatch()(keras.layers.Dense(8)(frames))))


def test_verify_labels_an_output_whose_spec_lost_its_batch_size():
    """The labels take the batch from the inputs (before, a label of batch None failed Keras's loss check)."""
    checked = kdist.plan(_frames_model, 8, batch_size=64, verify=["data=8"]).candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


class _LengthUnknown(keras.layers.Layer):
    """Passes its input through, its output spec without the sequence length (PARSeq's decoder)."""

    def call(self, x):
        return x

    def compute_output_shape(self, shape):
        return (shape[0], None, shape[-1])


def _length_unknown():
    tokens = keras.Input((None,), dtype="int32")
    return keras.Model(tokens, keras.layers.Dense(32)(_LengthUnknown()(keras.layers.Embedding(32, 8)(tokens))))


def test_verify_labels_an_output_whose_spec_lost_its_length_at_the_traced_length():
    result = kdist.plan(_length_unknown, 8, batch_size=64, sequence_length=16, verify=["data=8"])
    checked = result.candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


class _LastStage(keras.layers.Layer):
    """Keeps the last of its stages, its output spec keeping them all (SAM 3's presence logits: (None, 2, 1) in the
    spec, (batch, 1) computed)."""

    def call(self, x):
        return x[:, -1]

    def compute_output_shape(self, shape):
        return shape


def _last_stage():
    features = keras.Input((4,))
    return keras.Model(features, _LastStage()(keras.layers.Reshape((2, 1))(keras.layers.Dense(2)(features))))


def test_verify_labels_an_output_whose_spec_differs_from_what_its_layer_makes_at_the_traced_shape():
    checked = kdist.plan(_last_stage, 8, batch_size=64, verify=["data=8"]).candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


def _one_channel_map():
    """A depth or saliency map: one channel per pixel (keras-hub's DepthAnything, BASNet)."""
    images = keras.Input((8, 8, 3))
    return keras.Model(images, keras.layers.Conv2D(1, 3, padding="same")(keras.layers.Conv2D(4, 3)(images)))


def test_an_output_of_one_channel_is_planned_and_verified():
    """The surrogate loss's labels keep a class dimension of 1: Keras's loss squeezes them to the output's rank less
    one, where it squeezed the output to theirs and refused the pair (the planner could not trace such a step)."""
    result = kdist.plan(_one_channel_map, 8, batch_size=64, verify=["data=8"])
    checked = result.candidate("data=8")
    assert checked.activations > 0 and checked.compiled and checked.compiled["peak"] > 0


def test_verify_compiles_a_step_whose_weight_a_python_float_initializes():
    """Keras's abstract build of the compiled step reads such a weight from its initializer; `deferred()` makes
    that an array (it failed as a float before)."""
    checked = kdist.plan(float_scaled_model, 8, batch_size=64, verify=["data=8"]).candidate("data=8")
    assert checked.compiled and checked.compiled["peak"] > 0


def _regression(squeezed):
    inputs = keras.Input((64,))
    prediction = keras.layers.Dense(1)(keras.layers.Dense(256, activation="relu")(inputs))
    return keras.Model(inputs, prediction[:, 0] if squeezed else prediction)


def _with_argmax():
    inputs = keras.Input((64,))
    logits = keras.layers.Dense(16)(keras.layers.Dense(256, activation="relu")(inputs))
    return keras.Model(inputs, [logits, keras.ops.argmax(logits, axis=-1)])


def test_verify_compiles_a_rank_1_regression_output_and_an_integer_output_beside_a_float_one():
    """Keras's sparse cross-entropy refuses both (verify raised for them): a float output of rank 1 takes a mean
    squared error, and an integer output no loss, as the estimate's step has them."""
    squeezed, column, argmax = (
        kdist.plan(build, 8, batch_size=64, verify=["data=8"]).candidate("data=8")
        for build in (lambda: _regression(True), lambda: _regression(False), _with_argmax)
    )
    assert squeezed.compiled and column.compiled and argmax.compiled
    assert squeezed.peak == pytest.approx(column.peak, rel=1e-3)  # the labels differ by a few bytes
    assert squeezed.compiled["peak"] == pytest.approx(column.compiled["peak"], rel=0.02)


def test_a_step_keras_cannot_build_for_verify_is_a_plan_error_naming_the_mesh(monkeypatch):
    def refuse(model, batch):
        raise RuntimeError("Unable to automatically build the model.")

    monkeypatch.setattr(verify, "symbolic_build", refuse)
    assert kdist.plan(float_scaled_model, 8, batch_size=64).candidates  # the estimate itself is unaffected
    with pytest.raises(PlanError, match=r"verify could not build the training step of .* for data=8: RuntimeError"):
        kdist.plan(float_scaled_model, 8, batch_size=64, verify=["data=8"])


def test_dtype_counts_the_state_in_that_dtype(plans):
    model, result = plans["mlp"]
    half = kdist.plan(model, 8, batch_size=64, dtype="bfloat16")
    for c in result.candidates:
        h = half.candidate(c.spec)
        assert h.gradients * 2 == c.gradients and h.optimizer < c.optimizer
        assert 0 <= h.weights * 2 - c.weights <= 16  # the dropout seed (uint32) keeps its dtype
        assert h.activations + h.transient < c.activations + c.transient
        assert h.peak < c.peak


def test_mixture_of_experts_plans_an_expert_axis():
    from kdist import zoo

    pytest.importorskip("keras_hub")
    model = zoo.load_model("tiny-mixtral")
    result = kdist.plan(model, 8, batch_size=8, sequence_length=16)
    assert len(result.candidates) == len(meshes(8, ("data", "fsdp", "model", "expert"))) == 20
    assert any("expert" in note for note in result.notes)
    expert = [c for c in result.candidates if c.valid and "expert" in c.axes]
    assert expert and all("expert" in c.comm for c in expert)
    for c in expert[:2]:
        report = kdist.inspect(model, kdist.preset(c.spec), optimizer="adam")
        assert c.weights == int((report.device_bytes("trainable") + report.device_bytes("non_trainable")).max())
        assert c.optimizer == int(report.device_bytes("optimizer").max())
    # 4 experts cannot split over 8 devices.
    assert "no weight divides by expert=8" in result.candidate("expert=8").reason


def test_adafactors_factored_state_is_planned_as_the_inspector_lays_it_out():
    """Adafactor's factored moments, named after their weight, are one dimension short of its rule's layouts."""
    from kdist import zoo

    pytest.importorskip("keras_hub")
    model = zoo.load_model("tiny-gpt2")
    result = kdist.plan(model, 8, batch_size=8, sequence_length=16, optimizer="adafactor")
    for c in result.candidates:
        report = kdist.inspect(model, kdist.preset(c.spec), optimizer="adafactor")
        assert c.optimizer == int(report.device_bytes("optimizer").max()), c.spec
    factored = [v for v in report.variables if v.kind == "optimizer" and v.path.endswith("/embeddings")]
    assert factored and all("optimizer state of rank 1" in v.reason for v in factored)


def test_verify_compiles_a_mixed_float16_step_with_keras_loss_scaling():
    # Keras's compile() wraps the optimizer of a mixed_float16 model in a LossScaleOptimizer, whose variables it
    # makes at once: verify builds it outside the deferred scope, and the compiled step holds its scalars.
    def mlp():
        inputs = keras.Input((784,))
        return keras.Model(inputs, keras.layers.Dense(10)(keras.layers.Dense(256, activation="relu")(inputs)))

    arguments = {}
    for policy in ("mixed_bfloat16", "mixed_float16"):
        with dtype_policy_scope(policy):
            result = kdist.plan(mlp, 8, batch_size=64, verify=["data=8"])
        arguments[policy] = result.candidate("data=8").compiled["argument"]
    assert 0 < arguments["mixed_float16"] - arguments["mixed_bfloat16"] <= 64
