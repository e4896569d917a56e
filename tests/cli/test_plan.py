"""`kdist plan`: planning from the command line."""

import json

from kdist.cli import main


def test_plan_for_512_devices_needs_no_devices(capsys):
    assert main(["plan", "mlp", "--devices", "512", "--batch-size", "1024", "--memory", "16GB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["devices"] == 512 and len(data["candidates"]) == 55
    assert data["memory_per_device"] == 16 * 10**9
