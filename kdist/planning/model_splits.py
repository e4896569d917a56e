"""The share of each traced buffer one device holds over the model and expert axes, per candidate mesh.

The weights' layouts over those axes are followed through the traced step
(`kdist.planning.propagation`); most candidates of a plan share one layout,
so the result is cached per layout and axis sizes on the plan's facts.
"""

import numpy as np

from kdist.meshes.layout import split_by
from kdist.planning import propagation
from kdist.units import HALF_FLOATS


def model_split_factors(facts, rows, axes):
    """Per traced buffer: the share of it one device holds over the model and expert axes of `axes`."""
    return _splits(facts, rows, axes)[0]


def regather_shares(facts, rows, axes):
    """Per traced buffer: the share of its whole copy a device keeps where a matrix product gathers it again
    (`memory_model.regathered`), 1 elsewhere and for a value a cast down to 16 bits makes (a float32 norm's output,
    mixed precision's copies: they keep their gathered copies); None where nothing is split over the model and expert
    axes."""
    return _splits(facts, rows, axes)[1]


def _splits(facts, rows, axes):
    step = facts.traced.step
    per_representative = [_axis_dims(r.spec) for r in rows[: len(facts.variables)]]
    layout = tuple(tuple(sorted(s.items())) for s in per_representative)
    key = (layout, *(axes.get(a, 1) for a in propagation.AXES))
    cache = facts._model_splits
    if key not in cache:
        if not any(layout):  # nothing split over a model-parallel axis
            cache[key] = np.ones(len(step.size)), None
        else:
            rep_of = facts.representative_index([v.path for v in facts.traced.variables])
            weight_splits = [per_representative[i] for i in rep_of]
            splits, enlarged, before = propagation.split_axes(step, weight_splits, dict(zip(propagation.AXES, key[1:])))
            whole = np.array(propagation.factors(splits, step.shape, axes, enlarged))
            shares = np.ones(len(step.size))
            casts = _narrowing_casts(step, before)
            kept = [g for g in before if g not in casts and whole[g] > 0]
            if kept:
                split = propagation.factors([before[g] for g in kept], [step.shape[g] for g in kept], axes)
                shares[kept] = np.array(split) / whole[kept]
            cache[key] = whole, shares
    return cache[key]


def _narrowing_casts(step, buffers):
    """The buffers of `buffers` a cast down to 16 bits makes: a norm's output computed in float32, mixed
    precision's copies of float32 values."""
    wanted, out = {g for g in buffers if step.dtype[g] in HALF_FLOATS}, set()
    for item in step.agenda:
        if item[0] != "run":
            continue
        p, mapping = item[1]
        for x, g in mapping.items():
            i = p.producer_index.get(x) if g in wanted else None
            if i is not None and p.flat.eqns[i][0] == "convert_element_type":
                if p.flat.dtype[p.flat.eqns[i][1][0]] not in HALF_FLOATS:
                    out.add(g)
    return out


def _axis_dims(spec):
    """{axis: dimension} of the model-parallel axes in a layout `spec`."""
    out = {}
    for axis in propagation.AXES:
        dims = split_by(spec, axis)
        if any(dims):
            out[axis] = list(dims).index(True)
    return out
