"""Keras internals of optimizers: a fresh copy, building one with its variables deferred, and which weight each
slot belongs to (the inspector, the planner and resharding reach them)."""

import re

import keras

from kdist.keras_internals import global_state, patched

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

    pending = global_state.get_global_attribute("uninitialized_variables", [], set_to_default=True)
    before = len(pending)
    try:
        with (
            patched(optimizer, "add_variable", deferred_variable),
            patched(optimizer, "add_variable_from_reference", recording),
        ):
            optimizer.build(trainable)
    finally:
        del pending[before:]  # so that no later scope exit allocates the planned state
    return list(optimizer.variables), slots


def state_owners(optimizer_variables, slots):
    """{id(variable): weight} for an optimizer's own variables made for one weight (Adafactor's factored moments).

    Keras's optimizers make them just before the weight's first slot, named
    after the weight (`name=var.name`); `slots` is {id(slot): weight}. One of
    another name (Nadam's `u_product`) belongs to no weight.
    """
    owners, pending = {}, []
    for v in optimizer_variables:
        weight = slots.get(id(v))
        if weight is None:
            pending.append(v)
            continue
        owners.update((id(own), weight) for own in pending if own.name == weight.name)
        pending = []
    return owners


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
