"""Layout rules and rule libraries."""

from kdist.rules.binding import bind_mesh
from kdist.rules.keras_core import KERAS_CORE
from kdist.rules.rule import Placement, Rule, RuleSet

__all__ = ["KERAS_CORE", "Placement", "Rule", "RuleSet", "bind_mesh"]
