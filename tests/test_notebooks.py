from pathlib import Path

import nbformat
from nbclient import NotebookClient

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name):
    notebook = nbformat.read(NOTEBOOKS / name, as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOKS)}}
    ).execute()
    return notebook


def _text(output):
    if "text" in output:
        return output["text"]
    return "".join(str(v) for v in output.get("data", {}).values())


def test_quickstart_runs_on_eight_fake_devices():
    notebook = execute("quickstart.ipynb")
    outputs = [
        "".join(_text(o) for o in cell.get("outputs", [])) for cell in notebook.cells if cell.cell_type == "code"
    ]
    assert "ShardedDistribution spec='2x4'" in outputs[1]
    assert "losses:" in outputs[2] and "evaluate:" in outputs[2]
    assert "mlp/d1/kernel" in outputs[3]  # the report, rendered as a table
    assert "sharded share of bytes" in outputs[4] and "spec=P(None, 'model')" in outputs[4]
