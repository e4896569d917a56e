"""kdist: set up, check and tune Keras 3 distributed training on JAX.

Example:

```python
import kdist, keras
keras.distribution.set_distribution(kdist.preset("2x4"))
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256), keras.layers.Dense(10)])
print(kdist.inspect(model).summary)
```

docs/architecture.md describes the package's layers.
"""

from kdist.backend import require_jax_backend as _require_jax_backend

_require_jax_backend()  # before anything imports keras

from kdist.devices import fake_devices  # noqa: E402
from kdist.devices import fake_devices_from_env as _fake_devices_from_env  # noqa: E402

_fake_devices_from_env()  # before anything starts jax's devices

from kdist import models  # noqa: E402,F401  (small example models)
from kdist.abstract import abstract_model  # noqa: E402
from kdist.checkpoint.backup import BackupAndRestore  # noqa: E402
from kdist.checkpoint.loading import load  # noqa: E402
from kdist.checkpoint.sharded import load_sharded, save_sharded  # noqa: E402
from kdist.cluster.join import ClusterConfig, cluster_from_tf_config, initialize  # noqa: E402
from kdist.cluster.launcher import LaunchResult, launch  # noqa: E402
from kdist.distribution import ShardedDistribution  # noqa: E402
from kdist.errors import (  # noqa: E402
    ArgumentError,
    ArgumentTypeError,
    BackendError,
    BatchSizeError,
    CheckpointError,
    ClusterError,
    FakeDevicesError,
    KdistError,
    LaunchError,
    MissingDependencyError,
    ModelError,
    PlanError,
    ReshardError,
    RuleError,
    SizeError,
    SpecError,
    VersionError,
)
from kdist.inspection import GridView, ShardingReport, grid_view, inspect  # noqa: E402
from kdist.linting import LintReport, lint  # noqa: E402
from kdist.meshes import ParallelDims  # noqa: E402
from kdist.planning import Plan, plan, preset  # noqa: E402
from kdist.presets import mesh  # noqa: E402
from kdist.rules import RULE_SETS, Placement, Rule, RuleSet, get_rules, load_rules, save_rules  # noqa: E402
from kdist.runtime.data import check_batch_size, check_dataset, check_fit_inputs, global_batch_size, make_dataset  # noqa: E402
from kdist.runtime.resharding import ReshardResult, plan_reshape, reshard  # noqa: E402
from kdist.runtime.sweep_result import SweepResult  # noqa: E402
from kdist.runtime.sweeping import sweep  # noqa: E402
from kdist.version import __version__  # noqa: E402

__all__ = [
    "ArgumentError",
    "ArgumentTypeError",
    "BackendError",
    "BackupAndRestore",
    "BatchSizeError",
    "CheckpointError",
    "ClusterConfig",
    "ClusterError",
    "FakeDevicesError",
    "GridView",
    "KdistError",
    "LaunchError",
    "LaunchResult",
    "LintReport",
    "MissingDependencyError",
    "ModelError",
    "ParallelDims",
    "Placement",
    "Plan",
    "PlanError",
    "RULE_SETS",
    "ReshardError",
    "ReshardResult",
    "Rule",
    "RuleError",
    "RuleSet",
    "ShardedDistribution",
    "ShardingReport",
    "SizeError",
    "SpecError",
    "VersionError",
    "SweepResult",
    "__version__",
    "abstract_model",
    "check_batch_size",
    "check_dataset",
    "check_fit_inputs",
    "cluster_from_tf_config",
    "fake_devices",
    "get_rules",
    "global_batch_size",
    "grid_view",
    "initialize",
    "inspect",
    "launch",
    "lint",
    "load",
    "load_rules",
    "load_sharded",
    "make_dataset",
    "mesh",
    "plan",
    "plan_reshape",
    "preset",
    "reshard",
    "save_rules",
    "save_sharded",
    "sweep",
]
