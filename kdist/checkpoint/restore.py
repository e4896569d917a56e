"""Loads that change nothing when they fail: every variable is put back, bitwise, on any error.

`unchanged_on_failure(variables)` keeps a reference to each variable's array
(JAX arrays are immutable, so this copies nothing) and assigns it back if
the block raises. `load_keras_file` wraps Keras's `model.load_weights` of a
`.weights.h5` / `.keras` file in it, after checking that the file is
readable (a `.keras` archive's CRCs, an HDF5 signature).
"""

import contextlib
import os
import zipfile

from kdist.errors import CheckpointError, cause
from kdist.keras_internals import array_of


@contextlib.contextmanager
def unchanged_on_failure(variables):
    """Put every variable back to the array it held (bitwise, same sharding) if the block raises.

    Example:

    ```python
    with unchanged_on_failure(model.variables):
        model.load_weights("other.weights.h5")   # raises: no variable has changed
    ```
    """
    before = [(v, array_of(v)) for v in variables]
    try:
        yield
    except BaseException:
        for v, value in before:
            if value is not None and array_of(v) is not value:
                v.assign(value)
        raise


def assign_all(current, values):
    """Assign each `values[key]` to `current[key]`; if one assignment fails, every variable is put back."""
    with unchanged_on_failure([current[k] for k in values]):
        for key, value in values.items():
            current[key].assign(value)


def load_keras_file(model, path):
    """`model.load_weights(path)` of a Keras weights file, all or nothing; returns the report of `load_sharded`.

    Raises:
        CheckpointError: the file is missing, unreadable, or does not fit the
            model; every variable keeps its value.
    """
    if not os.path.isfile(path):
        raise CheckpointError(f"No weights file at {path!r}.")
    check_keras_file(path)
    optimizer = getattr(model, "optimizer", None)
    variables = list({id(v): v for v in [*model.variables, *(optimizer.variables if optimizer else [])]}.values())
    before = {id(v): array_of(v) for v in variables}
    with unchanged_on_failure(variables):
        try:
            model.load_weights(path)
        except Exception as e:
            raise CheckpointError(f"Cannot load {path!r} into model {model.name!r}: {first_line(e)}") from e
    loaded = sorted(v.path for v in variables if array_of(v) is not before[id(v)])
    unchanged = sorted(v.path for v in variables if array_of(v) is before[id(v)])
    return {"loaded": loaded, "skipped": [], "not_in_checkpoint": unchanged}


def check_keras_file(path):
    """Raise CheckpointError unless `path` is a readable `.keras` archive (every CRC checked) or HDF5 file."""
    if path.endswith(".keras"):
        try:
            with zipfile.ZipFile(path) as archive:
                bad = archive.testzip()  # reads every member and checks its CRC
        except (zipfile.BadZipFile, OSError, EOFError) as e:
            raise CheckpointError(f"{path!r} is not a readable .keras archive (truncated or corrupted?): {e}") from e
        if bad is not None:
            raise CheckpointError(f"{path!r} is corrupted: the CRC of its member {bad!r} does not match its data.")
        return
    with open(path, "rb") as f:
        signature = f.read(8)
    if signature != b"\x89HDF\r\n\x1a\n":
        raise CheckpointError(f"{path!r} is not an HDF5 weights file (truncated or corrupted?).")


def first_line(error):
    """The innermost cause of an error as "Type: first line of its message", for wrapping another library's error."""
    seen = {id(error)}
    while (inner := error.__cause__ or error.__context__) is not None and id(inner) not in seen:
        seen.add(id(inner))
        error = inner
    return cause(error, lines=1, limit=500)
