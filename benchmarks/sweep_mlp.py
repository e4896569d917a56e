"""Mesh-shape sweep of the Keras distribution guide's MNIST MLP on 8 fake CPU devices.

Run: python benchmarks/sweep_mlp.py [--steps 40] [--batch-size 128] [--meshes all]
Writes benchmarks/results/sweep_mlp.{csv,json,png}.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sweep_common import main  # noqa: E402

from kdist.models import mnist_mlp  # noqa: E402

if __name__ == "__main__":
    main("mlp", mnist_mlp, "MNIST MLP (kdist.models.mnist_mlp)", batch_size=128)
