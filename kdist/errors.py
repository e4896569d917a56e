"""Errors kdist raises. Each names the input at fault and what would fix it."""


class KdistError(Exception):
    """Base class of every kdist error."""


class BackendError(KdistError, RuntimeError):
    """Keras runs on a backend other than JAX."""


class FakeDevicesError(KdistError, RuntimeError):
    """Fake CPU devices were asked for after JAX had initialised."""


class SpecError(KdistError, ValueError):
    """A mesh spec string (e.g. "2x4") is malformed or does not fit the devices."""


class RuleError(KdistError, ValueError):
    """A layout rule cannot be applied to a variable or a mesh."""


class MissingDependencyError(KdistError, ImportError):
    """An optional dependency (keras-hub, orbax-checkpoint) is not installed."""
