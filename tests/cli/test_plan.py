"""`kdist plan`: planning from the command line, and the plan as text at 80 columns."""

import json

import kdist
from kdist.cli import main
from kdist.models import mnist_mlp


def test_plan_for_512_devices_needs_no_devices(capsys):
    assert main(["plan", "mlp", "--devices", "512", "--batch-size", "1024", "--memory", "16GB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"] == 512 and len(data["candidates"]) == 55
    assert data["memory_per_device"] == 16 * 10**9
    assert data["margin"] == 0.1 and data["budget"] == int(16 * 10**9 * 0.9) and data["target"] == "gpu"
    best = next(c for c in data["candidates"] if c["spec"] == data["recommendation"])
    low, high = best["band"]
    assert low < best["bytes"]["peak"] < high


def _check_80_columns(text, result):
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, max(lines, key=len)
    for c in result.candidates:  # every mesh spec appears whole, never cut
        assert c.spec in text, c.spec
    return lines


def test_plan_at_80_columns_shows_the_ranking_the_recommendation_and_why(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["plan", "tiny-transformer", "--devices", "8", "--batch-size", "16", "--memory", "16GB"]) == 0
    text = capsys.readouterr().out
    result = kdist.plan(kdist.abstract_model(kdist.models.tiny_transformer), 8, batch_size=16, memory_per_device="16GB")
    lines = _check_80_columns(text, result)
    # the table's rows are indented; a wrapped line of prose may begin with a number ("512 B; peak ...")
    ranks = [line.split()[0] for line in lines if line[:1] == " " and line.strip() and line.split()[0].isdigit()]
    assert ranks == [str(i) for i in range(1, 11)]  # the whole ranking, in order
    flat = " ".join(text.split())
    assert f"Recommended: {result.recommendation.spec}" in flat
    assert "with a 10% margin" in flat and "fastest estimated step" in flat  # why
    assert "step = compute + exposed" in flat and "not measured" in flat  # step times are labelled estimates
    assert "likely" in flat  # the band, not a bare number
    assert "target gpu" in flat and "estimated for gpu" in flat


def test_a_verified_plan_at_80_columns_labels_its_compiled_figures(capsys):
    result = kdist.plan(mnist_mlp, 8, batch_size=64, verify=["data=8", "fsdp=2,model=4"])
    text = str(result)
    _check_80_columns(text, result)
    assert "compiled (cpu)" in text and "CPU proxy" in " ".join(text.split())
