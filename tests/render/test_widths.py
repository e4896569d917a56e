"""Every report reads at 80 columns: no line is longer, and full mesh specs and variable paths appear."""

import io

import keras
import numpy as np
import pytest
from rich.console import Console

import kdist
from kdist.machine import machine_info
from kdist.runtime.sweep_result import SweepResult, SweepRow

LONG = "transformer_layer_12/self_attention_with_a_long_name/query_projection/kernel"  # 74 characters


def long_model():
    inputs = keras.Input((64,))
    x = keras.layers.Dense(128, name="feedforward_intermediate_dense_with_a_long_name")(inputs)
    x = keras.layers.Dense(64, name="feedforward_output_dense_with_a_long_name")(x)
    return keras.Model(inputs, x, name="long")


def _lines(report, width=80):
    console = Console(file=io.StringIO(), width=width, color_system=None)
    console.print(report)
    printed = console.file.getvalue()
    assert str(report).splitlines() == printed.splitlines() or width != 80
    return printed


def _check(text, *wholes):
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, [line for line in lines if len(line) > 80]
    for whole in wholes:
        assert whole in text, whole


def test_sharding_report_at_80_columns():
    with keras.StatelessScope(initialize_variables=False), keras.name_scope("transformer_layer_12"):
        with keras.name_scope("self_attention_with_a_long_name"), keras.name_scope("query_projection"):
            w = keras.Variable(initializer="zeros", shape=(4096, 32, 128), name="kernel")
    report = kdist.inspect([w], kdist.preset("data=2,fsdp=2,model=2"), optimizer="adam")
    _check(_lines(report), LONG, "data=2, fsdp=2, model=2", "adam/")


def test_lint_report_at_80_columns():
    model = kdist.abstract_model(long_model)
    report = kdist.lint(
        kdist.RuleSet([(r"nothing/matches/this/rule/at/all/kernel", ("...", "model"))]), model, "data=2,fsdp=2,model=2"
    )
    text = _lines(report)
    _check(text, "feedforward_intermediate_dense_with_a_long_name/kernel", "nothing/matches/this/rule/at/all/kernel")


def test_plan_at_80_columns_shows_the_ranking_the_recommendation_and_why():
    plan = kdist.plan(kdist.abstract_model(kdist.models.tiny_transformer), 8, batch_size=16, memory_per_device="1GB")
    text = _lines(plan)
    _check(
        text, "data=2,fsdp=2,model=2", "fsdp=4,model=2", "Recommended: " + plan.recommendation.spec, plan.reason[:40]
    )
    assert all(c.spec in text for c in plan.candidates)


def test_reshard_result_at_80_columns():
    keras.distribution.set_distribution(kdist.preset("8x1"))
    model = long_model()
    model.compile(optimizer="adam", loss="mse")
    model.fit(np.zeros((16, 64)), np.zeros((16, 64)), batch_size=8, verbose=0)
    result = kdist.plan_reshape(model, "data=2,fsdp=2,model=2")
    _check(_lines(result), "feedforward_intermediate_dense_with_a_long_name/kernel", "data=2,fsdp=2,model=2")


@pytest.fixture
def sweep_result():
    rows = []
    for i, mesh in enumerate(["data=2,fsdp=2,model=2", "8x1", "fsdp"]):
        row = SweepRow(
            mesh,
            axes={"data": 2},
            step_times=[0.01 * (i + 1)] * 3,
            step_time=0.01 * (i + 1),
            step_time_iqr=0.001,
            samples_per_s=6400.0,
            compile_s=1.5,
            memory={"total": 2**20},
            state_bytes=2**19,
            losses=[2.3, 2.2],
            agreement=0.01,
        )
        rows.append(row)
    rows.append(SweepRow("1x8", status="failed", failure_stage="layout", failure="mesh '1x8' cannot divide " * 5))
    rows[0].fastest = True
    return SweepResult(rows, machine_info(), {"batch_size": 64, "steps": 3, "warmup": 1}, 12.0)


def test_sweep_result_at_80_columns(sweep_result):
    _check(_lines(sweep_result), "data=2,fsdp=2,model=2", "1x8 failed (layout)")
