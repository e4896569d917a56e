"""Every use of Keras's private API in kdist, in one place.

Checked against keras 3.15.1 (the version in constraints.txt). Each function
says what it reaches into; when Keras changes, this is the module to mend.
Everything else in kdist uses Keras's public API only.
"""

import contextlib
import re
import sys

import jax
import keras
from keras.src.backend.common import global_state
from keras.src.backend.common.keras_tensor import KerasTensor  # noqa: F401  (re-exported for the activation trace)
from keras.src.backend.jax import distribution_lib as jax_distribution_lib
from keras.src.backend.jax import nn as backend_nn
from keras.src.models.functional import operation_fn  # noqa: F401  (re-exported for the activation trace)
from keras.src.saving import saving_lib
from keras.src.utils import io_utils

# --- Variables without values ------------------------------------------------------------------


@contextlib.contextmanager
def deferred():
    """Create variables without values, and keep them abstract.

    Like `keras.StatelessScope(initialize_variables=False)`, but the variables
    created inside are taken off Keras's initialise-later list (the global
    attribute "uninitialized_variables"), so a later top-level
    `StatelessScope` (Keras opens them while training) does not allocate
    them behind your back. Yields a list that holds those variables once the block ends.
    """
    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(pending)
    created = []  # yielded: the variables made inside, filled in when the block ends
    try:
        with keras.StatelessScope(initialize_variables=False):
            yield created
    finally:
        pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
        created.extend(pending[before:])
        del pending[before:]


def array_of(variable):
    """The jax array behind a variable, or None. Reads `_value`, never `.value`: on an abstract
    variable Keras would run the initializer and allocate it."""
    value = getattr(variable, "_value", variable)
    return value if isinstance(value, jax.Array) and not value.is_deleted() else None


def is_live(variable):
    """Whether a variable holds an array (False for variables made under `deferred()`)."""
    return array_of(variable) is not None


def own_layout(variable):
    """The layout a variable carries itself (`_layout`, set by Keras or by `kdist.reshard`), or None."""
    return getattr(variable, "_layout", None)


def set_array(variable, layout, value):
    """Give `variable` a new array and layout without a copy (`_layout`, `_direct_assign`)."""
    variable._layout = layout
    variable._direct_assign(value)


def set_path(variable, path):
    """Give a variable made outside its layer the path of one made inside (`_path`)."""
    variable._path = path


# --- Models -------------------------------------------------------------------------------------


def functional(model):
    """The functional graph of a model: the model itself, or a Sequential's inner one (`_functional`)."""
    return getattr(model, "_functional", None) or model


def input_struct(model):
    """The model's symbolic inputs, as the structure the model was built with (`_inputs_struct`), or None."""
    return getattr(functional(model), "_inputs_struct", None)


def output_struct(model):
    """The model's symbolic outputs (`_outputs_struct`), or None for a model without a layer graph."""
    return getattr(functional(model), "_outputs_struct", None)


def nodes_by_depth(model):
    """The functional graph's nodes by depth (`_nodes_by_depth`), or None."""
    return getattr(functional(model), "_nodes_by_depth", None) or None


def layers(model):
    """Every sublayer of `model`, recursively (`_flatten_layers`)."""
    flatten = getattr(model, "_flatten_layers", None)
    return list(flatten(include_self=False)) if flatten is not None else []


def output_layer(tensor):
    """The layer that made a symbolic tensor (`_keras_history`)."""
    return tensor._keras_history.operation


def symbolic_build(model, batch):
    """What `fit` does first: build the model, its optimizer and metrics from a batch (`_symbolic_build`)."""
    model._symbolic_build(data_batch=batch)


def forget_compiled_functions(model):
    """Drop a model's jitted train/test/predict steps, so the next call retraces with new shardings."""
    for name in ("train_function", "test_function", "predict_function"):
        if hasattr(model, name):
            setattr(model, name, None)
    if hasattr(model, "_eval_epoch_iterator"):
        model._eval_epoch_iterator = None


def layout_map_of(distribution):
    """The LayoutMap of a `keras.distribution.ModelParallel` (`_layout_map`)."""
    return distribution._layout_map


def print_msg(message):
    """Print as Keras's callbacks do (to stdout, or to absl logging when Keras is set to)."""
    io_utils.print_msg(message)


# --- Optimizers ---------------------------------------------------------------------------------

_SUFFIX = re.compile(r"_\d+$")


def new_optimizer(optimizer):
    """A fresh, unbuilt Keras optimizer like `optimizer` (a name, config dict or instance, never built itself)."""
    if isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer.__class__.from_config(optimizer.get_config())
    made = keras.optimizers.get(optimizer)
    # Keras names a second "adam" "adam_1"; plan under the name a fresh session would use.
    return made.__class__.from_config({**made.get_config(), "name": _SUFFIX.sub("", made.name)})


def plan_optimizer(optimizer, trainable):
    """Build `optimizer` with its variables deferred (nothing allocated) and record each slot's reference.

    Only `add_variable` runs deferred: a placeholder an optimizer builds from
    a value (Adafactor's scalars for rank-1 variables) is created as usual.
    Returns `(variables, {id(slot): reference variable})`.
    """
    slots = {}
    add_variable = optimizer.add_variable
    add_from_reference = optimizer.add_variable_from_reference

    def deferred_variable(*args, **kwargs):
        with keras.StatelessScope(initialize_variables=False):
            return add_variable(*args, **kwargs)

    def recording(reference_variable, *args, **kwargs):
        slot = add_from_reference(reference_variable, *args, **kwargs)
        slots[id(slot)] = reference_variable
        return slot

    optimizer.add_variable = deferred_variable
    optimizer.add_variable_from_reference = recording
    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(pending)
    try:
        optimizer.build(trainable)
    finally:
        del optimizer.add_variable, optimizer.add_variable_from_reference
        del pending[before:]  # so that no later scope exit allocates the planned state
    return list(optimizer.variables), slots


def slot_references(optimizer_variables, weights):
    """{id(slot): reference weight} for a built optimizer's slots, by Keras's slot naming.

    `add_variable_from_reference` names a slot "<reference path with / as _>_<slot name>";
    the longest such prefix among weights of the same shape is the reference.
    """
    by_key = {}
    for w in weights:
        by_key.setdefault(w.path.replace("/", "_"), []).append(w)
    out = {}
    for v in optimizer_variables:
        name = v.name
        cut = len(name)
        while (cut := name.rfind("_", 0, cut)) > 0:
            reference = next((w for w in by_key.get(name[:cut], ()) if tuple(w.shape) == tuple(v.shape)), None)
            if reference is not None:
                out[id(v)] = reference
                break
    return out


# --- Attention: the platform decision, answered for a planning target ------------------------------


@contextlib.contextmanager
def attention_decision(keras_attention, fused, platform):
    """Answer Keras's and keras-hub's attention platform probes for `platform`, not the host, inside the block.

    Replaces the JAX backend's `dot_product_attention` (`keras.src.backend.jax.nn`,
    which `keras.ops.dot_product_attention` calls) with
    `keras_attention(original, query, key, value, **kwargs)`, its flash check
    `_can_use_flash_attention` with one answering `fused`, and keras-hub's `running_on_gpu` / `running_on_tpu` /
    `gpu_supports_fused_attention_op` (imported by name into each attention
    module, so patched in every loaded `keras_hub` module) with answers for
    `platform` ("gpu", "tpu" or "cpu"). Checked against keras 3.15.1 and
    keras-hub 0.32.0.
    """
    saved = []

    def patch(owner, name, value):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, value)

    original = backend_nn.dot_product_attention

    def attention(query, key, value, **kwargs):
        return keras_attention(original, query, key, value, **kwargs)

    try:
        patch(backend_nn, "dot_product_attention", attention)
        patch(backend_nn, "_can_use_flash_attention", lambda *args, **kwargs: fused)
        for module in list(sys.modules.values()):
            if not (getattr(module, "__name__", "") or "").startswith("keras_hub"):
                continue
            for name, answer in (
                ("running_on_gpu", platform == "gpu"),
                ("running_on_tpu", platform == "tpu"),
                ("gpu_supports_fused_attention_op", True),
            ):
                if callable(getattr(module, name, None)):
                    patch(module, name, lambda answer=answer: answer)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


# --- Variable arrays ------------------------------------------------------------------------------


def commit_arrays_to(layout_type):
    """Commit every uncommitted array Keras lays out on a `layout_type` layout to that layout.

    Keras's `backend.jax.distribution_lib.distribute_tensor`, which every
    variable value goes through (initial values, `assign`, metrics'
    `reset_state`), keeps an array whose sharding is equivalent to the
    layout; on a one-device mesh every array of that device is, committed or
    not. jit keys its caches on committedness (an uncommitted argument has
    no sharding, a committed one its own), and under a distribution Keras's
    train/test/predict steps return committed arrays (their out_shardings).
    So state Keras makes uncommitted (initializers, `reset_metrics`' zeros,
    numpy values from `load_weights` or a checkpoint) beside state a step
    returned makes jit trace and compile the step again. This wraps
    `distribute_tensor` so that such arrays are committed to the layout (same
    device: no copy); once. On a mesh of several devices nothing changes:
    an uncommitted array is never equivalent to such a layout, and Keras
    puts it on the layout itself. Checked against keras 3.15.1 and jax 0.10.2.
    """
    original = jax_distribution_lib.distribute_tensor
    if getattr(original, "_kdist_commit", None) is not None:
        return

    def distribute_tensor(tensor, layout):
        if (
            isinstance(layout, layout_type)
            and isinstance(tensor, jax.Array)
            and not isinstance(tensor, jax.core.Tracer)
            and not tensor.committed
        ):
            return jax.device_put(tensor, layout.backend_layout)
        return original(tensor, layout)

    distribute_tensor._kdist_commit = layout_type
    jax_distribution_lib.distribute_tensor = distribute_tensor


# --- Input batches --------------------------------------------------------------------------------


def check_batches_with(check):
    """Call `check(per_process_batch)` before Keras lays out each input batch on the mesh.

    Keras computes a batch's layout once per epoch, from the first batch, and
    hands every later one (a smaller last batch included) straight to jax, so
    a distribution cannot see them. This wraps Keras's
    `backend.jax.distribution_lib.distribute_data_input`, which every batch of
    fit/evaluate/predict (and keras-hub's generate) goes through; once.
    """
    original = jax_distribution_lib.distribute_data_input
    if getattr(original, "_kdist_check", None) is not None:
        return

    def distribute_data_input(per_process_batch, layout, batch_dim_name):
        check(per_process_batch)
        return original(per_process_batch, layout, batch_dim_name)

    distribute_data_input._kdist_check = check
    jax_distribution_lib.distribute_data_input = distribute_data_input


# --- Loading weights into their shards --------------------------------------------------------------


@contextlib.contextmanager
def intercepted_weight_loads(wrap_dataset, stage):
    """Inside the block, Keras's weight loading hands each HDF5 dataset to `stage` instead of reading it.

    Keras's `load_weights` (and keras-hub's `from_preset`, which calls it)
    walks the model and, per layer, calls `variable.assign(store[str(i)])`,
    where `saving.saving_lib.H5IOStore.__getitem__` reads the whole dataset
    into host memory. Here `__getitem__` returns `wrap_dataset(dataset, dtype)`
    (the h5py dataset, after Keras's own safety checks, and "bfloat16" when
    Keras stored it as such, else None) without reading it, and
    `keras.Variable.assign(variable, value)` calls `stage(variable, value)`;
    when it returns False, the real `assign` runs. Checked against keras 3.15.1.
    """
    store = saving_lib.H5IOStore
    variable_class = keras.Variable
    had_own_assign = "assign" in vars(variable_class)
    original_assign = variable_class.assign
    original_getitem = store.__getitem__

    def getitem(self, key):
        dataset = saving_lib.safe_get_h5_dataset(self._h5_entry_group, key)
        dtype = "bfloat16" if dataset.attrs.get("dtype") == "bfloat16" else None
        return wrap_dataset(dataset, dtype)

    def assign(variable, value):
        if stage(variable, value):
            return value
        return original_assign(variable, value)

    store.__getitem__ = getitem
    variable_class.assign = assign
    try:
        yield
    finally:
        store.__getitem__ = original_getitem
        if had_own_assign:
            variable_class.assign = original_assign
        else:
            del variable_class.assign


@contextlib.contextmanager
def deferred_values_too():
    """`deferred()`, where a variable made from a value (an optimizer's iteration count, its learning rate) is
    deferred too, its value kept as its initializer, instead of Keras's error for values in a stateless scope.

    Wraps `keras.Variable.__init__` inside the block. Checked against keras 3.15.1.
    """
    variable_class = keras.Variable
    had_own_init = "__init__" in vars(variable_class)
    original_init = variable_class.__init__

    def init(self, initializer, shape=None, dtype=None, *args, **kwargs):
        if keras.backend.is_keras_tensor(initializer) or callable(initializer) or isinstance(initializer, str):
            return original_init(self, initializer, shape, dtype, *args, **kwargs)
        value = keras.ops.convert_to_tensor(initializer, dtype=dtype)

        def constant(shape, dtype=None):
            return value if dtype is None else keras.ops.cast(value, dtype)

        return original_init(self, constant, tuple(value.shape), dtype or value.dtype, *args, **kwargs)

    variable_class.__init__ = init
    try:
        with deferred() as created:
            yield created
    finally:
        if had_own_init:
            variable_class.__init__ = original_init
        else:
            del variable_class.__init__


def is_deferred(variable):
    """Whether a variable was made under `deferred()` and has no value yet (`_value`, `_initializer`)."""
    return getattr(variable, "_value", None) is None and getattr(variable, "_initializer", None) is not None


def materialize(variable, layout, value):
    """Give a deferred (or live) variable its array and layout; a deferred one forgets its initializer."""
    variable._initializer = None
    set_array(variable, layout, value)


def initialize_deferred(variable):
    """Run a deferred variable's initializer now, under the current distribution (`_deferred_initialize`)."""
    variable._deferred_initialize()
