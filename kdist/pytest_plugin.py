"""A pytest plugin that runs a test suite on fake CPU devices.

Enable it in a `conftest.py` with `pytest_plugins = ["kdist.pytest_plugin"]`
(or `pytest -p kdist.pytest_plugin`). It gives JAX 8 CPU devices before any
test imports jax (change it with `--fake-devices N`, the `kdist_fake_devices`
ini option or KDIST_FAKE_DEVICES), and resets the Keras distribution and
session around every test so that layer names and paths do not depend on
test order.
"""

import os

import keras
import pytest

from kdist.devices import ENV_VAR, fake_devices


def pytest_addoption(parser):
    parser.addoption("--fake-devices", type=int, default=None, help="number of fake CPU devices for JAX (kdist)")
    parser.addini("kdist_fake_devices", "number of fake CPU devices for JAX (kdist)", default="8")


def pytest_configure(config):
    n = config.getoption("--fake-devices") or os.environ.get(ENV_VAR) or config.getini("kdist_fake_devices")
    fake_devices(int(n))


@pytest.fixture(autouse=True)
def _kdist_fresh_keras():
    keras.distribution.set_distribution(None)
    keras.backend.clear_session(free_memory=False)  # a full gc per test costs ~0.5 s
    yield
    keras.distribution.set_distribution(None)
