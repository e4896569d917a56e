"""Compiling for a GPU that is not there: XLA:GPU's own memory figure on a CPU-only machine (optional).

With a CUDA PJRT plugin for the installed jax (`pip install
jax-cuda13-pjrt==<jaxlib version>`: Linux x86_64 / aarch64 only, no CUDA
toolkit or driver needed), jax can build a compile-only GPU topology from a
GpuTargetConfigProto and XLA:GPU compiles the training step for it:
`plan(..., verify=True, verify_target="H100")`. On the shared H100
measurements that figure was within -3.7%..+2.5% of XLA's figure on the real
GPU for 8 of 9 configs (Mixtral +26%), against 1.5-2x for XLA:CPU's. The
plugin must have registered when jax started: set JAX_PLATFORMS=cpu (what
`kdist.fake_devices` does) or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 first.
"""

import jaxlib

from kdist.errors import MissingDependencyError, PlanError
from kdist.jax_internals import cuda_plugin_installed, deviceless_gpu_devices
from kdist.planning.targets import device_kind

# XLA's xla/tools/hlo_opt/gpu_specs/h100_sxm.txtpb (Apache-2.0): what XLA:GPU needs to know of the device.
H100_SXM = """gpu_device_info {
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: 233472
  threads_per_core_limit: 2048
  core_count: 132
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: 3352320000000
  l2_cache_size: 52428800
  clock_rate_ghz: 1.98
  device_memory_size: 84978434048
  shared_memory_per_block_optin: 232448
  cuda_compute_capability { major: 9 }
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}
platform_name: "CUDA"
device_description_str: "NVIDIA H100 80GB HBM3"
"""
TARGET_CONFIGS = {"H100": H100_SXM}
# Triton GEMMs without autotuning hit an XLA 0.10.2 tiling error (ViT); cuBLAS GEMMs never failed and kept
# every non-MoE config within -3.7%..+2.5% of the real GPU's figure.
COMPILER_OPTIONS = {"xla_gpu_enable_triton_gemm": False}
INSTALL = f'pip install "jax-cuda13-pjrt=={jaxlib.__version__}"'


def gpu_devices(kind, n):
    """`n` compile-only devices of GPU `kind` ("H100"), or a kdist error saying what to install or set."""
    known = device_kind(str(kind))
    if known not in TARGET_CONFIGS:
        raise PlanError(
            f"verify_target={kind!r}: kdist ships the XLA target description of {sorted(TARGET_CONFIGS)} only; "
            "pass one of those, or None to compile on this machine's devices."
        )
    if not cuda_plugin_installed():
        raise MissingDependencyError(
            f"verify_target={kind!r} compiles for a GPU without one, which needs jax's CUDA PJRT plugin for "
            f"jaxlib {jaxlib.__version__} (Linux x86_64/aarch64 only): {INSTALL}"
        )
    try:
        return deviceless_gpu_devices(n, TARGET_CONFIGS[known])
    except (RuntimeError, NotImplementedError) as e:  # the plugin is installed but did not register
        raise MissingDependencyError(
            f"verify_target={kind!r}: jax's CUDA plugin is installed but not usable ({e}). Set JAX_PLATFORMS=cpu "
            "(kdist.fake_devices does) or JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1 before jax starts."
        ) from None
