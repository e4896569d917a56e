"""The Keras distribution behind every kdist preset: the placement engine's axes as Keras `TensorLayout`s."""

import jax
import keras
from keras.distribution import DeviceMesh, LayoutMap, ModelParallel, TensorLayout

from kdist.errors import ArgumentTypeError, BatchSizeError
from kdist.keras_internals import check_batches_with, commit_arrays_to, own_layout
from kdist.meshes.batching import batch_split
from kdist.meshes.spec import ParallelDims
from kdist.rules.placement import Placement
from kdist.rules.placer import FSDP_MIN_SIZE
from kdist.rules.registry import placer_for


class ShardedDistribution(ModelParallel):
    """A `keras.distribution.ModelParallel` whose layouts come from kdist's placement engine.

    For each variable, the first matching rule gives its layout; a sharded
    dimension that does not divide by its mesh axis falls back to the rule's
    next candidate or is replicated, never jax's raw error, and the reason is
    kept in `placements`. On meshes with an fsdp axis, each variable is also
    sharded along its largest still-unsharded dimension that divides. The
    batch is split over the data and fsdp axes. Given a Keras `LayoutMap` as
    rules, Keras's own lookup applies, activation layouts included.

    Build one with `kdist.preset(...)`; it works with
    `keras.distribution.set_distribution` and `with dist.scope():`.

    Example:

    ```python
    dist = kdist.preset("2x4")
    with dist.scope():
        model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(64)])
    dist.placements["sequential/dense/kernel"].axes   # (None, "model")
    ```

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`.
        rules: what `kdist.preset` takes: None / "auto", a rule set name or
            file, a `RuleSet`, a Keras `LayoutMap` or `(pattern, layouts)` pairs.
        roles: the role of each mesh axis; defaults to the axis names.
        spec: the spec string it was built from, for reports.
        fsdp_min_size: variables with fewer elements stay replicated over fsdp.
        auto_shard_dataset: as in Keras's `ModelParallel`.

    Attributes:
        spec: the spec string the distribution was built from, if any.
        rules: the `RuleSet` (or `kdist.rules.LayoutMapRules`) in force.
        dims: the mesh as a `kdist.ParallelDims` (axis names, sizes, roles).
        roles: the role of each mesh axis ("data", "fsdp", "model", "expert").
        placer: the `kdist.rules.Placer` that decides every layout.
        placements: variable path -> `Placement`, for each variable laid out so far.
    """

    def __init__(
        self, device_mesh, rules=None, *, roles=None, spec=None, fsdp_min_size=FSDP_MIN_SIZE, auto_shard_dataset=True
    ):
        if not isinstance(device_mesh, DeviceMesh):
            raise ArgumentTypeError(
                f"ShardedDistribution needs a keras.distribution.DeviceMesh (e.g. kdist.mesh('2x4')); "
                f"received {type(device_mesh).__name__}."
            )
        self.dims = ParallelDims.from_device_mesh(device_mesh, roles)
        self.placer = placer_for(rules, self.dims, fsdp_min_size=fsdp_min_size)
        self.spec = spec
        self.placements = {}
        names = self.dims.names
        super().__init__(
            layout_map=LayoutMap(device_mesh),
            batch_dim_name=self.dims.batch_axes[0] if self.dims.batch_axes else names[0],
            auto_shard_dataset=auto_shard_dataset,
        )
        check_batches_with(_check_current_batch)
        commit_arrays_to(MultiAxisLayout)  # else, on one device, jit compiles Keras's steps again (see there)

    @property
    def rules(self):
        return self.placer.rules

    @property
    def roles(self):
        return self.dims.roles

    @property
    def fsdp_min_size(self):
        return self.placer.fsdp_min_size

    @property
    def batch_axes(self):
        """Mesh axes the batch is split over."""
        return self.dims.batch_axes

    @property
    def num_model_replicas(self):
        return self.dims.num_batch_shards

    def get_data_layout(self, data_shape):
        """The batch's layout: its first dimension split over the data and fsdp axes.

        A batch of any size works in a single-process run: one the batch
        shards do not divide (a single prompt, a short last batch) is split
        over the batch axes that divide it and replicated over the others
        (`kdist.meshes.batching`): the same examples and results as one
        device, at the cost of repeating that batch's compute on the
        replicated axes. Keras lays out later batches with the first batch's
        layout; kdist re-lays out each batch whose size needs another.

        Raises:
            BatchSizeError: in a multi-process run, the batch does not divide
                over those axes (each process holds only its share, so it
                cannot be replicated): the message names the batch size, the
                axes and the sizes that would work.
        """
        axes = [None] * len(data_shape)
        batch = self.dims.batch_axes
        if batch and axes:
            split = self._batch_split(data_shape[0])
            axes[0] = (split[0] if len(split) == 1 else split) if split else None
        return MultiAxisLayout(axes, self.device_mesh)

    def _batch_split(self, size):
        """The batch axes a batch of `size` examples is split over (see `get_data_layout`)."""
        batch = self.dims.batch_axes
        if not isinstance(size, int) or size % self.dims.num_batch_shards == 0:
            return batch
        if jax.process_count() > 1:
            self._check_batch(size)
        return batch_split(size, {a: self.dims.axis_sizes[a] for a in batch})

    def _check_batch(self, size):
        shards = self.dims.num_batch_shards
        if not isinstance(size, int) or size % shards == 0:
            return
        axes = ", ".join(f"{a}={self.dims.axis_sizes[a]}" for a in self.dims.batch_axes)
        spec = f"kdist.preset({self.spec!r})" if self.spec else "this distribution"
        raise BatchSizeError(
            f"A batch of {size} example(s) does not divide over the {shards} batch shards of {spec} ({axes}), "
            f"so jax cannot split it, and in a run of {jax.process_count()} processes each process holds only its "
            f"share, so kdist cannot lay it out whole either. Use batches that are multiples of {shards} (e.g. "
            f"{-(-size // shards) * shards}): for fit/evaluate, a batch_size and a number of examples that divide; "
            f"for predict and generate, pad the inputs to a multiple of {shards} and drop the extra outputs; or use "
            "a mesh whose batch axes divide it (a model-parallel mesh such as 'tp' splits no batch)."
        )

    def distribute_tf_dataset(self, dataset):
        """Keras's per-process sharding of a batched tf.data dataset, keeping its known number of batches.

        Keras rebatches and shards the dataset so each process reads its piece
        of every global batch; the result's cardinality is unknown to
        tf.data, so every process warned "Your input ran out of data" at the
        end of its first epoch. Each process gets exactly one piece per global
        batch, so the count is the input's when its batches all have the same size.
        """
        import tensorflow as tf  # optional dependency: Keras calls this only for tf.data datasets

        batches = int(dataset.cardinality())
        distributed = super().distribute_tf_dataset(dataset)
        static = all(s.shape.rank and s.shape[0] is not None for s in tf.nest.flatten(dataset.element_spec))
        if batches >= 0 and static:
            distributed = distributed.apply(tf.data.experimental.assert_cardinality(batches))
        return distributed

    def get_variable_layout(self, variable):
        layout = own_layout(variable)
        if layout is not None:
            self.placements[variable.path] = Placement(
                variable.path,
                tuple(variable.shape),
                layout_axes(layout),
                "explicit",
                reason="the variable carried its own layout",
            )
            return layout
        placement = self.place(variable.path, variable.shape)
        self.placements[variable.path] = placement
        return MultiAxisLayout(placement.axes, self.device_mesh)

    def get_tensor_layout(self, path):
        axes = self.placer.activation(path)
        return None if axes is None else MultiAxisLayout(axes, self.device_mesh)

    def place(self, path, shape):
        """The `Placement` this distribution gives a variable, without creating it."""
        return self.placer.place(path, shape)

    def __repr__(self):
        return f"<ShardedDistribution spec={self.spec!r} mesh={self.dims.axis_sizes} rules={self.rules.name!r}>"


class MultiAxisLayout(TensorLayout):
    """A TensorLayout whose dimensions may be split over several mesh axes (a tuple of names).

    Every layout kdist gives; arrays laid out on it are committed to it (`keras_internals.commit_arrays_to`).
    """

    def _validate_axes(self):
        if self._device_mesh:
            flat = [a for axis in self._axes for a in (axis if isinstance(axis, tuple) else (axis,))]
            unknown = set(flat) - set(self._device_mesh.axis_names) - {None}
            if unknown:
                raise ValueError(f"Layout axes {sorted(unknown)} are not in mesh axes {self._device_mesh.axis_names}.")


def layout_axes(layout):
    """The axes of a Keras `TensorLayout` or of a jax `NamedSharding` (its spec), as a tuple."""
    if isinstance(layout, TensorLayout):
        return tuple(layout.axes)
    return tuple(getattr(layout, "spec", ()))


def _check_current_batch(per_process_batch, layout):
    """The layout of each input batch Keras lays out under a kdist distribution, when its size needs another.

    Keras reuses the first batch's layout for every batch; a batch of another
    size (a short last one) gets the layout `get_data_layout` gives its size.
    In a multi-process run, a batch that does not divide the batch axes is a
    kdist error.
    """
    distribution = keras.distribution.distribution()
    shape = getattr(per_process_batch, "shape", ())
    if not (isinstance(distribution, ShardedDistribution) and shape and distribution.dims.batch_axes):
        return None
    if jax.process_count() > 1:
        distribution._check_batch(int(shape[0]) * jax.process_count())
        return None
    split = distribution._batch_split(int(shape[0]))
    given = tuple(getattr(getattr(layout, "backend_layout", layout), "spec", None) or ())
    if given[:1] == ((split[0] if len(split) == 1 else split) or None,):
        return None  # the usual case, checked without building a layout
    return distribution.get_data_layout(tuple(int(d) for d in shape)).backend_layout
