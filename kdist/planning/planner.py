"""Mesh planner: which split of N devices to train a model on, and why.

`kdist.plan` enumerates every mesh of N devices (data x fsdp x model, and an
expert axis when the rules use one), and for each estimates per-device memory
(weights, gradients, optimizer state, activations) and communication per
training step, from the model's real variables, the layouts kdist's
placement engine gives them and the activations autodiff saves for each
layer. With `verify=True` it also compiles the real Keras training step for
each mesh, from abstract inputs, and puts XLA's memory analysis beside the
estimate. See docs/plan.md for the formulas.
"""

import time

from kdist.checks import MAX_DEVICES, non_negative_number, positive_int
from kdist.errors import PlanError
from kdist.meshes.enumerate import meshes
from kdist.planning.candidates import evaluate
from kdist.planning.facts import ModelFacts, check_dtype
from kdist.planning.plan import Plan
from kdist.planning.ranking import rank
from kdist.planning.verify import verify as verify_plan
from kdist.render.progress import steps
from kdist.units import parse_size

DEFAULT_BANDWIDTH = 100e9  # bytes/s per device, one direction (about one TPU ICI link or a fraction of NVLink)
DEFAULT_LATENCY = 10e-6  # seconds per collective step


def plan(
    model_or_variables,
    devices,
    *,
    batch_size,
    sequence_length=None,
    optimizer="adam",
    dtype=None,
    memory_per_device=None,
    bandwidth=DEFAULT_BANDWIDTH,
    latency=DEFAULT_LATENCY,
    rules=None,
    verify=False,
    progress=False,
):
    """Rank every mesh of `devices` devices for training a model, and recommend one.

    Nothing is allocated: build big models with `kdist.abstract_model`. The
    mesh sizes come from the device count alone, so planning for 512 devices
    needs no devices; `verify=True` compiles on `devices` (fake) devices.

    Example:

    ```python
    model = kdist.abstract_model(kdist.models.tiny_transformer)
    p = kdist.plan(model, devices=8, batch_size=32, memory_per_device="16GB")
    print(p)                          # ranking, recommendation and why
    p.recommendation.spec             # e.g. "data=8"
    keras.distribution.set_distribution(p.preset())
    ```

    Args:
        model_or_variables: a Keras model (built, or built abstractly), a
            zero-argument function that builds one (needed by `verify` for
            models that cannot be rebuilt from their config), or a list of
            variables (no activation estimate then).
        devices: the number of devices, a positive integer.
        batch_size: the global batch size.
        sequence_length: the length of unknown (None) input dimensions after
            the batch, e.g. tokens per example of a keras-hub backbone.
        optimizer: a Keras optimizer name, config or instance; its real
            slot variables are planned (Adam: 2 per weight).
        dtype: count weights, gradients, optimizer state and activations in
            this dtype instead of the model's own (e.g. "bfloat16").
        memory_per_device: memory of one device: bytes or "80GB", "80GiB", "8e10".
        bandwidth: bytes per second per device for collectives (or "100GB/s").
        latency: seconds per collective step (the alpha of the alpha-beta model).
        rules: layout rules, as `kdist.preset` takes them (default: kdist's rules).
        verify: True to compile the training step of every valid candidate on
            (fake) devices and record XLA's memory analysis in
            `candidate.compiled`; or a list of the specs to verify.
        progress: show the verification's progress (a bar on a terminal,
            one line per candidate otherwise, on stderr).

    Returns:
        A `Plan`.
    """
    start = time.perf_counter()
    devices = positive_int(devices, "devices", maximum=MAX_DEVICES, error=PlanError)
    batch_size = positive_int(batch_size, "batch_size", error=PlanError)
    if sequence_length is not None:
        sequence_length = positive_int(sequence_length, "sequence_length", error=PlanError)
    memory = parse_size(memory_per_device, "memory_per_device") if memory_per_device is not None else None
    bandwidth = parse_size(bandwidth, "bandwidth")
    latency = non_negative_number(latency, "latency", unit="seconds", error=PlanError)
    dtype = check_dtype(dtype)
    verify = _verify_option(verify)
    facts = ModelFacts(model_or_variables, optimizer, dtype, sequence_length, rules)
    candidates = [evaluate(facts, axes, batch_size, bandwidth, latency) for axes in meshes(devices, facts.roles)]
    result = Plan(
        facts.name,
        devices,
        batch_size,
        facts.sequence_length,
        facts.optimizer_name,
        memory,
        bandwidth,
        latency,
        candidates,
        notes=list(facts.notes),
        rules=rules,
    )
    rank(result, facts)
    if verify:
        chosen = None if verify is True else verify
        with steps("plan --verify", sum(c.valid for c in result.candidates), enabled=progress) as bar:
            verify_plan(result, facts, chosen, progress=lambda spec: bar.next(f"compiling the step on {spec}"))
    result.seconds = time.perf_counter() - start
    return result


def _verify_option(verify):
    if isinstance(verify, bool):
        return verify
    if isinstance(verify, str) or not hasattr(verify, "__iter__") or not all(isinstance(s, str) for s in verify):
        raise PlanError(
            f'verify must be True, False or a list of candidate specs such as ["data=8"]; received {verify!r}.'
        )
    return set(verify)
