"""Checking the memory model against measured peaks: configs as the shared measurements give them, and leave-one-out.

A measurements file (`/work/shared/gpu-truth/h100.json` in this project, written
by its `measure.py`) lists configs: a builder ("keras_hub.models.LlamaBackbone",
"kdist.models.tiny_transformer", "keras.applications.ResNet50(weights=None)"),
its keyword arguments, batch size, sequence length, dtype policy, and the
measured peak (or "out of memory" and XLA's figure). `build_config` builds one
exactly as measure.py does, abstractly. The model has no fitted constant: what
was chosen by looking at data are the five compiler switches of
`kdist.planning.buffers.Rules`, and `leave_one_out` checks that choice on
configs it did not see.
"""

import importlib
import itertools
import json
import math

import keras

from kdist.abstract import abstract_model
from kdist.planning.buffers import SWITCHES, Rules


def load_configs(path):
    """The configs of a measurements file, as dicts."""
    with open(path) as f:
        return json.load(f)["configs"]


def truth_bytes(config):
    """(bytes, kind): the measured peak ("measured"), or XLA's GPU figure for a config that ran out of memory."""
    measured = config.get("measured_peak_bytes")
    if isinstance(measured, (int, float)):
        return int(measured), "measured"
    return int(config["xla_gpu_compiled_bytes"]), "xla_gpu"


def _builder(config):
    spec = config["builder"]
    if spec.startswith("keras.applications.ResNet50"):
        return lambda: keras.applications.ResNet50(weights=None)
    module, _, name = spec.rpartition(".")
    function = getattr(importlib.import_module(module), name)
    return lambda: function(**config["config"])


def build_config(config, **overrides):
    """The config's model built abstractly under its dtype policy, as measure.py builds it (keyword overrides)."""
    config = {**config, "config": {**config.get("config", {}), **overrides}}
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(config.get("dtype_policy", "float32"))
    try:
        return abstract_model(_builder(config))
    finally:
        keras.config.set_dtype_policy(previous)


def rule_sets():
    """Every setting of the five compiler switches (32 `Rules`)."""
    return [Rules(**dict(zip(SWITCHES, bits))) for bits in itertools.product((True, False), repeat=len(SWITCHES))]


def rules_key(rules):
    """A short name of a switch setting, e.g. "11101"."""
    return "".join(str(int(getattr(rules, s))) for s in SWITCHES)


def leave_one_out(peaks, truths):
    """For each config: the switch setting that fits the others best, and its ratio on the config held out.

    peaks: {config name: {rules key: estimated peak}}; truths: {config name:
    bytes}. "Best" is the smallest worst |log(estimate / truth)| over the other
    configs (then the smallest sum). Returns [{"held_out", "rules",
    "ratio", "worst_of_others"}].
    """
    names = list(peaks)
    keys = list(peaks[names[0]])
    out = []
    for held in names:
        rest = [n for n in names if n != held]

        def errors(key, rest=rest):
            return [abs(math.log(peaks[n][key] / truths[n])) for n in rest]

        best = min(keys, key=lambda k: (max(errors(k)), sum(errors(k))))
        out.append(
            {
                "held_out": held,
                "rules": best,
                "ratio": peaks[held][best] / truths[held],
                "worst_of_others": math.exp(max(errors(best))),
            }
        )
    return out
