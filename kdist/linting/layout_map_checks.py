"""Linting a Keras `LayoutMap` with Keras's own semantics: the lookup presets share (`LayoutMapRules`)."""

import math
import re

from kdist.linting.findings import ERROR, WARNING, Finding, partial_finding, partial_match
from kdist.meshes.layout import dim_axes, unknown_axes
from kdist.rules.layout_map import LayoutMapRules

_LORA = re.compile(r"(.*/)?lora_kernel_[ab]")


class LayoutMapChecker:
    """Exact key first, then every key as a regex (`re.fullmatch`); several matches raise; layouts as given."""

    def __init__(self, layout_map, dims):
        self.dims = dims
        self.name = "layout-map"
        self.findings = []
        self.winners = {}
        self.rules = layout_map if isinstance(layout_map, LayoutMapRules) else LayoutMapRules(layout_map)
        for key, error in self.rules.invalid.items():
            self.findings.append(
                Finding(
                    "KD105",
                    ERROR,
                    f"LayoutMap key {key!r} is not a valid regex ({error}). Keras tries every key as a regex for "
                    "each variable "
                    "without an exact key, so this crashes model creation. Escape it (re.escape) or fix it.",
                    rule=key,
                )
            )
        sizes = dims.axis_sizes
        for key in self.rules.keys:
            axes = self.rules.bound(key, dims)  # "batch" is the data axis, as presets read it
            for name in unknown_axes(axes, sizes):
                self.findings.append(
                    Finding(
                        "KD103",
                        ERROR,
                        f"LayoutMap key {key!r} has layout {axes} with axis {name!r}, which is not a mesh axis "
                        f"({', '.join(dims.names)}). Rename it to a mesh axis or build the mesh with that axis name.",
                        rule=key,
                    )
                )

    def check(self, variables, output_paths=()):
        findings = self.findings
        bad = {f.rule for f in findings}
        used = {key: 0 for key in self.rules.keys}
        placements = {}
        for v in variables:
            keys = self.rules.matching_keys(v.path)
            for key in keys:
                used[key] += 1
            if len(keys) > 1:
                findings.append(_multiple(v.path, keys, "variable"))
                continue
            if not keys:  # no key: replicated
                placements[v.path] = (None,) * len(v.shape)
                continue
            key = keys[0]
            axes = self.rules.bound(key, self.dims)
            if key in bad or not self._layout_findings(v, key, axes):
                continue
            placements[v.path] = axes + (None,) * (len(v.shape) - len(axes))
            self.winners[v.path] = key
            if _LORA.fullmatch(v.path) and any(a is not None for a in axes):
                findings.append(
                    Finding(
                        "KD205",
                        WARNING,
                        f"LoRA weight {v.path!r} {v.shape} is sharded {axes} by key {key!r}. LoRA adapters are small "
                        "and low-rank; sharding them adds collectives for no memory gain. Narrow the key so it does "
                        "not match "
                        "lora_kernel_a/b (e.g. end it with '/kernel').",
                        path=v.path,
                        rule=key,
                    )
                )
        activation = {key: 0 for key in self.rules.keys}
        for path in output_paths:
            keys = self.rules.matching_keys(path)
            for key in keys:
                activation[key] += 1
            if len(keys) > 1:
                findings.append(_multiple(path, keys, "layer output"))
        for key in self.rules.keys:
            if used[key] or activation[key] or key in self.rules.invalid:
                continue
            regex = re.compile(key)
            partial = [v.path for v in variables if partial_match(regex, v.path)]
            if partial:
                findings.append(partial_finding(key, partial))
            else:
                findings.append(
                    Finding(
                        "KD201",
                        WARNING,
                        f"LayoutMap key {key!r} matches no variable (nor layer output) of this model, so it does "
                        "nothing. "
                        "Keras matches whole paths (re.fullmatch): check it against `[v.path for v in "
                        "model.variables]`.",
                        rule=key,
                    )
                )
        return findings, placements

    def _layout_findings(self, v, key, axes):
        if len(axes) > len(v.shape):
            self.findings.append(
                Finding(
                    "KD102",
                    ERROR,
                    f"LayoutMap key {key!r} gives {v.path!r} of shape {v.shape} the layout {axes} of {len(axes)} axes; "
                    f"the variable has {len(v.shape)} dimensions, so jax.device_put fails. Use a layout of at most "
                    f"{len(v.shape)} axes or narrow the key.",
                    path=v.path,
                    rule=key,
                )
            )
            return False
        sizes = self.dims.axis_sizes
        ok = True
        for dim, axis in enumerate(axes):
            size = math.prod(sizes[n] for n in dim_axes(axis))
            if v.shape[dim] % size:
                ok = False
                self.findings.append(
                    Finding(
                        "KD104",
                        ERROR,
                        f"LayoutMap key {key!r} shards dim {dim} ({v.shape[dim]}) of {v.path!r} {v.shape} over "
                        f"{axis}={size}, "
                        "which does not divide it; Keras passes the layout to jax, which raises. Shard a dimension "
                        "that "
                        f"divides by {size}, replicate this one (None), or use kdist rules with candidate layouts.",
                        path=v.path,
                        rule=key,
                    )
                )
        return ok


def _multiple(path, keys, what):
    return Finding(
        "KD101",
        ERROR,
        f"The {what} path {path!r} matches {len(keys)} LayoutMap keys {keys}; Keras raises ValueError when it "
        "looks it up. Make the keys exclusive (anchor or narrow them) or add the exact path as a key.",
        path=path,
        rule=keys[0],
    )
