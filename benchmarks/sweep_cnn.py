"""Mesh-shape sweep of a small CNN (kdist.models.small_cnn) on 8 fake CPU devices.

Run: python benchmarks/sweep_cnn.py [--steps 40] [--batch-size 64] [--meshes all]
Writes benchmarks/results/sweep_cnn.{csv,json,png}.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_common import main  # noqa: E402

from kdist.models import small_cnn  # noqa: E402

if __name__ == "__main__":
    main("cnn", small_cnn, "small CNN (kdist.models.small_cnn)", batch_size=64)
