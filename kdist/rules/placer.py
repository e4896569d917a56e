"""The one placement engine: rules (or a Keras LayoutMap), shape fallbacks and FSDP, on a mesh without devices.

`Placer(rules, dims).place(path, shape)` is what every path of kdist asks:
the Keras adapter (`kdist.ShardedDistribution`), the linter, the planner and
the inspector's abstract path. It needs no devices, only a `ParallelDims`.
"""

import dataclasses
import math

from kdist.errors import RuleError
from kdist.meshes.layout import ELLIPSIS, fits_rank
from kdist.meshes.roles import Role
from kdist.rules.layout_map import LayoutMapRules
from kdist.rules.placement import Placement
from kdist.rules.rule import Rule, RuleSet

# Variables with fewer elements than this stay replicated on the fsdp axis:
# gathering them costs more than the memory they would save.
FSDP_MIN_SIZE = 4096

DEPTHWISE = (
    "a depthwise convolution's kernel (h, w, channels, 1) or (h, w, 1, channels): with its channels split over "
    "{axis}, XLA:GPU reshards the activations to that split instead of gathering the kernel; replicated over {axis}"
)


class Placer:
    """Lays out variables by `rules` on mesh `dims`, then shards them over an fsdp axis by shape.

    Example:

    >>> from kdist.meshes import ParallelDims
    >>> from kdist.rules import KERAS_CORE
    >>> placer = Placer(KERAS_CORE, ParallelDims.parse("2x4", 8))
    >>> placer.place("mlp/d1/kernel", (784, 200)).axes
    (None, 'model')

    Args:
        rules: a `RuleSet` (ordered, first match wins, candidates fall back
            by shape) or a `LayoutMapRules` (a Keras LayoutMap, Keras's lookup).
        dims: the mesh, a `kdist.ParallelDims`.
        fsdp_min_size: variables with fewer elements stay replicated over fsdp.
        replicate_reason: when given, variables no rule matches are
            "replicated by the preset" for this reason (e.g. "dp" has no model
            axis) rather than "no rule matched".
        fsdp_hints: a `RuleSet` whose matching rule's `fsdp_dim` says where
            the fsdp axis goes on a variable `rules` did not lay out (a preset
            without a model axis applies no rules, yet an expert kernel takes
            fsdp on its hidden size).
    """

    def __init__(self, rules, dims, *, fsdp_min_size=FSDP_MIN_SIZE, replicate_reason=None, fsdp_hints=None):
        if not isinstance(rules, (RuleSet, LayoutMapRules)):
            raise RuleError(f"Placer needs a RuleSet or LayoutMapRules; received {type(rules).__name__}.")
        self.rules = rules
        self.dims = dims
        self.fsdp_min_size = fsdp_min_size
        self.replicate_reason = replicate_reason
        self.fsdp_hints = fsdp_hints
        self._placements = {}  # (path, shape) -> Placement
        self._by_path = {}  # path -> axes before fsdp, for rules that follow a sibling
        self._matches = {}  # path -> rule (RuleSet only)

    def place(self, path, shape, optimizer_state=False):
        """The `Placement` of a variable of `shape` at `path`.

        `optimizer_state`: the variable is an optimizer's own (Adafactor's
        factored moments are named after their weight, one dimension short;
        slots made from a weight carry its layout and never come here). A
        rule of a `RuleSet` that lays out only higher ranks leaves it
        replicated, saying so, where for a weight it raises a `RuleError`.
        """
        key = (path, tuple(int(d) for d in shape))
        placement = self._placements.get(key)
        if placement is None:
            by_rules = self._by_rules(*key, optimizer_state)
            self._by_path[path] = by_rules.axes
            placement = self._placements[key] = self._fsdp(by_rules)
        return placement

    def match(self, path):
        """What lays out `path` (cached): a `RuleSet`'s `Rule` or a LayoutMap key; None when nothing matches."""
        if path not in self._matches:
            if isinstance(self.rules, RuleSet):
                self._matches[path] = self.rules.match(path)
            else:
                found = self.rules.lookup(path)
                self._matches[path] = found[0] if found else None
        return self._matches[path]

    def activation(self, path):
        """The layout (mesh axis names) of the activation at `path` ("<layer path>/output"), or None."""
        if isinstance(self.rules, LayoutMapRules):
            return self.rules.activation(path, self.dims)
        rule = next((r for r in self.rules if r.for_activations and r.matches(path)), None)
        if rule is None:
            return None
        layout = rule.layouts[0]
        if ELLIPSIS in layout:
            raise RuleError(
                f"Rule {rule.pattern!r} lays out activations, whose rank it cannot know: write it without '...'."
            )
        return rule.bind(layout, self.dims)

    def _by_rules(self, path, shape, optimizer_state=False):
        if isinstance(self.rules, LayoutMapRules):
            placement = self.rules.place(path, shape, self.dims)
        else:
            rule = self.match(path)
            if optimizer_state and rule is not None and not any(fits_rank(x, len(shape)) for x in rule.layouts):
                reason = f"optimizer state of rank {len(shape)}; rule {rule.pattern!r} lays out weights of higher rank"
                placement = Placement(path, shape, (None,) * len(shape), "default", reason=reason)
            else:
                placement = rule.place(path, shape, self.dims, self._by_path) if rule is not None else None
        if placement is None or placement.source == "default":
            if self.replicate_reason:
                return Placement(path, shape, (None,) * len(shape), "preset", reason=self.replicate_reason)
            return placement or Placement(path, shape, (None,) * len(shape), "default", reason="no rule matched")
        return placement

    def _fsdp(self, placement):
        """`placement` also sharded over the fsdp axis: on its rule's `fsdp_dim` when free and dividing, else on
        its largest free dimension that divides; a depthwise convolution's kernel only where a rule names the
        dimension."""
        if not self.dims.fsdp_enabled:
            return placement
        axis, size = self.dims.name_of(Role.FSDP), self.dims.size_of(Role.FSDP)
        shape, axes = placement.shape, placement.axes
        if axis in axes or math.prod(shape) < self.fsdp_min_size:
            return placement
        preferred = self._preferred_fsdp_dim(placement)
        free = [i for i, a in enumerate(axes) if a is None and shape[i] % size == 0]
        if preferred is None and _depthwise_kernel(placement):
            return _with_reason(placement, DEPTHWISE.format(axis=axis))
        if not free:
            return _with_reason(
                placement, f"no unsharded dimension of {shape} divides by {axis}={size}: replicated over {axis}"
            )
        dim = preferred if preferred in free else max(free, key=lambda i: shape[i])
        new_axes = tuple(axis if i == dim else a for i, a in enumerate(axes))
        source = "fsdp" if placement.source in ("default", "preset") else placement.source
        reason = placement.reason if source != "fsdp" else ""
        return dataclasses.replace(placement, axes=new_axes, source=source, reason=reason)

    def _preferred_fsdp_dim(self, placement):
        """The dimension (from 0) that `placement`'s rule, or else the fsdp hints, name for the fsdp axis; or None."""
        rank, placed_by = len(placement.shape), placement.rule if isinstance(placement.rule, Rule) else None
        preferred = placed_by.fsdp_dim if placed_by is not None else None
        if preferred is not None and not -rank <= preferred < rank:
            raise RuleError(
                f"Rule {placement.pattern!r} has fsdp_dim {preferred}, out of range for variable "
                f"{placement.path!r} of shape {placement.shape}; give a dimension of a rank-{rank} variable."
            )
        if placed_by is None and self.fsdp_hints is not None:  # a hint that does not fit the variable is no hint
            hint = self.fsdp_hints.match(placement.path)
            preferred = hint.fsdp_dim if hint is not None and -rank <= (hint.fsdp_dim or 0) < rank else None
        return None if preferred is None else preferred % rank


def _with_reason(placement, reason):
    return dataclasses.replace(placement, reason="; ".join(r for r in (placement.reason, reason) if r))


def _depthwise_kernel(placement):
    """Whether `placement` is a 2-D depthwise convolution's kernel: a Keras conv kernel (h, w, in, out) with one
    channel per group in or out (DepthwiseConv2D's (h, w, channels, 1), Conv2D groups=channels' (h, w, 1, filters))."""
    name, shape = placement.path.rsplit("/", 1)[-1], placement.shape
    return name in ("kernel", "depthwise_kernel") and len(shape) == 4 and 1 in shape[2:]
