"""The Keras distribution behind every kdist preset."""

import dataclasses
import math

from keras.distribution import LayoutMap, ModelParallel, TensorLayout

from kdist.parallel_dims import BATCH_ROLES
from kdist.rules.binding import bind_mesh
from kdist.rules.rule import Placement, RuleSet

# Variables with fewer elements than this stay replicated on the fsdp axis:
# gathering them costs more than the memory they would save.
FSDP_MIN_SIZE = 4096


class ShardedDistribution(ModelParallel):
    """A `keras.distribution.ModelParallel` whose layouts come from kdist rules.

    For each variable, the first matching rule gives its layout; a sharded
    dimension that does not divide by its mesh axis is replicated instead of
    failing, and the reason is kept in `placements`. On meshes with an fsdp
    axis, each variable is also sharded along its largest still-unsharded
    dimension that divides. The batch is split over the data and fsdp axes.

    Build one with `kdist.preset(...)`; it works with
    `keras.distribution.set_distribution` and `with dist.scope():`.

    Example:

    ```python
    dist = kdist.preset("2x4")
    with dist.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64)])
    dist.placements["sequential/dense/kernel"].axes   # (None, "model")
    ```

    Attributes:
        spec: the spec string the distribution was built from, if any.
        rules: the `RuleSet` in force.
        roles: the role of each mesh axis ("data", "fsdp", "model", "expert").
        placements: variable path -> `Placement`, for each variable laid out so far.
    """

    def __init__(self, device_mesh, rules=None, *, roles=None, spec=None, fsdp_min_size=FSDP_MIN_SIZE, auto_shard_dataset=True):
        self.rules = rules if rules is not None else RuleSet(name="none")
        self.roles = tuple(roles) if roles is not None else tuple(device_mesh.axis_names)
        self.spec = spec
        self.fsdp_min_size = fsdp_min_size
        self.axis_sizes = bind_mesh(device_mesh, self.roles)
        self.placements = {}
        names = device_mesh.axis_names
        self.batch_axes = tuple(n for n, r in zip(names, self.roles) if r in BATCH_ROLES)
        super().__init__(
            layout_map=LayoutMap(device_mesh),
            batch_dim_name=self.batch_axes[0] if self.batch_axes else names[0],
            auto_shard_dataset=auto_shard_dataset,
        )

    @property
    def num_model_replicas(self):
        sizes = dict(zip(self.device_mesh.axis_names, self.device_mesh.shape))
        return math.prod(sizes[a] for a in self.batch_axes)

    def get_data_layout(self, data_shape):
        axes = [None] * len(data_shape)
        if self.batch_axes and axes:
            axes[0] = self.batch_axes[0] if len(self.batch_axes) == 1 else self.batch_axes
        return _MultiAxisLayout(axes, self.device_mesh)

    def get_variable_layout(self, variable):
        if getattr(variable, "_layout", None) is not None:
            self.placements[variable.path] = Placement(
                variable.path, tuple(variable.shape), _axes_of(variable._layout), "explicit", reason="the variable carried its own layout"
            )
            return variable._layout
        placement = self.place(variable.path, variable.shape)
        self.placements[variable.path] = placement
        return TensorLayout(placement.axes, self.device_mesh)

    def get_tensor_layout(self, path):
        return None  # activations: let XLA propagate shardings from the weights

    def place(self, path, shape):
        """The `Placement` this distribution gives a variable, without creating it."""
        placement = self.rules.place(path, shape, self.axis_sizes)
        fsdp = self.axis_sizes.get("fsdp")
        if fsdp is None or fsdp[1] == 1:
            return placement
        return shard_fsdp(placement, *fsdp, self.fsdp_min_size)

    def __repr__(self):
        shape = dict(zip(self.device_mesh.axis_names, self.device_mesh.shape))
        return f"<ShardedDistribution spec={self.spec!r} mesh={shape} rules={self.rules.name!r}>"


class _MultiAxisLayout(TensorLayout):
    """A TensorLayout whose dimensions may be split over several mesh axes."""

    def _validate_axes(self):
        if self._device_mesh:
            flat = [a for axis in self._axes for a in (axis if isinstance(axis, tuple) else (axis,))]
            unknown = set(flat) - set(self._device_mesh.axis_names) - {None}
            if unknown:
                raise ValueError(f"Layout axes {sorted(unknown)} are not in mesh axes {self._device_mesh.axis_names}.")


def shard_fsdp(placement, axis, size, min_size):
    shape, axes = placement.shape, placement.axes
    if axis in axes:
        return placement
    if math.prod(shape) < min_size:
        return placement
    free = [i for i, a in enumerate(axes) if a is None and shape[i] % size == 0]
    if not free:
        reason = f"no unsharded dimension of {shape} divides by {axis}={size}: replicated over {axis}"
        return dataclasses.replace(placement, reason=_join(placement.reason, reason))
    dim = max(free, key=lambda i: shape[i])
    new_axes = tuple(axis if i == dim else a for i, a in enumerate(axes))
    source = "fsdp" if placement.source == "default" else placement.source
    return dataclasses.replace(placement, axes=new_axes, source=source)


def _join(*reasons):
    return "; ".join(r for r in reasons if r)


def _axes_of(layout):
    if isinstance(layout, TensorLayout):
        return tuple(layout.axes)
    return tuple(getattr(layout, "spec", ()))
