"""Mesh-shape sweep of a tiny decoder LM (kdist.models.tiny_transformer) on 8 fake CPU devices.

Run: python benchmarks/sweep_transformer.py [--steps 40] [--batch-size 32] [--meshes all]
Writes benchmarks/results/sweep_transformer.{csv,json,png}.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_common import main  # noqa: E402

from kdist.models import tiny_transformer  # noqa: E402

if __name__ == "__main__":
    main("transformer", tiny_transformer, "tiny transformer LM (kdist.models.tiny_transformer)", batch_size=32)
