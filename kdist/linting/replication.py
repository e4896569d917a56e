"""Replication checks in the style of MaxText's "sufficiently sharded": the summary and KD203/KD204."""

import math

from kdist.errors import RuleError
from kdist.linting.findings import INFO, WARNING, Finding
from kdist.meshes.layout import dim_axes, shard_bytes
from kdist.meshes.roles import Role
from kdist.meshes.spec import ParallelDims
from kdist.rules.placer import Placer
from kdist.rules.rule import RuleSet
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
    offenders = (
        sorted((v for v in replicated if v.nbytes >= size_threshold), key=lambda v: (-v.nbytes, v.path))
        if weight_axes
        else []
    )
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
            "KD203",
            WARNING,
            f"{v.path!r} {v.shape} ({human_bytes(v.nbytes)}) is replicated on every weight axis ({axes}), above the "
            f"{human_bytes(size_threshold)} threshold: each device holds all of it. "
            + (
                f"Rule {checker.winners[v.path]!r} replicates it: shard one of its dimensions instead."
                if checker.winners.get(v.path)
                else "No rule matches it: add one that shards one of its dimensions."
            ),
            path=v.path,
            rule=checker.winners.get(v.path),
        )
        for v in offenders
    ]
    share = summary["replicated_share"]
    if share > tolerance:
        worst = ", ".join(f"{t['path']} ({human_bytes(t['bytes'])})" for t in summary["top_replicated"])
        findings.append(
            Finding(
                "KD204",
                WARNING,
                f"{share:.1%} of parameter bytes are in variables of at least {human_bytes(size_threshold)} "
                "replicated on every "
                f"weight axis ({axes}), above the {tolerance:.0%} tolerance. Largest: {worst}. Add rules for them.",
            )
        )
    return findings


def data_axis_finding(checker, variables, size_threshold):
    """KD207: weights replicated over a data axis, and what an fsdp axis of the same size would hold instead.

    Each data replica holds its own copy of every weight and optimizer slot;
    "fsdp" splits the batch the same way but also shards them (Keras gathers
    each weight where it is used). The finding names the spec that does it
    and the bytes per device it saves, weights and Adam-like state included.
    """
    dims = checker.dims
    if not isinstance(checker.rules, list) or not dims.data_enabled or dims.fsdp_enabled:
        return []
    fsdp = ParallelDims(
        ",".join(f"{'fsdp' if r == Role.DATA else r}={s}" for r, s in dims.axes if r is not None),
        tuple((Role.FSDP.value if r == Role.DATA else r, s) for r, s in dims.axes if r is not None),
    )
    if len(fsdp.axes) != len(dims.axes):
        return []  # an axis without a role: no preset spec to offer
    try:
        now = _weight_bytes(checker.placer, dims, variables)
        then = _weight_bytes(
            Placer(RuleSet(checker.rules), fsdp, fsdp_min_size=checker.placer.fsdp_min_size), fsdp, variables
        )
    except RuleError:  # rules that cannot place every variable: their own findings say why
        return []
    saved = 3 * (now - then)  # weights, and two optimizer slots per weight (Adam)
    if saved < size_threshold:
        return []
    return [
        Finding(
            "KD207",
            INFO,
            f"Weights are replicated over the data axis ({dims.name_of(Role.DATA)}={dims.size_of(Role.DATA)}): each "
            "replica "
            f"holds {human_bytes(now)} of weights per device. The spec {fsdp.spec!r} splits the batch the same way and "
            f"shards the weights over that axis too: {human_bytes(then)} per device, saving about {human_bytes(saved)} "
            "with Adam's state, for an all-gather of each weight per step. Use it when memory is tight.",
        )
    ]


def _weight_bytes(placer, dims, variables):
    sizes = dims.axis_sizes
    total = 0
    for v in variables:
        element = v.nbytes // max(1, math.prod(v.shape))
        total += shard_bytes(v.shape, placer.place(v.path, v.shape).axes, sizes, element)
    return total
