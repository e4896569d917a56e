import os

import pytest

from tests.subprocess_utils import SUITE_XLA_FLAGS

# Before kdist starts JAX, which reads XLA_FLAGS once: the suite's flags for every program it compiles.
os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {SUITE_XLA_FLAGS}".strip()

import kdist  # noqa: E402
from kdist.zoo import tiny_entries  # noqa: E402

pytest_plugins = ["kdist.pytest_plugin"]


@pytest.fixture(scope="session")
def tiny_backbones():
    """Family -> its tiny keras-hub backbone, built abstractly once for the whole session."""
    pytest.importorskip("keras_hub")
    import keras  # here, not at the top: this module is read before the plugin selects Keras's backend

    built = {}
    for family, build in tiny_entries().items():
        keras.backend.clear_session(free_memory=False)  # fresh layer names, without a slow gc pass
        built[family] = kdist.abstract_model(build)
    return built
