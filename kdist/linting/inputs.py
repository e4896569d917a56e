"""What the linter reads: a model's variables (path, shape, bytes), its layer output paths, and a mesh."""

import dataclasses
import math

import jax

from kdist.checks import is_int, shown
from kdist.errors import ArgumentError, ArgumentTypeError, ModelError
from kdist.keras_internals import layers
from kdist.meshes.spec import ParallelDims, as_dims
from kdist.units import itemsize

# No accelerator holds a dimension of more elements than this; larger sizes are typos.
MAX_DIMENSION = 2**48


@dataclasses.dataclass(frozen=True)
class LintVariable:
    path: str
    shape: tuple
    nbytes: int


def lint_variables(obj):
    """`LintVariable`s of a model or layer, a list of variables, or `(path, shape[, dtype])` tuples."""
    items = obj.variables if hasattr(obj, "variables") and not isinstance(obj, (list, tuple, dict)) else obj
    items = items.items() if isinstance(items, dict) else items
    if not hasattr(items, "__iter__") or isinstance(items, (str, bytes)):
        raise ArgumentTypeError(
            "lint() needs a Keras model, its variables or (path, shape) tuples as model_or_variables; received "
            f"{type(obj).__name__} {shown(obj)} (the arguments are lint(rules, model_or_variables, mesh))."
        )
    out = []
    for item in items:
        if isinstance(item, tuple):
            if len(item) not in (2, 3):
                raise ArgumentTypeError(
                    f"A variable tuple is (path, shape) or (path, shape, dtype); received {shown(item)}."
                )
            path, shape, dtype = (*item, "float32") if len(item) == 2 else item
        elif hasattr(item, "path") and hasattr(item, "shape"):
            path, shape, dtype = item.path, item.shape, item.dtype
        else:
            raise ArgumentTypeError(
                f"lint() received {type(item).__name__} {shown(item)} where a variable or (path, shape) was expected."
            )
        out.append(_variable(path, shape, dtype))
    if not out:
        name = f" {obj.name!r}" if hasattr(obj, "name") else ""
        raise ModelError(
            f"lint() found no variables in {type(obj).__name__}{name}: build the model "
            "(give it an Input or call build()) before linting it, or pass its variables."
        )
    return out


def _variable(path, shape, dtype):
    """A `LintVariable`, or a kdist error naming the variable and what a path, shape and dtype must be."""
    if not isinstance(path, str) or not path:
        raise ArgumentTypeError(f"A variable's path must be a non-empty string; received {shown(path)}.")
    if isinstance(shape, (str, bytes)) or not hasattr(shape, "__iter__"):
        raise ArgumentTypeError(f"Variable {path!r}: shape must be a tuple of sizes; received {shown(shape)}.")
    shape = tuple(shape)
    if not all(is_int(d) and 0 <= d <= MAX_DIMENSION for d in shape):
        raise ArgumentError(
            f"Variable {path!r}: shape must hold integer sizes from 0 to {MAX_DIMENSION}; received {shown(shape)}."
        )
    try:
        size = itemsize(dtype)
    except TypeError:
        raise ArgumentError(
            f"Variable {path!r}: dtype must be a dtype such as 'float32' or 'bfloat16'; received {shown(dtype)}."
        ) from None
    return LintVariable(path, tuple(int(d) for d in shape), math.prod(int(d) for d in shape) * size)


def output_paths(obj):
    """ "<layer path>/output" for each layer: the paths Keras asks activation layouts for."""
    return [f"{layer.path}/output" for layer in layers(obj) if getattr(layer, "path", None)]


def lint_mesh(mesh, default=None, roles=None):
    """The `ParallelDims` to lint on: a spec (fixed sizes need no devices; -1 uses jax's count) or a Keras mesh."""
    if mesh is None:
        mesh = default
    if mesh is None:
        raise ModelError(
            "lint() needs a mesh for a RuleSet: pass mesh='2x4' (a kdist spec) or a keras.distribution.DeviceMesh."
        )
    if roles is not None and not isinstance(mesh, (str, ParallelDims)):
        return ParallelDims.from_device_mesh(mesh, roles)
    try:
        return as_dims(mesh)
    except Exception:
        if isinstance(mesh, str):
            return as_dims(mesh, jax.device_count())  # "dp", "data=-1,model=2": the devices there are
        raise
