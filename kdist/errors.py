"""Every error kdist raises, one class per kind of fault.

Each message names the input at fault (argument and value), says what was
wrong and what would be accepted instead. The class docstrings below say the
usual cause and the fix. Errors about a bad value are `ValueError`s, about a
value of the wrong kind `TypeError`s, so `except ValueError` keeps working.
"""

import re

_TERMINAL_CODES = re.compile(r"\x1b\[[0-9;]*m")


def cause(error, lines=None, limit=None):
    """`error` as "Type: message" for a kdist message, without the terminal colour codes Keras puts in its own.

    `lines`: only the message's first `lines` non-blank lines, joined by spaces; `limit`: at most `limit` characters.
    Where Keras's traceback filter failed while re-raising (an AttributeError about `_error_repr`, Keras 3.15), the
    error it was re-raising.
    """
    while isinstance(error, AttributeError) and "_error_repr" in str(error) and error.__context__ is not None:
        error = error.__context__
    message = _TERMINAL_CODES.sub("", str(error))
    if lines is not None:
        message = " ".join([line.strip() for line in message.splitlines() if line.strip()][:lines])
    return f"{type(error).__name__}: {message[:limit]}"


class KdistError(Exception):
    """Base class of every kdist error."""


class ArgumentError(KdistError, ValueError):
    """An argument has a value outside what the function accepts.

    Cause: a count that is not positive, a timeout below zero, an unknown
    option. Fix: the message names the argument, the value and the range.
    """


class ArgumentTypeError(KdistError, TypeError):
    """An argument is of the wrong kind (a dict where a layout tuple is expected, ...).

    Fix: pass one of the kinds the message lists.
    """


class BackendError(KdistError, RuntimeError):
    """Keras runs, or is set to run, on a backend other than JAX.

    Fix: import kdist before keras, or set KERAS_BACKEND=jax before Python starts.
    """


class FakeDevicesError(KdistError, RuntimeError):
    """Fake CPU devices were asked for after JAX had initialised its devices.

    Fix: call `kdist.fake_devices(n)` (or set KDIST_FAKE_DEVICES) before
    anything imports jax or keras, or pass `--fake-devices N` to `kdist`.
    """


class SpecError(KdistError, ValueError):
    """A mesh spec ("2x4", "dp", "data=2,model=4"), device list or axis names cannot form a mesh.

    Fix: use sizes that multiply to the device count, known axis names and
    existing devices; the message lists the accepted forms.
    """


class RuleError(KdistError, ValueError):
    """A layout rule, rule file or LayoutMap cannot be applied to a variable or a mesh.

    Cause: an invalid regex, a layout of higher rank than the variable, an
    axis the mesh lacks, a dimension its mesh axis does not divide, or a path
    that matches several LayoutMap keys. Fix: the message names the rule (or
    key) and the variable.
    """


class SizeError(KdistError, ValueError):
    """A memory size or bandwidth such as "80GB" could not be read.

    Fix: give bytes (an int), "80GB" (10**9), "80GiB" (2**30) or "8e10".
    """


class ModelError(KdistError, ValueError):
    """The object given as a model cannot be used: not a Keras model, not built, or without variables.

    Fix: build the model (give it an `keras.Input` or call it on data), or
    build it abstractly with `kdist.abstract_model`.
    """


class PlanError(KdistError, ValueError):
    """The planner received input it cannot plan for, or has no recommendation to give.

    Fix: the message says what to pass instead (a batch size the batch
    shards divide, a model with an input graph, ...).
    """


class BatchSizeError(KdistError, ValueError):
    """A batch size, dataset or fit input does not divide over the distribution's replicas or processes.

    Fix: use a multiple of the batch shards (the message names the nearest
    sizes), or `kdist.global_batch_size(per_replica_batch_size)`.
    """


class CheckpointError(KdistError, ValueError):
    """A checkpoint, weights file or backup cannot be written, read, or does not match the model.

    Nothing is changed when it is raised: a failed load leaves every variable
    as it was, and a refused save deletes nothing. Fix: the message names the
    file and what differs.
    """


class ReshardError(KdistError, ValueError):
    """A model cannot be moved onto the target distribution; nothing was moved.

    Fix: the message names the variable and the layout that cannot hold it.
    """


class ClusterError(KdistError, ValueError):
    """A cluster configuration (arguments, KERAS_DISTRIBUTION_* or TF_CONFIG) is malformed or inconsistent.

    Fix: the message names the variable or argument at fault.
    """


class LaunchError(KdistError, ValueError):
    """The launcher was given an unusable command, process count, timeout or address (a run's failure is its result).

    Fix: the message names the argument and the accepted values.
    """


class VersionError(KdistError, ImportError):
    """The installed Keras or jax lacks an internal that kdist relies on (it changed since the version kdist checked).

    Fix: install the versions in kdist's constraints.txt (`pip install -c constraints.txt ...`); the message
    names the missing internal and the version kdist was checked against.
    """


class MissingDependencyError(KdistError, ImportError):
    """An optional dependency (keras-hub, orbax-checkpoint, matplotlib, tensorflow) is not installed.

    Fix: run the install command the message gives.
    """
