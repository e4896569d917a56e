"""`Placement`: where one variable goes, and why. What every placement path of kdist returns."""

import dataclasses


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where one variable goes and why.

    `source` is "rule" (the rule's first layout fit), "fallback" (a later
    candidate, or indivisible dimensions replicated), "fsdp" (sharded on the
    fsdp axis by shape), "layout_map" (a Keras LayoutMap key), "explicit"
    (the variable carried its own layout), "preset" (the preset replicates
    weights on purpose: no model or expert axis) or "default" (no rule
    matched: replicated). `replicated_dims` lists the dimensions a rule
    meant to shard but had to replicate because no candidate divided them.
    """

    path: str
    shape: tuple
    axes: tuple
    source: str
    rule: object = None  # the kdist.Rule (or LayoutMap key) that placed it, if any
    reason: str = ""
    replicated_dims: tuple = ()  # dimensions replicated because no candidate layout divided them

    @property
    def sharded(self):
        return any(a is not None for a in self.axes)

    @property
    def pattern(self):
        """The placing rule's pattern (or LayoutMap key), "" when none."""
        return getattr(self.rule, "pattern", self.rule) or ""
