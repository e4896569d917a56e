"""`kdist sweep`: a sweep from the command line, its files, and its errors."""

import json

from kdist.cli import build_parser, main


def test_cli_sweep(tmp_path, capsys):
    for argv, devices in ((["sweep", "mlp", "--devices", "4"], 4), (["sweep", "mlp"], 8)):
        args = build_parser().parse_args(argv)
        assert args.default_fake_devices(args) == devices
    code = main(
        [
            "sweep",
            "tests.runtime.test_sweeps:tiny_model",
            "--meshes",
            "4x2,1x8",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--batch-size",
            "8",
            "--strict",
            "--out",
            str(tmp_path),
        ]
    )
    out = " ".join(capsys.readouterr().out.split())
    assert code == 0
    assert "4x2 ★" in out and "1x8 failed (layout)" in out and "say nothing about accelerators" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sweep.csv", "sweep.json", "sweep.png"]
    rows = json.loads((tmp_path / "sweep.json").read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "failed"]
    assert main(["sweep", "no-such-model"]) == 2
    assert "kdist: error: Unknown model 'no-such-model'" in capsys.readouterr().err


def test_cli_sweep_top_beyond_the_plan_sweeps_every_fitting_mesh_and_says_so(capsys):
    argv = ["sweep", "tests.runtime.test_sweeps:tiny_model", "--top", "99", "--steps", "1", "--warmup", "0"]
    assert main([*argv, "--batch-size", "8"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    swept = int(out.split("--top 99: the plan ranks ")[1].split()[0])
    assert 1 < swept < 99 and out.endswith("meshes that fit; all were swept.")
    # fake CPU devices: the measured times are proxies, so no measured / estimated ratio is shown
    assert "est. ms" in out and "meas/est" not in out and "CPU proxies, not comparable" in out
