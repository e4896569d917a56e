"""Grid views: which slice of an array each device holds, drawn on a 2-D grid of mesh axes, for any rank."""

import dataclasses
import math

import jax
import keras
import numpy as np

from kdist.checks import shown
from kdist.devices import device_name
from kdist.distribution import layout_axes
from kdist.errors import ArgumentError
from kdist.inspection.device_grid import DeviceGrid
from kdist.keras_internals import array_of
from kdist.meshes.layout import check_layout, dim_axes, full_spec
from kdist.render.grid import grid_html, grid_table
from kdist.render.text import to_text


@dataclasses.dataclass
class GridView:
    """Which slice each device holds, laid out on mesh axes as rows and columns.

    Attributes:
        slices: device name -> ((start, stop), ...) per dimension.
        cells: rows of columns of device names.
    """

    path: str
    shape: tuple
    spec: tuple
    row_axes: tuple
    col_axes: tuple
    row_labels: list
    col_labels: list
    cells: list
    slices: dict

    def slice_text(self, device):
        """The slice `device` holds, e.g. "[0:2, :, 4:8]"."""
        return (
            "["
            + ", ".join(":" if (a, b) == (0, d) else f"{a}:{b}" for (a, b), d in zip(self.slices[device], self.shape))
            + "]"
        )

    def __rich_console__(self, console, options):
        yield grid_table(self)

    def _repr_html_(self):
        return grid_html(self)

    def __str__(self):
        return to_text(self)

    def __repr__(self):
        return f"<GridView {self.path} {self.shape} {self.spec}: rows {self.row_axes}, columns {self.col_axes}>"


def grid_view(x, rows=None, cols=None, *, distribution=None, name=None):
    """Show which slice of `x` each device holds, on a 2-D grid of mesh axes, for any rank.

    `jax.debug.visualize_array_sharding` draws only 1-D and 2-D arrays; this
    lays out any mesh's axes as rows and columns and writes, in each device's
    cell, the index range it holds along every dimension (":" = all of it).

    Example:

    ```python
    mesh = kdist.mesh("data=2,fsdp=2,model=2").backend_mesh
    x = jax.device_put(np.zeros((4, 6, 8)), NamedSharding(mesh, PartitionSpec("data", None, "model")))
    print(kdist.grid_view(x, rows=("data", "fsdp"), cols="model"))
    view = kdist.grid_view(x)
    view.slice_text("cpu:1")   # "[0:2, :, 4:8]"
    view.slices["cpu:1"]       # ((0, 2), (0, 6), (4, 8))
    ```

    Args:
        x: a sharded `jax.Array`, a Keras variable with a value, or an abstract
            Keras variable (laid out by `distribution`, default the current one).
        rows: mesh axis name(s) drawn as rows; defaults to every axis but the last.
        cols: mesh axis name(s) drawn as columns; defaults to the remaining axes.
        distribution: for abstract variables.
        name: title; defaults to the variable's path.

    Returns:
        A `GridView` (rich-printable, `str()` gives text, HTML in notebooks).
    """
    if name is not None and not isinstance(name, str):
        raise ArgumentError(f"name must be a title string or None; received name={shown(name)}.")
    path = name or getattr(x, "path", None) or "array"
    if not isinstance(x, jax.Array) and array_of(x) is not None:
        x = array_of(x)
    if isinstance(x, jax.Array):
        sharding = x.sharding
        if not isinstance(sharding, jax.sharding.NamedSharding):
            raise ArgumentError(
                f"grid_view needs an array with a NamedSharding; {path!r} has {type(sharding).__name__}. "
                "Place it with jax.device_put(x, NamedSharding(mesh, spec)) or a Keras distribution."
            )
        mesh = DeviceGrid.from_jax(sharding.mesh)
        indices = sharding.devices_indices_map(tuple(x.shape))
        slices = {
            device_name(d): tuple(s.indices(n)[:2] for s, n in zip(index, x.shape)) for d, index in indices.items()
        }
        return _grid(path, tuple(x.shape), full_spec(tuple(sharding.spec), len(x.shape)), mesh, slices, rows, cols)
    if not hasattr(x, "shape") or not hasattr(x, "path"):
        raise ArgumentError(f"grid_view needs a jax.Array or a Keras variable; received {type(x).__name__}.")
    distribution = distribution if distribution is not None else keras.distribution.distribution()
    if distribution is None:
        raise ArgumentError(
            f"grid_view received {shown(path)} without a value and no distribution: "
            f"pass distribution=kdist.preset(...)."
        )
    layout = distribution.get_variable_layout(x)
    spec = full_spec(layout_axes(layout), len(x.shape), x.path)
    return grid_from_layout(path, tuple(x.shape), spec, DeviceGrid.from_keras(distribution.device_mesh), rows, cols)


def grid_from_layout(path, shape, spec, mesh, rows=None, cols=None):
    """The `GridView` of a variable of `shape` laid out as `spec` on the `DeviceGrid` `mesh`."""
    check_layout(path, shape, spec, mesh.sizes)
    starts, stops = [], []
    for d, entry in zip(shape, spec):
        names = dim_axes(entry)
        chunk = -(-d // math.prod(mesh.sizes[a] for a in names))
        start = np.minimum(mesh.shard_index(names) * chunk, d)
        starts.append(start)
        stops.append(np.minimum(start + chunk, d))
    slices = {
        device: tuple((int(a[i]), int(b[i])) for a, b in zip(starts, stops)) for i, device in enumerate(mesh.devices)
    }
    return _grid(path, shape, spec, mesh, slices, rows, cols)


def _grid(path, shape, spec, mesh, slices, rows, cols):
    row_axes, col_axes = _grid_axes(mesh.axis_names, rows, cols)
    sizes = mesh.sizes
    order = list(row_axes) + list(col_axes)
    grid = np.transpose(mesh.grid, [mesh.axis_names.index(a) for a in order])
    grid = grid.reshape(math.prod(sizes[a] for a in row_axes), math.prod(sizes[a] for a in col_axes))
    cells = [[mesh.devices[i] for i in row] for row in grid]
    return GridView(
        path,
        tuple(shape),
        tuple(spec),
        row_axes,
        col_axes,
        _labels(row_axes, sizes),
        _labels(col_axes, sizes),
        cells,
        slices,
    )


def _grid_axes(names, rows, cols):
    rows, cols = _axis_tuple(rows), _axis_tuple(cols)
    for a in (rows or ()) + (cols or ()):
        if a not in names:
            raise ArgumentError(f"Mesh axis {a!r} is not in the mesh; its axes are {list(names)}.")
    if rows is None and cols is None:
        rows, cols = names[:-1], names[-1:]
    elif rows is None:
        rows = tuple(a for a in names if a not in cols)
    elif cols is None:
        cols = tuple(a for a in names if a not in rows)
    overlap = set(rows) & set(cols)
    missing = [a for a in names if a not in rows and a not in cols]
    if overlap or missing:
        raise ArgumentError(
            f"rows={rows} and cols={cols} must share no axis and cover every mesh axis {list(names)}"
            + (f"; {sorted(overlap)} is in both" if overlap else "")
            + (f"; {missing} is in neither" if missing else "")
            + "."
        )
    return rows, cols


def _axis_tuple(axes):
    if axes is None:
        return None
    return (axes,) if isinstance(axes, str) else tuple(axes)


def _labels(axes, sizes):
    if not axes:
        return [""]
    return [",".join(f"{a}={c}" for a, c in zip(axes, coords)) for coords in np.ndindex(*(sizes[a] for a in axes))]
