"""A convolution's partial sum: counted as the reduce-scatter leaves it, its whole copies until that is done."""

import numpy as np
import pytest

import kdist
from kdist.planning import partial_sums
from tests.planning.test_convolutions import _padded


def test_a_convolutions_partial_sum_is_whole_only_until_its_reduce_scatter(monkeypatch):
    """A convolution's input gradient over a model-split input is a whole partial sum, written in two layouts, and
    XLA reduce-scatters it to the input's split (docs/plan.md, "A convolution's partial sum, reduced at once"):
    counted split from where the kernel makes it, its whole copies beside it until the reduce-scatter is done: at
    once where the batch is not split (the next kernel needs it), until the next partial sum or the backward's end
    where waiting weight-gradient kernels run beside it (a batch split)."""
    seen = []
    original = partial_sums.reduced_at_once
    monkeypatch.setattr(
        partial_sums, "reduced_at_once", lambda *a: seen.append((a[0], dict(a[2]), a[3], original(*a))) or seen[-1][3]
    )
    kdist.plan(lambda: _padded("layer"), 8, batch_size=16, target="H100")
    step = seen[0][0].traced.step
    born, n = step.lifetimes()[0], len(step.events)
    by_mesh = {",".join(f"{a}={k}" for a, k in axes.items() if k > 1): entry for _, axes, *entry in seen}
    for mesh in ("data=8", "fsdp=8"):
        factor, (kept, copies) = by_mesh[mesh]
        assert (kept == factor).all() and not copies.any(), mesh  # nothing split over a model axis: no partial sum
    for mesh, lasts_until in (("model=8", None), ("data=2,model=4", n - 1)):
        factor, (kept, copies) = by_mesh[mesh]
        (g,) = np.flatnonzero(kept < factor)  # the second convolution's input gradient, at the padded size
        assert step.shape[g][1:] == (34, 34, 16) and kept[g] == pytest.approx(factor[g] / 2 / int(mesh[-1]))
        assert copies[born[g]] == pytest.approx(step.size[g] * (factor[g] - kept[g]))  # both layouts
        held = np.flatnonzero(copies)
        assert held[-1] == (born[g] + 1 if lasts_until is None else lasts_until), mesh
        assert copies[held[-1]] == pytest.approx(step.size[g] * (factor[g] / 2 - kept[g]))  # the channels-first one
