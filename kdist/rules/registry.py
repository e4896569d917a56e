"""Rule sets by name: "auto", "keras-core", the keras-hub families, or a rules file."""

import pathlib

from kdist.errors import RuleError
from kdist.rules.files import FORMATS, load_rules
from kdist.rules.hub import AUTO, FAMILIES, with_lora
from kdist.rules.keras_core import KERAS_CORE

RULE_SETS = {"auto": AUTO, "keras-core": KERAS_CORE, **FAMILIES}


def get_rules(name, *, lora=False):
    """The rule set `name` names: a key of `RULE_SETS` or the path of a `.json`/`.toml` rules file.

    Example:

    ```python
    rules = kdist.get_rules("llama")                 # keras-hub Llama backbones
    rules = kdist.get_rules("auto", lora=True)       # every family; LoRA adapters sharded
    rules = kdist.get_rules("configs/rules.toml")    # a rules file
    ```

    Args:
        name: a rule set name ("auto", "keras-core", "llama", "gemma", ...) or a file path.
        lora: shard LoRA adapters like their kernels (see `kdist.rules.hub.with_lora`)
            instead of replicating them.
    """
    if not isinstance(name, (str, pathlib.Path)):
        raise TypeError(f"A rule set name must be a string or a path; received {type(name).__name__} {name!r}.")
    key = str(name)
    if key in RULE_SETS:
        rules = RULE_SETS[key]
    elif pathlib.Path(key).suffix.lower() in FORMATS:
        rules = load_rules(key)
    else:
        raise RuleError(
            f"Unknown rule set {key!r}. Name one of {', '.join(sorted(RULE_SETS))}, "
            f"or give the path of a rules file ({' or '.join(FORMATS)})."
        )
    return with_lora(rules) if lora else rules
