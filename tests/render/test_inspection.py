import csv
import io
import json

import keras
import pytest
from rich.console import Group

import kdist
from kdist.model_state import KINDS
from kdist.models import mnist_mlp
from kdist.render.inspection import devices_table
from kdist.render.text import to_text
from kdist.units import human_bytes


def report_text(report, width=80):
    return to_text(Group(*report.renderables(width)), width)


@pytest.fixture(scope="module")
def report():
    """A live 2x4 report of the MLP with Adam state and the loss metric."""
    keras.backend.clear_session()  # module fixtures run before the per-test reset: fresh layer names
    distribution = kdist.preset("2x4")
    with distribution.scope():
        model = mnist_mlp()
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
        model.optimizer.build(model.trainable_variables)
    return kdist.inspect(model, distribution)


@pytest.fixture(scope="module")
def long_names():
    """An abstract report whose paths are too long for 80 columns."""
    with keras.StatelessScope(initialize_variables=False):
        variables = []
        for i in range(3):
            with keras.name_scope(f"transformer_layer_{i}"), keras.name_scope("feedforward_intermediate_dense"):
                variables.append(
                    keras.Variable(initializer="zeros", shape=(8192, 28672), name="kernel", dtype="bfloat16")
                )
    return kdist.inspect(variables, kdist.preset("2x4"))


def test_text_fits_80_columns_and_is_grouped_by_layer(report):
    text = report_text(report, width=80)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80
    assert "17 variables, adam state by layer, largest first (live)" in text
    d1 = next(i for i, line in enumerate(lines) if line.strip().startswith("d1 "))
    d2 = next(i for i, line in enumerate(lines) if line.strip().startswith("d2 "))
    assert d1 < d2  # larger layer first
    assert "  mlp/d1/kernel " in lines[d1 + 1] and "(·, model)" in lines[d1 + 1] and "784×50" in lines[d1 + 1]
    assert "↳ momentum" in lines[d1 + 2] and "slot" in lines[d1 + 2]
    assert "Memory per device (mesh data=2, model=4)" in text and "cpu:7" in text
    assert "imbalance (max/mean) 1.00" in text
    # long texts go to the notes: the fallback reason of d2/kernel, the kernel a bias follows
    assert "R1 fb N2" in text and "N2 layout (None, 'model'): dim 1 (10) not divisible by model=4" in text
    assert "R2 N1" in text and "N1 follows mlp/d1/kernel (None, 'model')" in text
    wide = report_text(report, width=120)  # full paths when they all fit
    assert "  mlp/d1/kernel " in wide and "  seed_generator/seed_generator_state " in wide


def test_what_the_fsdp_axis_adds_to_a_preset_replication_is_a_note():
    # On "fsdp=8" the preset replicates by design (the legend says so); a depthwise kernel's reason is a note.
    with keras.StatelessScope(initialize_variables=False), keras.name_scope("dw"):
        variables = [keras.Variable(initializer="zeros", shape=(7, 7, 128, 1), name="kernel")]
    text = report_text(kdist.inspect(variables, kdist.preset("fsdp=8")), width=80)
    assert "preset N1" in text and "N1 a depthwise convolution's kernel" in text


def test_long_paths_stay_whole_on_a_line_of_their_own(long_names):
    text = report_text(long_names, width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    for i in range(3):
        assert f"  transformer_layer_{i}/feedforward_intermediate_dense/kernel" in text.splitlines()
    wide = report_text(long_names, width=160)
    assert any(
        line.startswith("  transformer_layer_0/feedforward_intermediate_dense/kernel ") for line in wide.splitlines()
    )


def test_many_equal_devices_share_a_row():
    with keras.StatelessScope(initialize_variables=False):
        w = keras.Variable(initializer="zeros", shape=(64, 64), name="w")
    report = kdist.inspect([w], kdist.preset("dp"))
    table = devices_table(report, max_rows=4)
    assert "cpu:0…7 (8)" in to_text(table)


def test_html(report):
    html = report._repr_html_()
    assert html.count("<table") == 2
    assert "mlp/d1/kernel" in html and "slot of mlp/d1/kernel: rule" in html
    assert "Memory per device" in html and "cpu:7" in html


def test_json_and_csv_exports(report, tmp_path):
    data = json.loads(report.to_json(tmp_path / "r.json"))
    assert json.loads((tmp_path / "r.json").read_text()) == data
    assert len(data["variables"]) == len(report.variables) == data["summary"]["num_variables"]
    for i, device in enumerate(data["devices"]):
        assert device["total"] == report.device_bytes()[i] == sum(device[k] for k in KINDS)
    kernel = next(v for v in data["variables"] if v["path"] == "mlp/d1/kernel")
    assert kernel["spec"] == [None, "model"] and kernel["shard_shape"] == [784, 50] and kernel["replication"] == 2
    assert kernel["bytes_per_device"]["cpu:3"] == 784 * 50 * 4
    rows = list(csv.DictReader(io.StringIO(report.to_csv(tmp_path / "r.csv"))))
    assert (tmp_path / "r.csv").read_text() == report.to_csv()
    assert len(rows) == len(report.variables)
    for i, device in enumerate(report.devices):
        assert sum(int(r[f"bytes:{device}"]) for r in rows) == report.device_bytes()[i]
    momentum = next(r for r in rows if r["path"] == "adam/mlp_d1_kernel_momentum")
    assert momentum["slot_of"] == "mlp/d1/kernel" and momentum["spec"] == "(None, model)"


def test_grid_view_renders_slices():
    distribution = kdist.preset("2x4")
    with keras.StatelessScope(initialize_variables=False), keras.name_scope("layer"):
        w = keras.Variable(initializer="zeros", shape=(6, 8, 4), name="kernel")
    view = kdist.grid_view(w, distribution=distribution)
    text = str(view)
    assert "layer/kernel 6×8×4 (·, ·, model)" in text
    assert "[:, :, 3:4]" in text and "data=1" in text
    assert "<table" in view._repr_html_()


def test_human_bytes():
    assert [human_bytes(n) for n in (800, 2000, 156800, 1002 * 2**20)] == ["800 B", "1.95 KiB", "153 KiB", "1002 MiB"]
