import csv
import io
import json
import os
from pathlib import Path

import keras
import numpy as np
import pytest
from rich.console import Console

import kdist
from kdist.meshes import data_model_specs as mesh_factorisations
from kdist.render.sweep import sweep_table
from kdist.runtime.sample_data import random_data
from kdist.runtime.sweep_result import NO_ESTIMATE, SweepResult
from kdist.runtime.sweeping import sweep

STEPS, WARMUP, BATCH = 3, 1, 8
MESHES = ["8x1", "4x2", "2x4", "dp", "1x8"]
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def tiny_model():
    """12 features: divisible by data=8 batches but not by model=8, so 1x8 cannot divide its kernels."""
    return keras.Sequential(
        [
            keras.Input((12,)),
            keras.layers.Dense(12, activation="relu", name="hidden"),
            keras.layers.Dropout(0.2),
            keras.layers.Dense(6, activation="softmax", name="out"),
        ],
        name="tiny",
    )


def tiny_data(samples=BATCH * (STEPS + WARMUP), seed=0):
    rng = np.random.default_rng(seed)
    return rng.random((samples, 12), dtype=np.float32), rng.integers(0, 6, size=(samples,))


@pytest.fixture(scope="module")
def result():
    return sweep(
        tiny_model,
        tiny_data(),
        MESHES,
        steps=STEPS,
        warmup=WARMUP,
        batch_size=BATCH,
        loss="sparse_categorical_crossentropy",
        strict=True,
        progress=False,
    )


def test_sweep_is_exported():
    assert kdist.sweep is sweep and kdist.SweepResult is SweepResult


def test_every_shape_is_a_row_and_four_run(result):
    assert [r.mesh for r in result.rows] == MESHES
    assert [r.mesh for r in result.ok_rows] == ["8x1", "4x2", "2x4", "dp"]
    for r in result.ok_rows:
        assert len(r.step_times) == STEPS and len(r.losses) == WARMUP + STEPS
        assert r.step_time > 0 and r.compile_s > 0 and r.samples_per_s == pytest.approx(BATCH / r.step_time)
        assert r.memory["total"] == r.memory["argument"] + r.memory["output"] - r.memory["alias"] + r.memory["temp"] > 0
        assert r.state_bytes > 0 and r.tokens_per_s is None
    assert result.row("2x4").axes == {"data": 2, "model": 4}


def test_final_losses_agree_across_shapes(result):
    losses = np.array([r.losses for r in result.ok_rows])
    np.testing.assert_allclose(losses, losses[0][None, :].repeat(len(losses), 0), rtol=1e-5)
    assert losses[0][0] != losses[0][-1]  # it trained
    assert result.loss_spread < 1e-5


def test_bad_counts_are_refused():
    with pytest.raises(ValueError, match="steps must be an integer >= 1; received steps=0"):
        sweep(tiny_model, tiny_data(), ["2x4"], steps=0, loss="mse", progress=False)


def test_step_losses_are_what_keras_fit_logs(result):
    """fit() logs the running mean of the loss; the sweep's per-step losses must average to it."""
    from tests.helpers import train_losses

    x, y = tiny_data()
    fit_logs, _ = train_losses(tiny_model, kdist.preset("2x4"), x, y, steps=STEPS + WARMUP, batch_size=BATCH)
    losses = np.array(result.row("2x4").losses)
    running_mean = np.cumsum(losses) / np.arange(1, len(losses) + 1)
    np.testing.assert_allclose(running_mean, fit_logs, rtol=1e-5)


def test_a_shape_that_cannot_divide_the_model_is_a_failed_row(result):
    row = result.row("1x8")
    assert row.status == "failed" and row.failure_stage == "layout"
    assert "mesh '1x8' cannot divide the model" in row.failure
    assert "tiny/hidden/kernel (12, 12)" in row.failure and "not divisible by model=8" in row.failure
    assert row.step_times == [] and row.losses == []


def test_batch_spec_and_build_failures_are_rows():
    def broken():
        raise RuntimeError("no such layer")

    x, y = tiny_data(16)
    rows = sweep(tiny_model, (x, y), ["8x1", "3x3"], batch_size=4, loss="mse", progress=False).rows
    assert rows[0].failure_stage == "data"
    assert rows[0].failure.startswith("BatchSizeError: Global batch size 4") and "8 model replicas" in rows[0].failure
    assert rows[1].failure_stage == "spec" and "SpecError" in rows[1].failure and "'3x3'" in rows[1].failure
    built = sweep(broken, (x, y), ["2x4"], batch_size=4, loss="mse", progress=False).rows[0]
    assert built.failure_stage == "build" and built.failure == "RuntimeError: no such layer"
    bad_rules = [(r".*/kernel", ("heads", None))]  # "heads" is neither a role nor a mesh axis
    ruled = sweep(tiny_model, (x, y), ["2x4"], batch_size=4, loss="mse", rules=bad_rules, progress=False).rows[0]
    assert ruled.failure_stage == "build" and ruled.failure.startswith("RuleError: Rule '.*/kernel' uses axis 'heads'")


def dp_row(**options):
    """The one row of a sweep of the tiny model on "dp" over 8 examples in one batch, with `options`."""
    x, y = tiny_data(8)
    options = {"steps": 1, "warmup": 0, "direct_check": False, **options}
    return sweep(
        tiny_model, (x, y), ["dp"], batch_size=8, loss="sparse_categorical_crossentropy", progress=False, **options
    ).rows[0]


def test_estimate_column_and_memory_limit():
    row = dp_row(device_memory=1000, estimate=lambda model, distribution: 1234)
    assert row.estimate_bytes == 1234 and row.estimate_note == "planner estimate"
    assert row.failure_stage == "memory" and "does not fit" in row.failure and "1000 B" in row.failure


def test_estimate_comes_from_the_planner_by_default(result):
    plan = kdist.plan(kdist.abstract_model(tiny_model), 8, batch_size=BATCH, optimizer="adam")
    for r in result.ok_rows:
        axes = {k: v for k, v in r.axes.items() if v > 1}
        expected = next(c for c in plan.candidates if c.axes == axes).peak
        assert r.estimate_note == "planner estimate" and r.estimate_bytes == expected
    # on fake CPU devices the caption says what the estimate stands beside
    assert "beside XLA:CPU's compiled figure, a proxy that ran 1.5-2.0x the H100's" in result.estimate_caption


def test_the_planner_step_time_stands_beside_the_measured_one(result):
    for r in result.ok_rows:
        assert r.estimate_step_time > 0 and r.estimate_target == "gpu"
        assert r.measured_over_estimate == pytest.approx(r.step_time / r.estimate_step_time)
    assert "CPU proxies, not comparable" in result.step_estimate_caption
    records = list(csv.DictReader(io.StringIO(result.to_csv())))
    assert float(records[0]["estimate_step_time_ms"]) > 0


def test_top_sweeps_the_plans_leading_meshes_only():
    top = sweep(
        tiny_model,
        tiny_data(),
        steps=1,
        warmup=0,
        batch_size=BATCH,
        loss="sparse_categorical_crossentropy",
        progress=False,
        top=2,
        direct_check=False,
    )
    plan = kdist.plan(kdist.abstract_model(tiny_model), 8, batch_size=BATCH, optimizer="adam")
    leading = [c for c in plan.candidates if c.valid][:2]
    assert [r.mesh for r in top.rows] == [c.spec for c in leading] and top.settings["top"] == 2
    assert [r.estimate_step_time for r in top.rows] == [c.step_seconds for c in leading]
    with pytest.raises(kdist.ArgumentError, match=r"top=2 picks the meshes from the plan.*meshes=\['8x1'\]"):
        sweep(tiny_model, tiny_data(), ["8x1"], batch_size=BATCH, top=2, progress=False)
    with pytest.raises(kdist.ArgumentError, match="top must be a positive integer"):
        sweep(tiny_model, tiny_data(), batch_size=BATCH, top=0, progress=False)


def _tokens_and_frames():
    """Two inputs of unknown length, by name (a keras-hub backbone's shape): the planner needs their lengths."""
    tokens = keras.Input((None,), dtype="int32", name="tokens")
    frames = keras.Input((None, 4), name="frames")
    x = keras.layers.Embedding(16, 8)(tokens)
    pooled = keras.ops.mean(keras.layers.Dense(8)(frames), axis=1, keepdims=True)
    return keras.Model({"tokens": tokens, "frames": frames}, keras.layers.Dense(16)(x + pooled))


def test_the_estimate_takes_unknown_input_lengths_from_the_data():
    rng = np.random.default_rng(0)
    x = {"tokens": rng.integers(0, 16, size=(BATCH, 6)), "frames": rng.random((BATCH, 10, 4), dtype=np.float32)}
    y = rng.integers(0, 16, size=(BATCH, 6))
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    top = sweep(_tokens_and_frames, (x, y), steps=1, warmup=0, batch_size=BATCH, loss=loss, top=1, progress=False)
    model = kdist.abstract_model(_tokens_and_frames)
    lengths = {"tokens": 6, "frames": 10}
    plan = kdist.plan(model, 8, batch_size=BATCH, sequence_length=lengths, optimizer="adam")
    assert top.rows[0].ok and top.rows[0].estimate_bytes == plan.candidate(top.rows[0].mesh).peak
    assert kdist.runtime.sweep_estimate.data_lengths(model, x) == {"tokens": (6,), "frames": (10,)}
    assert kdist.runtime.sweep_estimate.data_lengths(model, [x["tokens"]]) is None  # not laid out as the inputs


def test_estimate_can_be_turned_off():
    row = dp_row(estimate=None)
    assert row.estimate_bytes is None and row.estimate_note == NO_ESTIMATE


def test_a_failing_estimate_is_a_note_not_a_failed_shape():
    def broken(model, distribution):
        raise LookupError("no such mesh")

    row = dp_row(estimate=broken)
    assert row.ok and row.estimate_bytes is None
    assert row.estimate_note == "not available: LookupError: no such mesh"


def test_fastest_shape_is_marked(result):
    fastest = [r for r in result.rows if r.fastest]
    assert fastest == [min(result.ok_rows, key=lambda r: r.step_time)] and result.fastest is fastest[0]


def test_overhead_is_reported(result):
    o = result.overhead
    assert o["measured_s"] == pytest.approx(sum(sum(r.step_times) for r in result.rows))
    assert o["overhead_s"] == pytest.approx(result.wall_s - o["measured_s"]) and o["overhead_s"] > 0
    assert 0 < o["overhead_share"] < 1 and o["loop_overhead_per_step_s"] >= 0
    for r in result.rows:
        assert r.wall_s >= r.measured_s and r.overhead_s == pytest.approx(r.wall_s - r.measured_s)


def test_step_time_is_checked_against_the_bare_compiled_step(result):
    """Every timed step has a bare-loop twin of the same compiled step; agreement compares the pairs."""
    for r in result.ok_rows:
        assert len(r.direct_step_times) == len(r.step_times) == STEPS and min(r.direct_step_times) > 0
        assert r.direct_step_time == np.median(r.direct_step_times)
        ratios = np.array(r.step_times) / np.array(r.direct_step_times)
        assert r.agreement == pytest.approx(np.median(ratios) - 1)


def test_direct_check_can_be_skipped():
    row = dp_row(steps=2)
    assert row.ok and row.direct_step_times == [] and row.agreement is None and len(row.step_times) == 2


def test_outputs_table_csv_json_png(result, tmp_path):
    console = Console(record=True, width=200)
    console.print(result)
    text = " ".join(console.export_text().split())
    for mesh in MESHES:
        assert mesh in text
    assert "★" in text and "failed (layout)" in text and "1x8 failed (layout): mesh '1x8'" in text
    assert "Losses of all 4 shapes agree to" in text
    assert "step times say nothing about accelerators" in text and "overhead" in text
    assert "estimate" in text

    text = result.to_csv(tmp_path / "s.csv")
    assert (tmp_path / "s.csv").read_text() == text
    records = list(csv.DictReader(io.StringIO(text)))
    assert [r["mesh"] for r in records] == MESHES
    assert records[-1]["status"] == "failed" and records[0]["estimate_note"] == "planner estimate"
    assert len(records[0]["losses"].split()) == STEPS + WARMUP

    text = result.to_json(tmp_path / "s.json")
    assert json.loads(text) == json.loads((tmp_path / "s.json").read_text())
    with open(tmp_path / "s.json") as f:
        data = json.load(f)
    assert {"platform", "cpu_count", "jax", "keras", "device_count"} <= set(data["machine"])
    assert data["machine"]["device_count"] == 8 and "accelerators" in data["note"]
    assert data["rows"][1]["losses"] == result.rows[1].losses and data["overhead"]["overhead_s"] > 0

    png = tmp_path / "s.png"
    result.plot(png)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_all_meshes_means_every_factorisation_and_the_presets():
    from kdist.runtime.sweeping import _mesh_specs

    assert mesh_factorisations(8) == ["8x1", "4x2", "2x4", "1x8"]
    assert _mesh_specs("all", None) == ["8x1", "4x2", "2x4", "1x8", "dp", "fsdp", "tp"]
    with pytest.raises(ValueError, match="'2x4' twice"):
        _mesh_specs(["2x4", "2x4"], None)
    with pytest.raises(ValueError, match='meshes must be "all"'):
        _mesh_specs("2x4", None)


def test_random_data_fits_the_model():
    (x, y), loss = random_data(kdist.abstract_model(kdist.models.tiny_transformer), 4)
    assert x.shape == (4, 32) and x.dtype == np.int32 and x.max() < 512 and y.shape == (4, 32)
    assert loss.get_config()["from_logits"] is True
    (x, y), loss = random_data(kdist.abstract_model(kdist.models.mnist_mlp), 4)
    assert x.shape == (4, 28, 28, 1) and y.max() < 10 and loss.get_config()["from_logits"] is False


def test_notebook_runs_a_sweep_and_shows_the_plot():
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(NOTEBOOKS / "sweep.ipynb", as_version=4)
    env = {**os.environ, "KDIST_FAKE_DEVICES": "8"}
    client = NotebookClient(
        notebook, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    )
    client.execute(env=env)
    outputs = [o for cell in notebook.cells if cell.cell_type == "code" for o in cell.get("outputs", [])]
    text = "".join(
        o.get("text", "") + "".join(str(v) for k, v in o.get("data", {}).items() if k == "text/plain") for o in outputs
    )
    assert "★" in text and "say nothing about accelerators" in text
    assert any("image/png" in o.get("data", {}) for o in outputs)


def test_table_keeps_the_compact_columns_on_narrow_consoles(result):
    full = [str(c.header) for c in sweep_table(result, width=None).columns]
    assert {"IQR", "compile s", "notes"} <= set(full)
    console = Console(record=True, width=100)
    console.print(result)
    text = console.export_text()
    assert "vs bare" in text and "IQR" not in text and "compile s" not in text
