"""Linting a kdist `RuleSet` as `kdist.preset` applies it: through the placement engine itself."""

import re

from kdist.errors import RuleError
from kdist.linting.findings import ERROR, INFO, WARNING, Finding, partial_finding, partial_match
from kdist.meshes.layout import ELLIPSIS
from kdist.meshes.roles import ROLES, WEIGHT_ROLES
from kdist.rules.placer import FSDP_MIN_SIZE, Placer
from kdist.rules.registry import RULE_SETS
from kdist.rules.rule import Rule, RuleSet

_LORA = re.compile(r"(.*/)?lora_kernel_[ab]")
# Rules of kdist's libraries: one that matches nothing is expected (the model lacks that layer).
_LIBRARY = {rule for rule_set in RULE_SETS.values() for rule in rule_set}


class RuleSetChecker:
    """Ordered rules, first match wins, candidates fall back by shape, fsdp on top: `kdist.Placer`'s behaviour."""

    def __init__(self, rules, dims, fsdp_min_size=None):
        self.dims = dims
        self.findings = []
        self.name = rules.name if isinstance(rules, RuleSet) else "custom"
        self.rules = self._valid_rules(rules)
        self.placer = Placer(RuleSet(self.rules, self.name), dims, fsdp_min_size=fsdp_min_size or FSDP_MIN_SIZE)
        self.winners = {}  # variable path -> the pattern of the rule that laid it out

    def _valid_rules(self, rules):
        """Rules as `Rule`s; a (pattern, layouts) pair whose pattern is not a regex becomes a KD105 finding."""
        valid = []
        for rule in rules:
            if not isinstance(rule, Rule):
                try:
                    re.compile(rule[0])
                except re.error as e:
                    self.findings.append(
                        Finding(
                            "KD105",
                            ERROR,
                            f"Rule {rule[0]!r} is not a valid regex ({e}). Fix or re.escape it; the rule was skipped.",
                            rule=rule[0],
                        )
                    )
                    continue
                rule = Rule(*rule)
            valid.append(rule)
        return valid

    def check(self, variables, output_paths=()):
        findings = self.findings
        broken = {rule for rule in self.rules if self._axis_findings(rule)}
        matched = {rule: [] for rule in self.rules}
        won = {rule: [] for rule in self.rules}
        placements = {}
        for v in variables:
            matches = [rule for rule in self.rules if rule.matches(v.path)]
            for rule in matches:
                matched[rule].append(v)
            winner = matches[0] if matches else None
            if winner is not None:
                won[winner].append(v)
                self.winners[v.path] = winner.pattern
            if winner in broken:
                continue
            axes = self._place(v, winner)
            if axes is not None:
                placements[v.path] = axes
        unused_library = []
        for rule in self.rules:
            if not matched[rule] and _is_library(rule):
                unused_library.append(rule)
            else:
                findings += self._rule_findings(rule, matched[rule], won[rule], variables)
        if unused_library:
            findings.append(
                Finding(
                    "KD201",
                    INFO,
                    f"{len(unused_library)} rule(s) of kdist's rule libraries match no variable of this model: they "
                    "are for "
                    "layers it does not have. Nothing to fix.",
                )
            )
        return findings, placements

    def _axis_findings(self, rule):
        names = set(self.dims.names)
        unknown = sorted(
            {
                a
                for layout in rule.layouts
                for a in layout
                if a not in (None, ELLIPSIS) and a not in names and a not in ROLES
            }
        )
        for axis in unknown:
            self.findings.append(
                Finding(
                    "KD103",
                    ERROR,
                    f"Rule {rule.pattern!r} uses axis {axis!r}, which is neither a mesh axis "
                    f"({', '.join(self.dims.names)}) "
                    f"nor a role ({', '.join(ROLES)}). Use a role such as 'model' so the rule binds to any mesh, or "
                    "one of the mesh's axis names.",
                    rule=rule.pattern,
                )
            )
        return bool(unknown)

    def _place(self, v, rule):
        try:
            placement = self.placer.place(v.path, v.shape)
        except RuleError:  # its layouts have more axes than the variable
            self.findings.append(
                Finding(
                    "KD102",
                    ERROR,
                    f"Rule {rule.pattern!r} matches {v.path!r} of shape {v.shape} (rank {len(v.shape)}), but its "
                    "layouts "
                    f"{[list(layout) for layout in rule.layouts]} have more axes. Add a candidate of rank "
                    f"{len(v.shape)} "
                    "(or use '...') or narrow the pattern.",
                    path=v.path,
                    rule=rule.pattern,
                )
            )
            return None
        if rule is None and self.rules:  # an empty rule set replicates on purpose
            self.findings.append(
                Finding(
                    "KD304",
                    INFO,
                    f"No rule matches {v.path!r} {v.shape}: it is replicated. Add a rule (e.g. (pattern, ()) to "
                    "replicate it on purpose).",
                    path=v.path,
                )
            )
        elif rule is not None and placement.replicated_dims:
            self.findings.append(
                Finding(
                    "KD206",
                    WARNING,
                    f"{v.path!r} {v.shape}: no candidate layout of rule {rule.pattern!r} divides "
                    f"({placement.reason}); laid out "
                    f"{placement.axes}. Add a candidate whose sharded dimensions divide, or pick a mesh axis size "
                    "that divides them.",
                    path=v.path,
                    rule=rule.pattern,
                )
            )
        elif rule is not None and placement.source == "fallback":
            self.findings.append(
                Finding(
                    "KD302",
                    INFO,
                    f"{v.path!r} {v.shape}: rule {rule.pattern!r} fell back to candidate {placement.axes} "
                    f"({placement.reason}).",
                    path=v.path,
                    rule=rule.pattern,
                )
            )
        if (
            rule is not None
            and _LORA.fullmatch(v.path)
            and any(a is not None and a != self.dims.name_of("fsdp") for a in placement.axes)
        ):
            self.findings.append(self._lora_finding(v, rule, placement.axes))
        return placement.axes

    def _lora_finding(self, v, rule, axes):
        if _is_library(rule):  # kdist.rules.with_lora: sharded on request
            return Finding(
                "KD205",
                INFO,
                f"LoRA weight {v.path!r} {v.shape} is sharded {axes} on request (kdist.rules.with_lora).",
                path=v.path,
                rule=rule.pattern,
            )
        return Finding(
            "KD205",
            WARNING,
            f"LoRA weight {v.path!r} {v.shape} is sharded {axes} by rule {rule.pattern!r}. LoRA adapters are small and "
            "low-rank; sharding them adds collectives for no memory gain. Put r'(.*/)?lora_kernel_[ab]' -> () before "
            "this rule.",
            path=v.path,
            rule=rule.pattern,
        )

    def _rule_findings(self, rule, matched, won, variables):
        if not matched:
            partial = [v.path for v in variables if partial_match(rule._regex, v.path)]
            if partial:
                return [partial_finding(rule.pattern, partial)]
            return [
                Finding(
                    "KD201",
                    WARNING,
                    f"Rule {rule.pattern!r} matches no variable of this model, so it does nothing. Check the pattern "
                    "against "
                    "the variable paths (`[v.path for v in model.variables]`; rules match whole paths) or remove it.",
                    rule=rule.pattern,
                )
            ]
        out = []
        if not won and not _is_library(rule):
            earlier = sorted({r.pattern for v in matched for r in self.rules if r.matches(v.path)} - {rule.pattern})
            out.append(
                Finding(
                    "KD301",
                    INFO,
                    f"Rule {rule.pattern!r} matches {len(matched)} variable(s) (e.g. {matched[0].path!r}) but "
                    "earlier rules "
                    f"{earlier} take them all (first match wins), so it never applies. Move it before them or narrow "
                    "them.",
                    path=matched[0].path,
                    rule=rule.pattern,
                )
            )
        missing = [
            sorted(a for a in layout if a in WEIGHT_ROLES and self.dims.bind(a) is None) for layout in rule.layouts
        ]
        missing = sorted({a for m in missing for a in m}) if all(missing) else []
        if won and missing:
            out.append(
                Finding(
                    "KD303",
                    INFO,
                    f"Rule {rule.pattern!r} shards over role(s) {missing}, which the mesh "
                    f"({', '.join(self.dims.names)}) "
                    f"does not have: those dimensions are replicated for {len(won)} variable(s). Add the axis to the "
                    "mesh "
                    "(e.g. 'data=2,expert=4') if you meant to shard them.",
                    path=won[0].path,
                    rule=rule.pattern,
                )
            )
        return out


def _is_library(rule):
    return bool(rule.family) or rule in _LIBRARY
