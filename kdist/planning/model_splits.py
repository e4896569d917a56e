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


def reduced_shares(facts, rows, axes):
    """Per traced buffer: (the share of it a device keeps once XLA reduce-scatters it, the share one layout of it
    is), where it is a convolution's partial sum, the gradient of an input split over the model axis, or a sum of
    such partial sums (`propagation.split_axes`); (1, 1) elsewhere."""
    return _splits(facts, rows, axes)[2]


def _splits(facts, rows, axes):
    step = facts.traced.step
    per_representative = [_axis_dims(r.spec) for r in rows[: len(facts.variables)]]
    layout = tuple(tuple(sorted(s.items())) for s in per_representative)
    key = (layout, *(axes.get(a, 1) for a in propagation.AXES))
    cache = facts._model_splits
    if key not in cache:
        if not any(layout):  # nothing split over a model-parallel axis
            cache[key] = np.ones(len(step.size)), None, (np.ones(len(step.size)), np.ones(len(step.size)))
        else:
            rep_of = facts.representative_index([v.path for v in facts.traced.variables])
            weight_splits = [per_representative[i] for i in rep_of]
            sizes = dict(zip(propagation.AXES, key[1:]))
            splits, enlarged, before, reduced = propagation.split_axes(step, weight_splits, sizes)
            whole = np.array(propagation.factors(splits, step.shape, axes, enlarged))
            after, layout = np.ones(len(step.size)), np.ones(len(step.size))
            for g, split in reduced.items():
                if whole[g] > 0:
                    after[g] = propagation.factors([split], [step.shape[g]], axes)[0] / whole[g]
                    layout[g] = 0.5 if g in enlarged else 1.0  # written in two layouts, or one (a sum of them)
            shares = np.ones(len(step.size))
            casts = _narrowing_casts(step, before)
            copied = [g for g in before if g not in casts and whole[g] > 0]
            if copied:
                split = propagation.factors([before[g] for g in copied], [step.shape[g] for g in copied], axes)
                shares[copied] = np.array(split) / whole[copied]
            cache[key] = whole, shares, (after, layout)
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
