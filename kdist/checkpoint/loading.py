"""`kdist.load`: a keras-hub preset, a Keras file or a kdist checkpoint, read straight into the model's shards.

The model is built with its variables deferred (nothing allocated), then
each weight is read into the layout the distribution gives it: from HDF5,
each device's slice is read from the file on its own (`dataset[index]`),
so no point of the load holds more than the sharded model plus one
variable, on any device or on the host (see `streaming.py`). Everything is
read before anything is assigned: a failed load returns no model and leaves
a model passed in as it was.
"""

import contextlib
import os
import zipfile

import keras

from kdist.checkpoint.peak_memory import sample_active
from kdist.checkpoint.reading import (
    REQUIRED,
    checkpoint_dir,
    flat_variables,
    flatten,
    match_checkpoint,
    open_checkpoint,
    read_arrays,
)
from kdist.checkpoint.restore import check_keras_file
from kdist.checkpoint.sharded import build_optimizer, check_path
from kdist.checkpoint.streaming import H5Weight, Staging, target_of
from kdist.errors import ArgumentError, ArgumentTypeError, CheckpointError, MissingDependencyError, ModelError, cause
from kdist.keras_internals import deferred
from kdist.keras_internals.loading import (
    initialize_deferred,
    intercepted_weight_loads,
    is_deferred,
)

PRESET_CONFIG = "config.json"
PRESET_WEIGHTS = ("model.weights.h5", "model.weights.json")  # one file, or keras-hub's sharded weights
TASK_WEIGHTS = "task.weights.h5"
BACKBONE_KWARGS = ("dtype", "image_shape")  # what keras-hub forwards from a task's from_preset to its backbone
KERAS_CONFIG = "config.json"
ACCEPTED = (
    "a keras-hub preset directory (config.json and model.weights.h5, as save_to_preset writes), a .keras file, "
    "a .weights.h5 / .weights.json file, or a checkpoint directory written by kdist.save_sharded"
)


def load(source, model=None, *, distribution=None, model_class=None, **kwargs):
    """Load a model, or weights into `model`, straight into their shards; nothing changes if it fails.

    Each variable is read into the layout `distribution` (default: the one
    set with `keras.distribution.set_distribution`, or one device) gives it,
    each device reading only its own slices, one variable at a time: no
    point of the load holds more than the sharded model plus one variable's
    unsharded value, on a device or on the host (a live `model`'s old values
    are kept until the new ones are all read, so that a failed load changes
    nothing: pass a model from `kdist.abstract_model` to avoid holding both).

    Example:

    ```python
    keras.distribution.set_distribution(kdist.preset("fsdp"))
    backbone = kdist.load("/data/gemma_2b_preset")                  # a local keras-hub preset
    lm = kdist.load("/data/gemma_2b_preset", model_class=keras_hub.models.GemmaCausalLM)
    model = kdist.load("model.keras")                               # a whole Keras model
    kdist.load("/tmp/ckpt", model=model)                            # kdist.save_sharded's checkpoint
    ```

    Args:
        source: a keras-hub preset directory, a `.keras` file (both build
            their model), a `.weights.h5` / `.weights.json` file or a kdist
            sharded checkpoint directory (both need `model`).
        model: a built `keras.Model` to load into: live (its values are
            replaced, all or nothing, on the layouts they have now) or abstract
            (`kdist.abstract_model`: its variables get their arrays, on the
            layouts `distribution` gives). For a preset or `.keras` file, the
            model to take their weights instead of building one.
        distribution: a `keras.distribution.Distribution` (e.g. `kdist.preset("2x4")`)
            to lay the model out with; default: the global one.
        model_class: for a preset, the keras-hub class whose `from_preset` builds the model
            (default `keras_hub.models.Backbone`, e.g. `keras_hub.models.GemmaCausalLM`).
        **kwargs: for a preset, passed to `from_preset` (e.g. `dtype="bfloat16"`).

    Returns:
        The model, every variable holding its value on its layout.

    Raises:
        CheckpointError: `source` is missing, not one of the kinds above,
            unreadable, or does not fit the model (names, shapes); no model
            is returned and `model` keeps every value.
        ArgumentTypeError / ArgumentError: an argument of the wrong kind, or one the source does not take.
        ModelError: `model` is not built.
    """
    path = check_path(source, "kdist.load(source)")
    distribution = _check_distribution(distribution)
    if model is not None:
        _check_model(model)
    kind = _kind(path)
    if model_class is not None and (kind != "preset" or model is not None):
        raise ArgumentError(
            f"kdist.load: model_class= chooses the class that builds a keras-hub preset; {path!r} is a {kind}"
            f"{' and model= is given' if model is not None else ''}. Leave model_class out."
        )
    if kwargs and (kind != "preset" or model is not None):
        raise ArgumentError(
            f"kdist.load: keyword arguments {sorted(kwargs)} go to a preset's from_preset, which this load does not "
            f"call ({path!r} is a {kind}{', model= is given' if model is not None else ''})."
        )
    layout_source = distribution if distribution is not None else keras.distribution.distribution()
    with distribution.scope() if distribution is not None else contextlib.nullcontext():
        if kind == "checkpoint":
            return _load_checkpoint(_require(model, kind, path), path, layout_source)
        if model is not None:
            weights = _preset_weights(path) if kind == "preset" else path
            return _load_weights(model, weights, layout_source)
        if kind == "preset":
            return _build_preset(path, model_class, kwargs, layout_source)
        if kind == "keras file":
            return _build_keras_file(path, layout_source)
        return _require(model, kind, path)


# --- Sources ----------------------------------------------------------------------------------------


def _kind(path):
    if not os.path.exists(path):
        raise CheckpointError(f"kdist.load: nothing at {path!r}; give {ACCEPTED}.")
    if os.path.isdir(path):
        if os.path.isfile(os.path.join(path, PRESET_CONFIG)):
            _preset_weights(path)
            return "preset"
        try:
            checkpoint_dir(path)
        except CheckpointError:
            raise CheckpointError(
                f"kdist.load: the directory {path!r} is neither a keras-hub preset (no {PRESET_CONFIG}) nor a kdist "
                f"checkpoint; give {ACCEPTED}."
            ) from None
        return "checkpoint"
    if path.endswith(".keras"):
        check_keras_file(path)
        return "keras file"
    if path.endswith((".weights.h5", ".weights.json")):
        if path.endswith(".h5"):
            check_keras_file(path)
        return "weights file"
    raise CheckpointError(f"kdist.load: {path!r} is not a file kdist can load; give {ACCEPTED}.")


def _preset_weights(path):
    for name in PRESET_WEIGHTS:
        if os.path.isfile(os.path.join(path, name)):
            return os.path.join(path, name)
    raise CheckpointError(
        f"kdist.load: the preset {path!r} has no weights ({' or '.join(PRESET_WEIGHTS)}); save it with save_to_preset."
    )


def _require(model, kind, path):
    if model is None:
        raise ArgumentError(
            f"kdist.load: {path!r} is a {kind}, which holds weights but not the model: pass model= (a built Keras "
            "model, or kdist.abstract_model(build) to allocate nothing before the load)."
        )
    return model


# --- Loads ------------------------------------------------------------------------------------------


def _load_weights(model, path, distribution, keras_load=None, created=()):
    """Keras's `model.load_weights(path)` (or `keras_load()`), each value read into its shards, assigned at the end.

    `created`: variables a deferred build made beside the model's own (a compiled model's metrics), initialised after.
    """
    owned = {id(v) for v in [*_variables(model), *created]}
    staging = Staging(lambda v: target_of(v, distribution) if id(v) in owned else None, path)
    _run_keras_load(staging, keras_load or (lambda: model.load_weights(path)), path, model)
    _finish(model, staging, created)
    return model


def _build_preset(path, model_class, kwargs, distribution):
    hub = _keras_hub()
    model_class = model_class or hub.models.Backbone
    if not (isinstance(model_class, type) and callable(getattr(model_class, "from_preset", None))):
        raise ArgumentTypeError(
            f"kdist.load: model_class must be a keras-hub class with from_preset (e.g. keras_hub.models.Backbone); "
            f"received {model_class!r}."
        )
    if not issubclass(model_class, hub.models.Task):
        return _build_deferred(path, lambda: model_class.from_preset(path, **kwargs), distribution)
    # A task: its backbone is built deferred and loaded as above; the task around it (its head, optimizer) is built
    # live, as keras-hub would, and its own weights (task.weights.h5, small) are read into their shards too.
    backbone_kwargs = {k: kwargs.pop(k) for k in BACKBONE_KWARGS if k in kwargs}
    backbone_class = model_class.backbone_cls or hub.models.Backbone
    backbone = _build_deferred(path, lambda: backbone_class.from_preset(path, **backbone_kwargs), distribution)
    try:
        task = model_class.from_preset(path, backbone=backbone, load_weights=False, **kwargs)
    except Exception as e:
        raise CheckpointError(
            f"kdist.load: cannot build {model_class.__name__} from {path!r}: {_keras_message(e)}"
        ) from e
    task_weights = os.path.join(path, TASK_WEIGHTS)
    if os.path.isfile(task_weights) and task.has_task_weights():
        _load_weights(task, task_weights, distribution, lambda: task.load_task_weights(task_weights))
    return task


def _build_deferred(path, build, distribution):
    """`build()` with every variable deferred; Keras's weight loads inside it read into the shards."""
    staging = Staging(lambda v: target_of(v, distribution), path)
    built, created = [], []

    def deferred_build():
        with deferred() as made:
            built.append(build())
        created.extend(made)

    _run_keras_load(staging, deferred_build, path, None)
    _finish(built[0], staging, created)
    return built[0]


def _build_keras_file(path, distribution):
    try:
        with zipfile.ZipFile(path) as archive:
            config = archive.read(KERAS_CONFIG).decode("utf-8")
    except (KeyError, UnicodeDecodeError) as e:
        raise CheckpointError(f"kdist.load: {path!r} has no readable {KERAS_CONFIG}: {e}") from e
    try:
        with deferred() as created:  # a compiled model's optimizer is made from values (its iteration): deferred too
            model = keras.models.model_from_json(config)
    except Exception as e:
        raise CheckpointError(f"kdist.load: cannot build the model of {path!r}: {_keras_message(e)}") from e
    return _load_weights(model, path, distribution, created=created)


def _load_checkpoint(model, path, distribution):
    directory = checkpoint_dir(path)
    marker, tree = open_checkpoint(directory)
    saved = flatten(tree)
    weights = {k: v for k, v in flat_variables(model).items() if k.startswith(REQUIRED)}
    match_checkpoint(saved, weights, directory, REQUIRED)  # the weights first, before the optimizer is built
    with deferred() if any(is_deferred(v) for v in weights.values()) else contextlib.nullcontext():
        build_optimizer(model)
    current = flat_variables(model)
    match_checkpoint(saved, current, directory, REQUIRED)
    targets = {key: target_of(v, distribution) for key, v in current.items() if key in saved}
    shardings = {key: target[2] for key, target in targets.items() if is_deferred(target[0])}
    values = read_arrays(directory, tree, current, marker, shardings)
    sample_active()  # every value read, none assigned: the checkpoint load's peak
    staging = Staging(lambda v: None, directory)
    for key, array in values.items():
        staging.put(targets[key], array)
    _finish(model, staging)
    return model


def _run_keras_load(staging, load, path, model):
    """Run a Keras load with its weight reads staged; any failure a CheckpointError, nothing assigned."""
    try:
        with intercepted_weight_loads(H5Weight, staging.stage):
            load()
    except Exception as e:
        if staging.error is not None:
            raise staging.error from e
        if isinstance(e, (CheckpointError, MissingDependencyError)):
            raise
        into = f" into model {model.name!r}" if model is not None else ""
        raise CheckpointError(f"kdist.load: cannot load {path!r}{into}: {_keras_message(e)}") from e


def _finish(model, staging, created=()):
    """Assign what was read (all or nothing), then give variables the load did not cover their initial values.

    Those are the model's variables and those its deferred build made besides (`created`: a compiled model's
    metrics), left deferred: not in the file (e.g. a task's head without task weights). They get their
    initializer's value under the distribution, as Keras would have given them when it built the model.
    """
    staging.commit()
    for variable in [*_variables(model), *created]:
        if is_deferred(variable):
            initialize_deferred(variable)


# --- Arguments --------------------------------------------------------------------------------------


def _variables(model):
    optimizer = getattr(model, "optimizer", None)
    found = [*model.variables, *(optimizer.variables if optimizer is not None else [])]
    return list({id(v): v for v in found}.values())


def _check_distribution(distribution):
    needed = ("scope", "get_variable_layout")
    if distribution is not None and not all(callable(getattr(distribution, n, None)) for n in needed):
        raise ArgumentTypeError(
            "kdist.load: distribution must be a Keras distribution (kdist.preset('2x4'), "
            "keras.distribution.DataParallel, ModelParallel) or None; "
            f"received {type(distribution).__name__} {repr(distribution)[:80]}."
        )
    return distribution


def _check_model(model):
    if not isinstance(model, keras.Model):
        raise ArgumentTypeError(f"kdist.load: model must be a keras.Model or None; received {type(model).__name__}.")
    if not model.built or not model.variables:
        raise ModelError(
            f"kdist.load needs a built model; {model.name!r} is not built (it has no variables yet). Give it a "
            "keras.Input, call it on a batch or build it with kdist.abstract_model."
        )


def _keras_message(error):
    """The first few lines of a Keras error (its first line alone is often 'A total of N objects ...:')."""
    return cause(error, lines=3, limit=600)


def _keras_hub():
    try:
        import keras_hub  # an optional dependency: imported only to build a preset
    except ImportError as e:
        raise MissingDependencyError(f"kdist.load of a preset needs keras-hub: pip install keras-hub ({e})") from e
    return keras_hub
