"""Rule sets by name ("auto", "keras-core", keras-hub families, rule files) and the `rules=` argument."""

import pathlib

from keras.distribution import LayoutMap

from kdist.checks import shown
from kdist.errors import ArgumentTypeError, RuleError
from kdist.meshes.roles import RULE_ROLES
from kdist.rules.compose import AUTO, with_lora
from kdist.rules.files import FORMATS, load_rules
from kdist.rules.hub import FAMILIES
from kdist.rules.keras_core import KERAS_CORE
from kdist.rules.layout_map import LayoutMapRules
from kdist.rules.placer import FSDP_MIN_SIZE, Placer
from kdist.rules.rule import RuleSet

RULE_SETS = {"auto": AUTO, "keras-core": KERAS_CORE, **FAMILIES}
NO_RULES = RuleSet(name="none")  # presets without a model or expert axis


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
        lora: shard LoRA adapters like their kernels (see `kdist.rules.with_lora`)
            instead of replicating them.
    """
    if not isinstance(name, (str, pathlib.Path)):
        raise ArgumentTypeError(
            f"A rule set name must be a string or a path; received {type(name).__name__} {shown(name)}."
        )
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


def resolve_rules(rules, dims):
    """The rules object a preset on mesh `dims` uses for a `rules=` argument.

    None and "auto" give `AUTO` on meshes with a model or expert axis, and no
    rules otherwise (data-parallel and fsdp meshes replicate weights, or shard
    them by shape); a name or file path gives that rule set; a `RuleSet` is
    used as it is; a Keras `LayoutMap` (or a dict of layout keys) keeps
    Keras's lookup (`LayoutMapRules`); a list of `(pattern, layouts)` pairs
    becomes a `RuleSet`.
    """
    if rules is None or (isinstance(rules, str) and rules == "auto"):
        return AUTO if any(role in dims.roles for role in RULE_ROLES) else NO_RULES
    if isinstance(rules, (str, pathlib.PurePath)):
        return get_rules(rules)
    if isinstance(rules, (RuleSet, LayoutMapRules)):
        return rules
    if isinstance(rules, (LayoutMap, dict)):
        layout_map = LayoutMapRules(rules)
        layout_map.check_regexes()
        return layout_map
    if isinstance(rules, (list, tuple)):
        return RuleSet(rules)
    raise ArgumentTypeError(
        "rules must be a kdist.RuleSet, a keras.distribution.LayoutMap (or a dict of its keys), a list of "
        "(pattern, layouts) pairs, a rule set name or rules file path, None or 'auto'; "
        f"received {type(rules).__name__}."
    )


def placer_for(rules, dims, *, fsdp_min_size=FSDP_MIN_SIZE):
    """The `Placer` of a preset on mesh `dims` with a `rules=` argument (see `resolve_rules`)."""
    resolved = resolve_rules(rules, dims)
    reason = None
    if resolved is NO_RULES:
        what = "shards them over fsdp by shape" if dims.fsdp_enabled else "replicates them"
        reason = f"no model or expert axis: the preset {what}"
    hints = AUTO if resolved is NO_RULES else None  # where the fsdp axis goes on an expert kernel
    return Placer(resolved, dims, fsdp_min_size=fsdp_min_size, replicate_reason=reason, fsdp_hints=hints)
