"""kdist: set up, check and tune Keras 3 distributed training on JAX.

Example:

```python
import kdist, keras
keras.distribution.set_distribution(kdist.preset("2x4"))
model = keras.Sequential([keras.Input((784,)), keras.layers.Dense(256), keras.layers.Dense(10)])
print(kdist.inspect(model).summary)
```
"""

from kdist.backend import require_jax_backend as _require_jax_backend

_require_jax_backend()

from kdist.devices import fake_devices, fake_devices_from_env as _fake_devices_from_env  # noqa: E402

_fake_devices_from_env()

from kdist import models  # noqa: E402,F401  (small example models)
from kdist.abstract import abstract_model  # noqa: E402
from kdist.backup import BackupAndRestore, CheckpointError  # noqa: E402
from kdist.checkpoint import load_sharded, save_sharded  # noqa: E402
from kdist.cluster import ClusterConfig, ClusterError, cluster_from_tf_config, initialize  # noqa: E402
from kdist.data import BatchSizeError, check_batch_size, check_dataset, check_fit_inputs, global_batch_size, make_dataset  # noqa: E402
from kdist.distribution import ShardedDistribution  # noqa: E402
from kdist.errors import BackendError, FakeDevicesError, KdistError, MissingDependencyError, RuleError, SpecError  # noqa: E402
from kdist.inspector import GridView, ShardingReport, grid_view, inspect  # noqa: E402
from kdist.launcher import LaunchError, LaunchResult, launch  # noqa: E402
from kdist.linter import LintReport, lint  # noqa: E402
from kdist.parallel_dims import ParallelDims  # noqa: E402
from kdist.planner import Plan, PlanError, plan  # noqa: E402
from kdist.presets import mesh, preset  # noqa: E402
from kdist.resharding import ReshardResult, plan_reshape, reshard  # noqa: E402
from kdist.rules import RULE_SETS, Placement, Rule, RuleSet, get_rules, load_rules  # noqa: E402
from kdist.sweeps import SweepResult, sweep  # noqa: E402

__version__ = "0.1.0"

__all__ = [
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
    "ParallelDims",
    "Placement",
    "Plan",
    "PlanError",
    "RULE_SETS",
    "ReshardResult",
    "Rule",
    "RuleError",
    "RuleSet",
    "ShardedDistribution",
    "ShardingReport",
    "SpecError",
    "SweepResult",
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
    "load_rules",
    "load_sharded",
    "make_dataset",
    "mesh",
    "plan",
    "plan_reshape",
    "preset",
    "reshard",
    "save_sharded",
    "sweep",
]
