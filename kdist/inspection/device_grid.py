"""A mesh with its devices: which device sits at each mesh position, by name ("cpu:3")."""

import dataclasses
import functools

import numpy as np

from kdist.devices import device_name, device_sort_key
from kdist.meshes.spec import ParallelDims


@dataclasses.dataclass
class DeviceGrid:
    """A mesh in report terms: its `ParallelDims`, device names sorted by id, and
    `grid`: each mesh position's index into `devices`."""

    dims: ParallelDims
    devices: list
    grid: np.ndarray

    @classmethod
    def from_keras(cls, device_mesh):
        return cls._of(ParallelDims.from_device_mesh(device_mesh), np.asarray(device_mesh.devices))

    @classmethod
    def from_jax(cls, mesh):
        return cls._of(ParallelDims.from_device_mesh(_JaxMeshAxes(mesh)), np.asarray(mesh.devices))

    @classmethod
    def _of(cls, dims, devices):
        flat = [device_name(d) for d in devices.ravel()]
        order = sorted(flat, key=device_sort_key)
        index = {d: i for i, d in enumerate(order)}
        return cls(dims, order, np.array([index[d] for d in flat]).reshape(dims.shape))

    @property
    def axis_names(self):
        return self.dims.names

    @property
    def sizes(self):
        return self.dims.axis_sizes

    @functools.cached_property
    def coords(self):
        """Mesh axis name -> each device's coordinate along it (devices in `devices` order)."""
        out = {name: np.zeros(len(self.devices), dtype=np.int64) for name in self.axis_names}
        for position, device in np.ndenumerate(self.grid):
            for name, c in zip(self.axis_names, position):
                out[name][device] = c
        return out

    def shard_index(self, axes):
        """Each device's shard index along a dimension split over mesh `axes` (major first)."""
        idx = np.zeros(len(self.devices), dtype=np.int64)
        for a in axes:
            idx = idx * self.sizes[a] + self.coords[a]
        return idx


@dataclasses.dataclass(frozen=True)
class _JaxMeshAxes:
    """A jax Mesh seen as axis names and a shape."""

    mesh: object

    @property
    def axis_names(self):
        return tuple(self.mesh.axis_names)

    @property
    def shape(self):
        return tuple(self.mesh.devices.shape)
