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
from kdist.distribution import ShardedDistribution  # noqa: E402
from kdist.errors import BackendError, FakeDevicesError, KdistError, RuleError, SpecError  # noqa: E402
from kdist.inspector import ShardingReport, inspect  # noqa: E402
from kdist.parallel_dims import ParallelDims  # noqa: E402
from kdist.presets import mesh, preset  # noqa: E402
from kdist.rules import Placement, Rule, RuleSet  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "FakeDevicesError",
    "KdistError",
    "ParallelDims",
    "Placement",
    "Rule",
    "RuleError",
    "RuleSet",
    "ShardedDistribution",
    "ShardingReport",
    "SpecError",
    "abstract_model",
    "fake_devices",
    "inspect",
    "mesh",
    "preset",
]
