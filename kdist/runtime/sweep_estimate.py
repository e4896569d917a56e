"""The planner beside a sweep: its estimate per mesh shape, and the meshes `sweep(top=K)` takes from the plan."""

import keras
import numpy as np

from kdist.abstract import abstract_model
from kdist.checks import is_int, shown
from kdist.errors import ArgumentError, PlanError, cause
from kdist.keras_internals import input_struct
from kdist.planning.facts import unknown_dims
from kdist.planning.planner import plan


def planner_estimate(build_model, devices, *, batch_size, optimizer="adam", rules=None, x=None):
    """An `estimate` for `sweep`: the peak bytes per device `kdist.plan` estimates for each mesh.

    The model is planned once, abstractly (nothing allocated), for all the
    meshes of `devices` devices; each shape then looks its mesh up. Inputs
    of unknown length take the lengths of the data `x` the sweep trains on.
    """
    model = abstract_model(build_model)
    if optimizer is None:
        optimizer = getattr(model, "optimizer", None) or "adam"
        if isinstance(optimizer, keras.optimizers.Optimizer):  # the model's own: a copy, never the one it trains with
            optimizer = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    lengths = data_lengths(model, x)
    result = plan(model, devices, batch_size=batch_size, sequence_length=lengths, optimizer=optimizer, rules=rules)
    by_axes = {tuple(sorted(c.axes.items())): c for c in result.candidates}

    def candidate(distribution):
        sizes = {r: s for r, s in zip(distribution.roles, distribution.device_mesh.shape) if s > 1} or {"data": 1}
        found = by_axes.get(tuple(sorted(sizes.items())))
        if found is None:
            planned = ", ".join(c.spec for c in result.candidates)
            raise LookupError(f"the planner has no mesh {sizes} (it planned {planned})")
        if not found.valid:
            raise LookupError(f"the planner marks {found.spec} invalid: {found.reason}")
        return found

    def estimate(model, distribution):
        return candidate(distribution).peak

    estimate.plan, estimate.candidate = result, candidate  # the whole plan, and each mesh's candidate (step time)
    return estimate


def data_lengths(model, x):
    """`sequence_length` by input name from arrays `x` (matching the model's inputs): the sizes of each input's
    unknown dimensions; None where no input has one, or `x` is not laid out as the inputs are."""
    struct = input_struct(model)
    if struct is None or x is None:
        return None
    inputs, arrays = keras.tree.flatten(struct), keras.tree.flatten(x)
    by_name = isinstance(struct, dict)
    if len(inputs) != len(arrays) or by_name and not (isinstance(x, dict) and set(x) == set(struct)):
        return None
    lengths = {}
    for t, array in zip(inputs, arrays):
        unknown = unknown_dims(t.shape)
        if unknown and len(np.shape(array)) == len(t.shape):
            lengths[t.name] = tuple(int(np.shape(array)[i]) for i in unknown)
    return lengths or None


def default_estimate(build_model, devices, batch_size, optimizer, rules, strict=False, x=None):
    """The planner's estimate; when it fails, one that says why in every row (or, `strict`, a PlanError)."""
    try:
        return planner_estimate(build_model, devices, batch_size=batch_size, optimizer=optimizer, rules=rules, x=x)
    except Exception as e:  # every row then says why the planner could not help
        reason = f"the planner failed: {cause(e, lines=1, limit=400)}"
        if strict:
            raise PlanError(f"top= sweeps the planner's leading meshes, but {reason}") from e

        def unavailable(model, distribution):
            raise LookupError(reason)

        return unavailable


def check_top(top, meshes):
    if not is_int(top) or top < 1:
        raise ArgumentError(
            f"top must be a positive integer (how many of the plan's meshes to sweep); received {shown(top)}."
        )
    if not (isinstance(meshes, str) and meshes == "all"):
        raise ArgumentError(
            f'top={top} picks the meshes from the plan; leave meshes out ("all"), received meshes={shown(meshes)}.'
        )
    return top
