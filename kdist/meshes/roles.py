"""The roles a mesh axis plays. Rules and presets are written in roles, and bind to whatever the axes are called.

- `data`: the batch is split over it; weights are replicated along it.
- `fsdp`: the batch is split over it and weights and optimizer state are
  sharded along it too (ZeRO-3 style).
- `model`: weights are split over it by layout rules (tensor parallelism).
- `expert`: mixture-of-experts weights are split over it by layout rules.
"""

import enum


class Role(enum.StrEnum):
    """The part a mesh axis plays; compares equal to its name ("data" == Role.DATA)."""

    DATA = "data"
    FSDP = "fsdp"
    MODEL = "model"
    EXPERT = "expert"


ROLES = tuple(r.value for r in Role)
BATCH_ROLES = (Role.DATA.value, Role.FSDP.value)  # the batch is split over these
WEIGHT_ROLES = (Role.FSDP.value, Role.MODEL.value, Role.EXPERT.value)  # weights are split over these
RULE_ROLES = (Role.MODEL.value, Role.EXPERT.value)  # layout rules shard over these
# Keras's own examples call the data axis "batch".
ALIASES = {"batch": Role.DATA.value}


def role_of_name(name):
    """The role a mesh axis called `name` plays by its name ("batch" is data), or None."""
    name = ALIASES.get(name, name)
    return name if name in ROLES else None
