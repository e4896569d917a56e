"""`kdist zoo`, and the model names every command takes: zoo names, module:function, keras-hub presets."""

import json

import pytest

from kdist.cli import main
from kdist.zoo import ENTRIES


def test_zoo_lists_every_name(capsys):
    assert main(["zoo", "--names"]) == 0
    assert capsys.readouterr().out.split() == list(ENTRIES)
    assert main(["zoo"]) == 0
    out = capsys.readouterr().out
    assert "llama3-8b" in out and "module:function" in out


def test_a_keras_hub_preset_directory_is_a_model(tmp_path, capsys):
    keras_hub = pytest.importorskip("keras_hub")
    backbone = keras_hub.models.LlamaBackbone(
        vocabulary_size=64, num_layers=1, num_query_heads=4, num_key_value_heads=2, hidden_dim=32, intermediate_dim=64
    )
    backbone.save_to_preset(str(tmp_path / "preset"))
    assert main(["lint", str(tmp_path / "preset"), "--mesh", "1x4", "--json"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["summary"]["variables"] == len(backbone.weights)
    assert "building" in out.err  # progress goes to stderr, never into the JSON
    assert main(["lint", "hub:no_such_preset_anywhere", "--mesh", "1x4"]) == 2
    assert "kdist: error: Cannot build the keras-hub preset 'no_such_preset_anywhere'" in capsys.readouterr().err
