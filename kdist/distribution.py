"""The Keras distribution behind every kdist preset: the placement engine's axes as Keras `TensorLayout`s."""

import dataclasses
import math

import jax
import keras
from jax.sharding import NamedSharding, PartitionSpec
from keras.distribution import DeviceMesh, LayoutMap, ModelParallel, TensorLayout

from kdist.cluster.engines import check_not_alone
from kdist.errors import ArgumentTypeError, BatchSizeError
from kdist.global_batches import gather_outputs, lay_out_global_batch
from kdist.keras_internals import (
    commit_arrays_to,
    constrain_outputs_with,
    gather_predictions_with,
    lay_out_batches_with,
    made_by_optimizer,
    own_layout,
)
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
        auto_shard_dataset: what every process passes to fit/evaluate/predict in a
            multi-process run: True (default), the same global data in every
            process (numpy arrays, tf.data, `kdist.make_dataset`), of which
            kdist feeds each process's rows; False, each process only its own
            rows of every global batch (see `kdist/global_batches.py`).

    Attributes:
        spec: the spec string the distribution was built from, if any.
        rules: the `RuleSet` (or `kdist.rules.LayoutMapRules`) in force.
        dims: the mesh as a `kdist.ParallelDims` (axis names, sizes, roles).
        roles: the role of each mesh axis ("data", "fsdp", "model", "expert").
        placer: the `kdist.rules.Placer` that decides every layout.
        placements: variable path -> `Placement`, for each variable laid out so far.
        shard_inputs: the `auto_shard_dataset` given (or set later): True when
            every process passes the global data and kdist takes each process's rows.
        auto_shard_dataset: what Keras reads: always False, since kdist, not
            Keras's data adapters, gives each process its rows (Keras would
            refuse numpy inputs in a multi-process run, and shard tf.data
            itself). Setting it sets `shard_inputs`.
    """

    def __init__(
        self, device_mesh, rules=None, *, roles=None, spec=None, fsdp_min_size=FSDP_MIN_SIZE, auto_shard_dataset=True
    ):
        if not isinstance(device_mesh, DeviceMesh):
            raise ArgumentTypeError(
                f"ShardedDistribution needs a keras.distribution.DeviceMesh (e.g. kdist.mesh('2x4')); "
                f"received {type(device_mesh).__name__}."
            )
        check_not_alone("a ShardedDistribution")  # one of several tasks of a job it has not joined: say so
        self.dims = ParallelDims.from_device_mesh(device_mesh, roles)
        self.placer = placer_for(rules, self.dims, fsdp_min_size=fsdp_min_size)
        self.spec = spec
        self.placements = {}
        if not isinstance(auto_shard_dataset, bool):
            raise ArgumentTypeError(f"auto_shard_dataset must be True or False; received {auto_shard_dataset!r}.")
        self.shard_inputs = auto_shard_dataset
        self._verify_next_batch = False
        names = self.dims.names
        super().__init__(
            layout_map=LayoutMap(device_mesh),
            batch_dim_name=self.dims.batch_axes[0] if self.dims.batch_axes else names[0],
            auto_shard_dataset=False,
        )
        lay_out_batches_with(_lay_out_batch)
        gather_predictions_with(gather_outputs)
        constrain_outputs_with(BatchShardedOutputs, _constrain_outputs)
        commit_arrays_to(MultiAxisLayout)  # else, on one device, jit compiles Keras's steps again (see there)

    @property
    def auto_shard_dataset(self):
        return False

    @auto_shard_dataset.setter
    def auto_shard_dataset(self, value):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"auto_shard_dataset must be True or False; received {value!r}.")
        self.shard_inputs = value

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
        self._verify_next_batch = True  # Keras asks once per epoch, for the first batch
        axes = [None] * len(data_shape)
        batch = self.dims.batch_axes
        if batch and axes:
            split = self._batch_split(self._global_batch_size(data_shape[0]))
            axes[0] = (split[0] if len(split) == 1 else split) if split else None
        return MultiAxisLayout(axes, self.device_mesh)

    def _global_batch_size(self, size):
        """The global batch size for a batch of `size` this process passes (its own rows if not shard_inputs)."""
        if self.shard_inputs or not isinstance(size, int):
            return size
        return size * jax.process_count()

    def _batch_split(self, size):
        """The batch axes a global batch of `size` examples is split over (see `get_data_layout`)."""
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

    def distribute_input(self, batch, layout, keras_lay_out):
        """The global array of one input batch of fit/evaluate/predict (Keras passes each batch here).

        In one process, or with `shard_inputs` False (each process passes its
        own rows), Keras's own layout; otherwise each process passes the whole
        global batch and supplies its devices' rows of it. Checks that the batch
        divides over the batch axes (a single-process batch that does not is
        laid out as `get_data_layout` says), and on the first batch of each
        epoch that every process passed the same data.

        Raises:
            BatchSizeError: the global batch does not divide over the batch axes.
            ArgumentError: the processes passed different data (with `shard_inputs`).
        """
        shape = getattr(batch, "shape", ())
        if shape and self.dims.batch_axes:
            layout = self._layout_for(tuple(int(d) for d in shape), layout)
        if jax.process_count() == 1 or not self.shard_inputs:
            return keras_lay_out(batch, layout)
        verify, self._verify_next_batch = self._verify_next_batch, False
        return lay_out_global_batch(batch, layout, verify)

    def _layout_for(self, shape, layout):
        """Keras's `layout` for a batch of `shape`, or the one its size needs (Keras reuses the first batch's)."""
        size = self._global_batch_size(shape[0])
        split = self._batch_split(size)  # in a multi-process run, a BatchSizeError unless it divides
        given = tuple(getattr(getattr(layout, "backend_layout", layout), "spec", None) or ())
        if given[:1] == ((split[0] if len(split) == 1 else split) or None,):
            return layout  # the usual case, checked without building a layout
        axes = [None] * len(shape)
        axes[0] = (split[0] if len(split) == 1 else split) if split else None
        return MultiAxisLayout(axes, self.device_mesh).backend_layout

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
        own_state = getattr(variable, "optimizer_state", False) is True or made_by_optimizer()  # see resharding
        placement = self.placer.place(variable.path, variable.shape, optimizer_state=own_state)
        self.placements[variable.path] = placement
        return MultiAxisLayout(placement.axes, self.device_mesh)

    def get_tensor_layout(self, path):
        """The layout of the activation at `path`: the rules' (Keras's meaning), else under fsdp the batch split.

        With an fsdp axis, a layer output no rule lays out is
        `BatchShardedOutputs`: its first dimension split over the batch axes,
        the others left to XLA. Without it XLA:GPU may meet a weight split over
        fsdp on a matmul's contracting dimension by gathering the activation
        over fsdp instead of the weight (deviceless 8 x H100: Llama and GPT-2 on
        fsdp=4,model=2 peaked at 1.27 and 1.26 GB per device, 0.77 and 0.74 GB
        with it; docs/plan.md, "Activations under fsdp").
        """
        axes = self.placer.activation(path)
        if axes is not None:
            return MultiAxisLayout(axes, self.device_mesh)
        if self.dims.fsdp_enabled and path.endswith("/output"):
            return BatchShardedOutputs((tuple(self.dims.batch_axes),), self.device_mesh)
        return None

    def place(self, path, shape):
        """The `Placement` this distribution gives a variable, without creating it."""
        return self.placer.place(path, shape)

    def __repr__(self):
        inputs = "" if self.shard_inputs else " auto_shard_dataset=False"
        return f"<ShardedDistribution spec={self.spec!r} mesh={self.dims.axis_sizes} rules={self.rules.name!r}{inputs}>"


class MultiAxisLayout(TensorLayout):
    """A TensorLayout whose dimensions may be split over several mesh axes (a tuple of names).

    Every layout kdist gives a variable, a batch or a rule's activation; arrays laid out on it are committed to it
    (`keras_internals.commit_arrays_to`).
    """

    def _validate_axes(self):
        if self._device_mesh:
            flat = [a for axis in self._axes for a in (axis if isinstance(axis, tuple) else (axis,))]
            unknown = set(flat) - set(self._device_mesh.axis_names) - {None}
            if unknown:
                raise ValueError(f"Layout axes {sorted(unknown)} are not in mesh axes {self._device_mesh.axis_names}.")


@dataclasses.dataclass(frozen=True)
class BatchShardedOutputs:
    """A layer output's layout: its first dimension split over the batch axes (`axes[0]`), every other left to XLA.

    Not a `TensorLayout`: one of those fixes every dimension of one rank, and
    Keras would put an eager output on it; this one only guides XLA under jit.
    """

    axes: tuple
    device_mesh: DeviceMesh


def _constrain_outputs(outputs, layout):
    """`outputs` (any structure) under jit with each batch-sized array's first dimension split as `layout` says.

    An array whose first dimension the batch shards do not divide (a batch laid
    out replicated, a scalar) and eager values are left as they are: the
    constraint only tells XLA where the batch is while it partitions the step.
    """
    batch_axes = layout.axes[0]
    mesh = layout.device_mesh.backend_mesh
    shards = math.prod(mesh.shape[a] for a in batch_axes)

    def constrain(x):
        if not isinstance(x, jax.core.Tracer) or not x.ndim or x.shape[0] % shards:
            return x
        spec = PartitionSpec(batch_axes, *[PartitionSpec.UNCONSTRAINED] * (x.ndim - 1))
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))

    return jax.tree.map(constrain, outputs)


def layout_axes(layout):
    """The axes of a Keras `TensorLayout` or of a jax `NamedSharding` (its spec), as a tuple."""
    if isinstance(layout, TensorLayout):
        return tuple(layout.axes)
    return tuple(getattr(layout, "spec", ()))


def _lay_out_batch(batch, layout, keras_lay_out):
    """Every input batch Keras lays out: a kdist distribution's own way, Keras's under any other."""
    distribution = keras.distribution.distribution()
    if isinstance(distribution, ShardedDistribution):
        return distribution.distribute_input(batch, layout, keras_lay_out)
    return keras_lay_out(batch, layout)
