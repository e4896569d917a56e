"""Binding rule roles ("data", "model", ...) to the axes of a concrete mesh."""

from kdist.parallel_dims import ROLES

# Keras's own examples call the data axis "batch".
_ROLE_ALIASES = {"batch": "data"}


def bind_mesh(device_mesh, roles=None):
    """Map each role and each mesh axis name to `(mesh axis name, size)`.

    Example:

    >>> bind_mesh(keras.distribution.DeviceMesh((2, 4), ["batch", "model"]))
    {'batch': ('batch', 2), 'model': ('model', 4), 'data': ('batch', 2)}

    Args:
        device_mesh: a `keras.distribution.DeviceMesh`.
        roles: the role of each mesh axis, in order. Defaults to the axis names
            themselves where they are roles ("batch" counts as "data").
    """
    names = tuple(device_mesh.axis_names)
    sizes = tuple(device_mesh.shape)
    if roles is None:
        roles = tuple(_ROLE_ALIASES.get(n, n) if _ROLE_ALIASES.get(n, n) in ROLES else None for n in names)
    binding = {name: (name, size) for name, size in zip(names, sizes)}
    for role, name, size in zip(roles, names, sizes):
        if role is not None:
            binding[role] = (name, size)
    return binding
