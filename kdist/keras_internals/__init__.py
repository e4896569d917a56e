"""Every use of Keras's private API in kdist, in one place.

Checked against keras 3.15.1 (`CHECKED`, the version in constraints.txt). Each
function says what it reaches into, and `NEEDED` lists the private attributes,
checked when kdist is imported: a Keras without one raises `VersionError`
naming it. When Keras changes, this is the module to mend.
Everything else in kdist uses Keras's public API only; `loading.py` beside
this file holds the internals that only `kdist.load` reaches, `attention.py`
those the planner's attention trace reaches, `optimizers.py` those of optimizers.
"""

import contextlib
import functools
import sys

import jax
import keras

from kdist.checks import missing_attributes
from kdist.errors import VersionError

CHECKED = "3.15.1"


def missing_module(error):
    """The `VersionError` for a Keras internal module that failed to import (`error`, an ImportError)."""
    return VersionError(
        f"kdist uses Keras's internal module {error.name or error}, which keras {keras.__version__} lacks; kdist was "
        f"checked against keras {CHECKED}: pip install keras=={CHECKED}."
    )


try:
    from keras.src.backend.common import global_state
    from keras.src.backend.common.keras_tensor import KerasTensor  # noqa: F401  (re-exported for the activation trace)
    from keras.src.backend.jax import distribution_lib as jax_distribution_lib
    from keras.src.backend.jax.trainer import JAXTrainer
    from keras.src.models.functional import operation_fn  # noqa: F401  (re-exported for the activation trace)
    from keras.src.utils import io_utils, module_utils
except ImportError as e:
    raise missing_module(e) from e

# The private attributes kdist reaches, checked at import so a Keras that moved one fails here, by name.
NEEDED = {
    "keras.src.backend.common.global_state": (global_state, ("get_global_attribute",)),
    "keras.src.backend.jax.distribution_lib": (
        jax_distribution_lib,
        ("distribute_tensor", "distribute_data_input", "initialize_rng"),
    ),
    "keras.src.utils.io_utils": (io_utils, ("print_msg",)),
    "keras.src.utils.module_utils.tensorflow": (module_utils.tensorflow, ("_available",)),
    "keras.src.backend.jax.trainer.JAXTrainer": (JAXTrainer, ("make_predict_function",)),
    "keras.Model": (keras.Model, ("_symbolic_build",)),
    "keras.Variable": (keras.Variable, ("_direct_assign",)),
}


def check_internals(needed=NEEDED):
    """Raise `VersionError` naming each private attribute in `needed` that this Keras lacks."""
    missing = missing_attributes(needed)
    if missing:
        raise VersionError(
            f"keras {keras.__version__} lacks {', '.join(missing)}, which kdist uses; kdist was checked against "
            f"keras {CHECKED}: pip install keras=={CHECKED}."
        )


check_internals()

# --- Variables without values ------------------------------------------------------------------


@contextlib.contextmanager
def deferred():
    """Create variables without values, and keep them abstract.

    Like `keras.StatelessScope(initialize_variables=False)`, but the variables
    created inside are taken off Keras's initialise-later list (the global
    attribute "uninitialized_variables"), so a later top-level
    `StatelessScope` (Keras opens them while training) does not allocate
    them behind your back. Yields a list that holds those variables once the block ends.
    Tracing reads such a variable from its initializer, made to return an array (`_Registered`).
    A variable made from a value (an optimizer's iteration count and learning rate: keras-hub's tasks compile
    themselves when built) is deferred too, its value kept as its initializer, where Keras's stateless scope
    raises; `keras.Variable.__init__` is wrapped inside the block for that.
    """
    outer = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(outer)
    created = []  # yielded: the variables made inside, filled in when the block ends
    global_state.set_global_attribute("uninitialized_variables", _Registered(outer))
    try:
        with keras.StatelessScope(initialize_variables=False), _values_as_initializers():
            yield created
    finally:
        pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
        created.extend(pending[before:])
        outer[:] = pending[:before]
        global_state.set_global_attribute("uninitialized_variables", outer)


_INHERITED = object()  # `patched`'s mark: the attribute was not the owner's own


@contextlib.contextmanager
def patched(owner, name, value):
    """Inside the block `owner.name` is `value`; after it, what it was (`owner`'s own attribute, or the inherited
    one again)."""
    own = vars(owner).get(name, _INHERITED)
    setattr(owner, name, value)
    try:
        yield
    finally:
        if own is _INHERITED:
            delattr(owner, name)
        else:
            setattr(owner, name, own)


def _values_as_initializers():
    """Inside the block, a `keras.Variable` made from a value gets an initializer returning it instead."""
    original_init = keras.Variable.__init__

    def init(self, initializer, shape=None, dtype=None, *args, **kwargs):
        if keras.backend.is_keras_tensor(initializer) or callable(initializer) or isinstance(initializer, str):
            return original_init(self, initializer, shape, dtype, *args, **kwargs)
        value = keras.ops.convert_to_tensor(initializer, dtype=dtype)

        def constant(shape, dtype=None):
            return value if dtype is None else keras.ops.cast(value, dtype)

        return original_init(self, constant, tuple(value.shape), dtype or value.dtype, *args, **kwargs)

    return patched(keras.Variable, "__init__", init)


class _Registered(list):
    """Keras's list of variables without values. Each joining it gets an initializer that returns an array of its
    dtype: one returning a Python number (keras-hub's CLIPHead) fails Keras's tracing, which reads it as is."""

    def append(self, variable):
        variable._initializer = functools.partial(_array_from, variable._initializer)
        super().append(variable)


def _array_from(initializer, shape, dtype=None):
    return keras.ops.convert_to_tensor(initializer(shape, dtype=dtype), dtype=dtype)


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


def made_by_optimizer():
    """Whether the variable being created now is an optimizer's own: a method of an optimizer is on the stack.

    Not its name scope: Adafactor makes its scalar placeholders outside it, with the bare name of their weight.
    """
    frame = sys._getframe(1)
    while frame is not None:
        if isinstance(frame.f_locals.get("self"), keras.optimizers.Optimizer):
            return True
        frame = frame.f_back
    return False


def set_array(variable, layout, value):
    """Give `variable` a new array and layout without a copy (`_layout`, `_direct_assign`)."""
    variable._layout = layout
    variable._direct_assign(value)


def set_path(variable, path):
    """Give a variable made outside its layer the path of one made inside (`_path`)."""
    variable._path = path


# --- Models -------------------------------------------------------------------------------------


def layer_config(layer):
    """`layer.get_config()` without Keras importing TensorFlow (4 s) to check values for TF types: before
    anything imports it no value can be one, so `module_utils.tensorflow` reads unavailable for the call."""
    tensorflow = module_utils.tensorflow
    if "tensorflow" in sys.modules or tensorflow._available is not None:
        return layer.get_config()
    tensorflow._available = False
    try:
        return layer.get_config()
    finally:
        tensorflow._available = None


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


def rematerialize_nodes(model):
    """Have each node of `model`'s functional graph recompute its forward in the backward pass, as the planner's
    trace does with `remat=True`: the node's `call` wrapped in `jax.checkpoint` over its array arguments, the rest
    (Keras's `training` flag) held fixed. `keras.RematScope(mode="full")` checkpoints every argument, which a layer
    that branches on `training` refuses (keras-hub's decoders), and reaches nested layers too."""
    for nodes in (nodes_by_depth(model) or {}).values():
        for node in nodes:
            if not node.is_input and node.operation is not None:
                node.operation.call = _checkpointed(node.operation.call)


def _checkpointed(call):
    def rematerialized(*args, **kwargs):
        leaves, treedef = jax.tree.flatten((args, kwargs))
        arrays = [i for i, leaf in enumerate(leaves) if isinstance(leaf, jax.Array)]

        def with_arrays(*values):
            filled = list(leaves)
            for i, value in zip(arrays, values):
                filled[i] = value
            args, kwargs = jax.tree.unflatten(treedef, filled)
            return call(*args, **kwargs)

        return jax.checkpoint(with_arrays)(*[leaves[i] for i in arrays])

    return rematerialized


def layers(model):
    """Every sublayer of `model`, recursively (`_flatten_layers`)."""
    flatten = getattr(model, "_flatten_layers", None)
    return list(flatten(include_self=False)) if flatten is not None else []


def sublayers(layer):
    """A layer's direct sublayers (`_flatten_layers(recursive=False)`)."""
    flatten = getattr(layer, "_flatten_layers", None)
    return list(flatten(include_self=False, recursive=False)) if flatten is not None else []


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

    @functools.wraps(original)  # keeps the marker of `constrain_outputs_with`'s wrapper, which wraps the same function
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


# --- Input batches and predictions ---------------------------------------------------------------


def lay_out_batches_with(lay_out):
    """Let `lay_out(per_process_batch, layout, keras_lay_out)` make the global array of every input batch.

    Replaces Keras's `backend.jax.distribution_lib.distribute_data_input`,
    the one function through which the JAX trainer puts every batch of
    fit/evaluate/predict (the `*_on_batch` methods and keras-hub's generate
    too) on the mesh, whatever adapter read it (arrays, tf.data, PyDataset,
    generators); once. `keras_lay_out(per_process_batch, layout)` is Keras's
    own (each process's batch is its slice of the global one). Keras computes a
    batch's layout once per epoch from the first batch and hands every later
    one straight here, so this is also the one place every batch can be checked.
    Checked against keras 3.15.1 and Keras's main branch of August 2026, which
    both call it by module attribute for every batch (main moves dataset
    sharding into the data adapters; this function stays).
    """
    original = _required(jax_distribution_lib, "distribute_data_input", "keras.src.backend.jax.distribution_lib")
    if getattr(original, "_kdist_lay_out", None) is not None:
        return

    def distribute_data_input(per_process_batch, layout, batch_dim_name):
        def keras_lay_out(batch, batch_layout):
            return original(batch, batch_layout, batch_dim_name)

        return lay_out(per_process_batch, layout, keras_lay_out)

    distribute_data_input._kdist_lay_out = lay_out
    jax_distribution_lib.distribute_data_input = distribute_data_input


def constrain_outputs_with(layout_type, constrain):
    """Let `constrain(outputs, layout)` lay out every layer output whose layout is a `layout_type`.

    Replaces `backend.jax.distribution_lib.distribute_tensor`, which
    `Layer.__call__` calls (through `keras.distribution.distribute_tensor`)
    with the layout a distribution's `get_tensor_layout("<layer path>/output")`
    returns; a layout of any other type goes to Keras's own, unchanged.
    Keras's takes one sharding for the whole output, so it cannot leave the
    dimensions after the batch to XLA for outputs of several ranks; this hook can.
    """
    original = _required(jax_distribution_lib, "distribute_tensor", "keras.src.backend.jax.distribution_lib")
    if getattr(original, "_kdist_constrain", None) is not None:
        return

    @functools.wraps(original)  # keeps the marker of `commit_arrays_to`'s wrapper, which wraps the same function
    def distribute_tensor(tensor, layout):
        if isinstance(layout, layout_type):
            return constrain(tensor, layout)
        return original(tensor, layout)

    distribute_tensor._kdist_constrain = constrain
    jax_distribution_lib.distribute_tensor = distribute_tensor


def gather_predictions_with(gather):
    """Pass every batch of `predict` / `predict_on_batch` outputs through `gather(outputs)` before Keras reads it.

    Keras's JAX trainer turns each batch's outputs into numpy (`np.concatenate`,
    `np.array`), which fails for an array spread over several processes. This
    wraps `JAXTrainer.make_predict_function` so that the `predict_function` it
    sets (a model attribute Keras calls as `predict_function(state, iterator)`
    -> `(outputs, state)`) returns `gather(outputs)`; once.
    """
    original = _required(JAXTrainer, "make_predict_function", "keras.src.backend.jax.trainer.JAXTrainer")
    if getattr(original, "_kdist_gather", None) is not None:
        return

    def make_predict_function(self, force=False):
        original(self, force)
        made = self.predict_function  # Keras sets it (and returns it only when it was already made)
        if getattr(made, "_kdist_gathers", False):
            return made

        def predict_function(state, iterator):
            outputs, state = made(state, iterator)
            return gather(outputs), state

        predict_function._kdist_gathers = True
        self.predict_function = predict_function
        return predict_function

    make_predict_function._kdist_gather = gather
    JAXTrainer.make_predict_function = make_predict_function


def _required(owner, name, where):
    """`owner.name`, or a VersionError naming the installed Keras and the version kdist was checked with."""
    found = getattr(owner, name, None)
    if found is None:
        raise VersionError(
            f"kdist needs Keras's {where}.{name}, which keras {keras.__version__} does not have; kdist was "
            f"checked with keras {CHECKED} (pip install -c constraints.txt keras=={CHECKED})."
        )
    return found


def agree_on_random_seed():
    """What `keras.distribution.initialize` does after joining: one global random seed, summed over the processes.

    (Keras 3.15's `initialize_rng`; a no-op when `keras.utils.set_random_seed` already set one.)
    """
    jax_distribution_lib.initialize_rng()
