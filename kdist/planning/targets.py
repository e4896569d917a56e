"""What a plan is for: the target accelerator, the memory one device may use, the safety margin and the band.

The estimate is made for a target, never for the machine computing it: the
same plan comes out on a laptop and on the GPU host. `resolve_target`
turns the `target=` argument (None, "gpu", "tpu", "cpu" or a device kind
such as "H100") into a `Target`; with None it is the local accelerator when
there is one (its `memory_stats()["bytes_limit"]`, which reflects
XLA_PYTHON_CLIENT_MEM_FRACTION and XLA_PYTHON_CLIENT_PREALLOCATE, becomes
the default memory), else a GPU.
"""

import dataclasses
import os

import jax

from kdist.checks import is_real, shown
from kdist.devices import has_accelerator_plugin
from kdist.errors import ArgumentError
from kdist.jax_internals import backends_initialized, memory_limit

# Fits = peak <= (1 - margin) x usable memory. On the H100 a Llama whose XLA figure was 61.07 GB (96% of
# JAX's 63.76 GB limit) ran out of memory: the allocator, cuDNN/cuBLAS workspaces and the runtime need
# more than 4% beyond XLA's buffers, and the estimate's band adds up to 2% (docs/plan.md, "What fits means").
DEFAULT_MARGIN = 0.10

# XLA:CPU's compiled figure / the H100 truth for the same step, where the shared file has both.
CPU_PROXY_RATIO = {"transformers": (1.48, 2.03), "resnet50": (1.56, 1.56)}

JAX_GPU_FRACTION = 0.75  # XLA_PYTHON_CLIENT_MEM_FRACTION's default
# XLA:GPU's latency-hiding scheduler spends memory up to 95% (xla_gpu_memory_limit_slop_factor) of 80% of the
# device's memory less the step's inputs and outputs (GetSchedulerMemoryLimit; jax sets no device_memory_size).
XLA_SCHEDULER_SHARE = 0.95 * 0.80

# device kind -> (platform, bytes JAX lets one device use by default, where the figure comes from)
DEVICE_KINDS = {
    "H100": ("gpu", 63763906560, "JAX's default 75% of an H100 80GB, as measured"),
    "H200": ("gpu", int(JAX_GPU_FRACTION * 141e9), "JAX's default 75% of an H200's 141 GB"),
    "A100-80GB": ("gpu", int(JAX_GPU_FRACTION * 80e9), "JAX's default 75% of an A100's 80 GB"),
    "A100-40GB": ("gpu", int(JAX_GPU_FRACTION * 40e9), "JAX's default 75% of an A100's 40 GB"),
    "TPU v4": ("tpu", 32 * 2**30, "a TPU v4 core's 32 GiB of HBM"),
    "TPU v5e": ("tpu", 16 * 2**30, "a TPU v5e chip's 16 GiB of HBM"),
    "TPU v5p": ("tpu", 95 * 2**30, "a TPU v5p chip's 95 GiB of HBM"),
}
# device kind -> dense peak FLOP/s of matrix units by compute dtype, memory bandwidth in bytes/s, and the source.
# float32 matrix products run as TF32 on NVIDIA tensor cores (JAX's default precision on A100 and later) and as
# single-pass bfloat16 on TPUs (JAX's default precision there); both are what XLA runs for a float32 model.
PEAKS = {
    "H100": (
        {"bfloat16": 989e12, "float16": 989e12, "float32": 494.7e12},
        3.35e12,
        "NVIDIA H100 SXM5 datasheet: 989 TFLOP/s BF16/FP16 and 494.7 TFLOP/s TF32 dense, 3.35 TB/s HBM3",
    ),
    "H200": (
        {"bfloat16": 989e12, "float16": 989e12, "float32": 494.7e12},
        4.8e12,
        "NVIDIA H200 SXM datasheet: 989 TFLOP/s BF16/FP16 and 494.7 TFLOP/s TF32 dense, 4.8 TB/s HBM3e",
    ),
    "A100-80GB": (
        {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12},
        2.039e12,
        "NVIDIA A100 SXM 80GB datasheet: 312 TFLOP/s BF16/FP16 and 156 TFLOP/s TF32 dense, 2.039 TB/s HBM2e",
    ),
    "A100-40GB": (
        {"bfloat16": 312e12, "float16": 312e12, "float32": 156e12},
        1.555e12,
        "NVIDIA A100 SXM 40GB datasheet: 312 TFLOP/s BF16/FP16 and 156 TFLOP/s TF32 dense, 1.555 TB/s HBM2",
    ),
    "TPU v4": (
        {"bfloat16": 275e12, "float16": 275e12, "float32": 275e12},
        1.2e12,
        "Google Cloud TPU v4 documentation: 275 TFLOP/s BF16 per chip, 1.2 TB/s HBM",
    ),
    "TPU v5e": (
        {"bfloat16": 197e12, "float16": 197e12, "float32": 197e12},
        8.19e11,
        "Google Cloud TPU v5e documentation: 197 TFLOP/s BF16 per chip, 819 GB/s HBM",
    ),
    "TPU v5p": (
        {"bfloat16": 459e12, "float16": 459e12, "float32": 459e12},
        2.765e12,
        "Google Cloud TPU v5p documentation: 459 TFLOP/s BF16 per chip, 2,765 GB/s HBM",
    ),
}
# Which kind's peaks a plan for a bare platform assumes (said in the plan's notes).
PLATFORM_PEAKS = {"gpu": "H100", "tpu": "TPU v5p"}

PLATFORMS = ("gpu", "tpu", "cpu")
_ALIASES = {"cuda": "gpu", "rocm": "gpu", "a100": "A100-80GB"}


@dataclasses.dataclass(frozen=True)
class Target:
    """The accelerator a plan is for.

    `name`: "gpu", "tpu", "cpu" or a device kind ("H100"); `platform`: the
    compiler whose rules the estimate follows; `memory`: bytes one device
    may use by default (None: unknown), and `memory_source` saying where that
    figure comes from; `local`: the target is this machine's accelerator.
    """

    name: str
    platform: str
    memory: int = None
    memory_source: str = ""
    local: bool = False

    @property
    def calibrated(self):
        """Whether plans for this target get a band (`kdist.planning.calibration.BANDS`: GPU targets)."""
        return self.platform == "gpu"

    @property
    def peaks_kind(self):
        """The device kind whose peak FLOP/s and memory bandwidth the step time uses (None: not known)."""
        if self.name in PEAKS:
            return self.name
        return PLATFORM_PEAKS.get(self.name) if self.name in PLATFORMS else None

    @property
    def peaks(self):
        """({compute dtype: peak FLOP/s}, memory bytes/s, source) of one device, or None (e.g. the CPU)."""
        kind = self.peaks_kind
        return PEAKS[kind] if kind is not None else None


def resolve_target(target=None):
    """The `Target` of `target=`: None (the local accelerator, else a GPU), a platform or a device kind.

    A platform or kind that is this machine's accelerator is the local target,
    with the device's own bytes_limit as memory.

    >>> resolve_target("h100").memory, resolve_target("tpu").platform
    (63763906560, 'tpu')
    """
    if target is None:
        return local_target() or Target("gpu", "gpu")
    if isinstance(target, Target):
        return target
    if not isinstance(target, str) or not target.strip():
        raise ArgumentError(f"target must be {_ACCEPTED}; received target={shown(target)}.")
    name = _ALIASES.get(target.strip().lower(), target.strip())
    if name.lower() in PLATFORMS:
        named = Target(name.lower(), name.lower())
    else:
        kind = device_kind(name)
        if kind is None:
            raise ArgumentError(f"target={target!r} is not a platform or a device kind kdist knows: give {_ACCEPTED}.")
        platform, memory, source = DEVICE_KINDS[kind]
        named = Target(kind, platform, memory, source)
    local = local_target() if named.platform != "cpu" else None
    if local is not None and local.platform == named.platform and named.name in (named.platform, local.name):
        return local  # planning for this machine's own accelerator: its bytes_limit is the memory
    return named


_ACCEPTED = '"gpu", "tpu", "cpu", or a device kind (' + ", ".join(repr(k) for k in DEVICE_KINDS) + ")"


def device_kind(text):
    """The known device kind named in `text` (e.g. "NVIDIA H100 80GB HBM3" -> "H100"), or None."""
    low = text.lower().replace("-", " ")
    for kind in DEVICE_KINDS:
        if kind.lower().replace("-", " ") in low:
            return kind
    if "a100" in low:
        return "A100-40GB" if "40gb" in low.replace(" ", "") else "A100-80GB"
    return None


def local_target():
    """The Target of this machine's first accelerator, with its bytes_limit as memory; None without one.

    JAX's devices are started only when they already are, or when an
    accelerator plugin is installed and JAX_PLATFORMS does not say "cpu"
    (so planning before `kdist.fake_devices` never starts the CPU backend).
    """
    if not backends_initialized():
        platforms = os.environ.get("JAX_PLATFORMS", "")
        if not has_accelerator_plugin() or platforms.strip().lower() == "cpu":
            return None
    device = jax.devices()[0]
    platform = {"cuda": "gpu", "rocm": "gpu"}.get(device.platform, device.platform)
    if platform not in ("gpu", "tpu"):
        return None
    kind = device_kind(device.device_kind) or device.device_kind
    memory = memory_limit(device)
    source = f"bytes_limit of the local {device.device_kind}" if memory else ""
    if memory is None and kind in DEVICE_KINDS:
        _, memory, source = DEVICE_KINDS[kind]
    return Target(kind, platform, memory, source, local=True)


def check_margin(margin):
    """`margin` as a float in [0, 1)."""
    if not is_real(margin) or not 0 <= margin < 1:
        raise ArgumentError(
            f"margin must be a fraction of the memory in [0, 1), e.g. 0.1; received margin={shown(margin)}."
        )
    return float(margin)


def cpu_proxy_note():
    """What verify's figure is when it was compiled on CPU devices for a GPU/TPU target."""
    lo, hi = CPU_PROXY_RATIO["transformers"]
    return (
        f"the compiled figures come from XLA:CPU (fake CPU devices): a CPU proxy, not the accelerator's figure. "
        f"On the shared H100 measurements XLA:CPU's figure was {lo:.2f}-{hi:.2f}x the GPU truth for transformers "
        f"({CPU_PROXY_RATIO['resnet50'][0]:.2f}x for ResNet50): the CPU fuses less"
    )


def scheduler_limit(target):
    """Bytes of one device XLA:GPU's latency-hiding scheduler may fill on `target` (None: not a known GPU kind)."""
    known = DEVICE_KINDS.get(target.name)
    if target.platform != "gpu" or known is None:
        return None
    return int(known[1] / JAX_GPU_FRACTION * XLA_SCHEDULER_SHARE)
