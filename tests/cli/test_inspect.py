"""`kdist inspect`: JSON, tables, grids, errors and the fake devices a mesh needs."""

import json

from kdist.cli import main
from kdist.cli.commands._shared import devices_for


def test_cli_json_with_optimizer_and_filter(capsys):
    assert main(["inspect", "mlp", "--mesh", "2x4", "--json", "--var", "d1/kernel", "--optimizer", "adam"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {v["path"] for v in data["variables"]} == {
        "mlp/d1/kernel",
        "adam/mlp_d1_kernel_momentum",
        "adam/mlp_d1_kernel_velocity",
    }
    assert data["source"] == "abstract" and data["optimizer"] == "adam"
    assert all(d["total"] == 3 * 784 * 50 * 4 for d in data["devices"])


def test_cli_table_and_grid(capsys):
    assert (
        main(["inspect", "mlp", "--mesh", "2x4", "--grid", "mlp/d1/kernel", "--rows", "data", "--cols", "model"]) == 0
    )
    out = capsys.readouterr().out
    assert "by layer, largest first (abstract)" in out and "[:, 150:200]" in out


def test_cli_errors(capsys):
    assert main(["inspect", "no-such-model", "--mesh", "2x4"]) == 2
    assert "Unknown model 'no-such-model'" in capsys.readouterr().err
    assert main(["inspect", "mlp", "--mesh", "2x4", "--optimizer", "adamz"]) == 2
    assert "Unknown optimizer 'adamz'" in capsys.readouterr().err


def test_default_fake_devices_fit_the_mesh():
    assert [
        devices_for(s) for s in ("2x4", "4x8", "2x2x4", "data=-1,model=2", "data=-1,model=16", "dp", "model=2")
    ] == [8, 32, 16, 8, 16, 8, 2]
