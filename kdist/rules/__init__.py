"""Layout rules and rule libraries.

- `KERAS_CORE`: Keras core layers (Dense, EinsumDense, Embedding, Conv, MultiHeadAttention).
- `kdist.rules.hub.FAMILIES`: one rule set per keras-hub backbone family ("llama", "gemma", ...).
- `AUTO`: every family, then `KERAS_CORE` as the catch-all: the default of `kdist.preset`.
- `get_rules(name)`: any of these by name, or a `.json`/`.toml` rules file (`load_rules`).
"""

from kdist.rules.binding import bind_mesh
from kdist.rules.files import load_rules, save_rules
from kdist.rules.hub import AUTO, FAMILIES, with_lora
from kdist.rules.keras_core import KERAS_CORE
from kdist.rules.registry import RULE_SETS, get_rules
from kdist.rules.rule import Placement, Rule, RuleSet

__all__ = [
    "AUTO",
    "FAMILIES",
    "KERAS_CORE",
    "Placement",
    "RULE_SETS",
    "Rule",
    "RuleSet",
    "bind_mesh",
    "get_rules",
    "load_rules",
    "save_rules",
    "with_lora",
]
