"""Composing rule sets: merging families into one ordered set ("auto"), and sharding LoRA adapters on request."""

import dataclasses

from kdist.rules.hub import FAMILIES
from kdist.rules.keras_core import KERAS_CORE
from kdist.rules.rule import Rule, RuleSet


def merge(rule_sets, name):
    """One ordered rule set made of `rule_sets`; rules repeated verbatim appear once, tagged with every family."""
    merged, families = {}, {}
    for rule_set in rule_sets:
        for rule in rule_set:
            key = (rule.pattern, rule.layouts, rule.follows, rule.fsdp_dim)
            merged.setdefault(key, rule)
            tags = families.setdefault(key, [])
            for family in rule.families or (rule_set.name,):
                if family not in tags:
                    tags.append(family)
    return RuleSet([dataclasses.replace(r, family=",".join(families[k])) for k, r in merged.items()], name=name)


def with_lora(rule_set):
    """`rule_set` with LoRA adapters sharded like their kernels instead of replicated.

    Each adapter follows its kernel's actual placement, fallbacks included:
    `lora_kernel_a` (the kernel's leading dimensions and the rank) takes the
    kernel's leading axes, `lora_kernel_b` (the rank and the kernel's last
    dimension) its last axis. Where the kernel has not been placed (a
    `RuleSet.place` call on its own), the adapter's candidates derive from the
    kernel rule's layouts: `(a, ..., y, z)` gives `(a, ..., y, None)` and `(None, z)`.

    Example:

    >>> rules = with_lora(FAMILIES["llama"])
    >>> rules.place("transformer_layer_0/self_attention/query/lora_kernel_a", (64, 8, 4), "1x4").axes
    (None, 'model', None)
    """
    lora = []
    for rule in rule_set:
        if rule.pattern.endswith("kernel") and not rule.replicates:
            stem = rule.pattern[: -len("kernel")]
            note = f"LoRA adapter of: {rule.note}"
            a = _distinct([_lora_a(layout) for layout in rule.layouts])
            b = _distinct([_lora_b(layout) for layout in rule.layouts])
            lora.append(Rule(stem + "lora_kernel_a", a, note, rule.family, ("kernel", "leading")))
            lora.append(Rule(stem + "lora_kernel_b", b, note, rule.family, ("kernel", "last")))
    return RuleSet([*lora, *rule_set], name=f"{rule_set.name}+lora")


def _distinct(layouts):
    return list(dict.fromkeys(layouts))


def _lora_a(layout):
    if not layout or layout[-1] == "...":
        return layout
    return (*layout[:-1], None)


def _lora_b(layout):
    if not layout or layout[-1] == "...":
        return ()
    return (None, layout[-1])


AUTO = merge(
    [
        *FAMILIES.values(),
        RuleSet([dataclasses.replace(r, family="keras-core") for r in KERAS_CORE], "keras-core"),
    ],
    "auto",
)
