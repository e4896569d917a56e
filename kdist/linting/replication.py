"""Replication checks in the style of MaxText's "sufficiently sharded": the summary and KD203/KD204."""

import math

from kdist.linting.findings import WARNING, Finding
from kdist.meshes.layout import dim_axes
from kdist.units import human_bytes


def summarize(checker, variables, placements, size_threshold, top):
    """The report's summary, and the replicated variables above `size_threshold`, largest first."""
    dims = checker.dims
    weight_axes = dims.weight_axes
    total = sum(v.nbytes for v in variables)
    sharded, replicated = [], []  # of the variables laid out
    for v in variables:
        if v.path in placements:
            split = {a for entry in placements[v.path] for a in dim_axes(entry)}
            (sharded if split & set(weight_axes) else replicated).append(v)
    # Without weight axes (a data-parallel mesh) replicating weights is the point: nothing to report.
    offenders = sorted((v for v in replicated if v.nbytes >= size_threshold), key=lambda v: (-v.nbytes, v.path)) if weight_axes else []
    summary = {
        "rules": checker.name,
        "mesh": dims.axis_sizes,
        "weight_axes": list(weight_axes),
        "variables": len(variables),
        "parameters": sum(math.prod(v.shape) for v in variables),
        "total_bytes": total,
        "sharded_share": sum(v.nbytes for v in sharded) / total if total else 0.0,
        "replicated_share": sum(v.nbytes for v in offenders) / total if total else 0.0,
        "size_threshold": size_threshold,
        "top_replicated": [{"path": v.path, "shape": list(v.shape), "bytes": v.nbytes} for v in offenders[:top]],
    }
    return summary, offenders


def replication_findings(checker, summary, offenders, size_threshold, tolerance):
    axes = ", ".join(summary["weight_axes"])
    findings = [
        Finding(
            "KD203", WARNING,
            f"{v.path!r} {v.shape} ({human_bytes(v.nbytes)}) is replicated on every weight axis ({axes}), above the "
            f"{human_bytes(size_threshold)} threshold: each device holds all of it. "
            + (f"Rule {checker.winners[v.path]!r} replicates it: shard one of its dimensions instead."
               if checker.winners.get(v.path) else "No rule matches it: add one that shards one of its dimensions."),
            path=v.path, rule=checker.winners.get(v.path),
        )
        for v in offenders
    ]
    share = summary["replicated_share"]
    if share > tolerance:
        worst = ", ".join(f"{t['path']} ({human_bytes(t['bytes'])})" for t in summary["top_replicated"])
        findings.append(Finding(
            "KD204", WARNING,
            f"{share:.1%} of parameter bytes are in variables of at least {human_bytes(size_threshold)} replicated on every "
            f"weight axis ({axes}), above the {tolerance:.0%} tolerance. Largest: {worst}. Add rules for them.",
        ))
    return findings
