"""Layout rules, rule libraries and the placement engine.

- `Rule`, `RuleSet`: rules as data; `load_rules` / `save_rules`: rule files.
- `KERAS_CORE`: Keras core layers (Dense, EinsumDense, Embedding, Conv, MultiHeadAttention).
- `kdist.rules.hub.FAMILIES`: one rule set per keras-hub backbone family ("llama", "gemma", ...).
- `AUTO`: every family, then `KERAS_CORE` as the catch-all: the default of `kdist.preset`.
- `get_rules(name)`: any of these by name, or a `.json`/`.toml` rules file.
- `LayoutMapRules`: a Keras LayoutMap with Keras's own lookup.
- `Placer`: rules + shape fallbacks + FSDP on a mesh: where each variable goes.
"""

from kdist.rules.compose import AUTO, with_lora
from kdist.rules.files import load_rules, save_rules
from kdist.rules.hub import FAMILIES
from kdist.rules.keras_core import KERAS_CORE
from kdist.rules.layout_map import LayoutMapRules, to_layout_map
from kdist.rules.placement import Placement
from kdist.rules.placer import FSDP_MIN_SIZE, Placer
from kdist.rules.registry import RULE_SETS, get_rules, placer_for, resolve_rules
from kdist.rules.rule import Rule, RuleSet

__all__ = [
    "AUTO",
    "FAMILIES",
    "FSDP_MIN_SIZE",
    "KERAS_CORE",
    "LayoutMapRules",
    "Placement",
    "Placer",
    "RULE_SETS",
    "Rule",
    "RuleSet",
    "get_rules",
    "load_rules",
    "placer_for",
    "resolve_rules",
    "save_rules",
    "to_layout_map",
    "with_lora",
]
