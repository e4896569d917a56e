"""Rule files: a `RuleSet` written to and read from JSON or TOML.

A rules file is data only: it is parsed with `json` or `tomllib`, never
executed. Each rule has a `pattern` (a regex matched against whole variable
paths), `layouts` (one layout, or a list of candidate layouts) and optionally a
`note`, a `family`, `follows` and `fsdp_dim` (see `kdist.Rule`). An axis is a
role ("data", "fsdp", "model", "expert"), a mesh axis name, "..." (as many
replicated dimensions as needed) or a replicated dimension: `null` in JSON,
`""` in TOML (which has no null).

JSON:

```json
{"name": "mine", "rules": [
  {"pattern": ".*/(query|key|value)/kernel", "layouts": [[null, "model", null], [null, null, "model"]]},
  {"pattern": ".*/bias", "layouts": [], "note": "replicated"}
]}
```

TOML:

```toml
name = "mine"

[[rules]]
pattern = '.*/(query|key|value)/kernel'
layouts = [["", "model", ""], ["", "", "model"]]

[[rules]]
pattern = '.*/bias'
layouts = []
note = "replicated"
```
"""

import json
import pathlib

from kdist.checks import shown
from kdist.errors import RuleError
from kdist.rules.rule import RuleSet
from kdist.textdata import parse_json, parse_toml, read_text

FORMATS = (".json", ".toml")


def load_rules(path):
    """Read a `RuleSet` from a `.json` or `.toml` file.

    Example:

    ```python
    rules = kdist.load_rules("my_model_rules.toml")
    keras.distribution.set_distribution(kdist.preset("2x4", rules=rules))
    ```

    Raises:
        RuleError: naming the file and the bad entry when the file cannot be
            read, parsed or turned into rules.
    """
    path = _path(path)
    fmt = _format(path)
    what = f"rules file {str(path)!r}"
    text = read_text(path, what, RuleError)
    data = parse_json(text, what, RuleError) if fmt == ".json" else parse_toml(text, what, RuleError)
    data = _from_toml_nulls(data) if fmt == ".toml" else data
    return RuleSet.from_dict(data, f"rules file {str(path)!r}", default_name=path.stem)


def save_rules(rules, path):
    """Write `rules` (a `RuleSet`) to a `.json` or `.toml` file that `load_rules` reads back.

    Example:

    ```python
    kdist.save_rules(kdist.get_rules("llama"), "llama_rules.toml")
    ```
    """
    if not isinstance(rules, RuleSet):
        raise RuleError(f"save_rules writes a kdist.RuleSet; received {type(rules).__name__}.")
    path = _path(path)
    fmt = _format(path)
    data = rules.to_dict()
    text = json.dumps(data, indent=2) + "\n" if fmt == ".json" else _to_toml(data)
    if path.exists() and not path.is_file():
        raise RuleError(
            f"Cannot write rules file {str(path)!r}: it exists and is not a regular file; give a file path."
        )
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as e:
        raise RuleError(f"Cannot write rules file {str(path)!r}: {e.strerror or e}.") from None


def _path(path):
    if not isinstance(path, (str, pathlib.PurePath)) or not str(path):
        raise RuleError(f"A rules file path must be a non-empty string or path; received {shown(path)}.")
    return pathlib.Path(path)


def _format(path):
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise RuleError(f"Rules file {str(path)!r} must end in .json or .toml; received {suffix or 'no suffix'!r}.")
    return suffix


def _from_toml_nulls(data):
    """TOML has no null: an empty string axis means a replicated dimension."""
    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        return data
    for entry in data["rules"]:
        if isinstance(entry, dict) and isinstance(entry.get("layouts"), list):
            entry["layouts"] = _nulls(entry["layouts"])
    return data


def _nulls(value):
    if isinstance(value, list):
        return [_nulls(v) for v in value]
    return None if value == "" else value


def _to_toml(data):
    lines = [f"name = {_toml_string(data['name'])}"]
    for rule in data["rules"]:
        lines += ["", "[[rules]]", f"pattern = {_toml_string(rule['pattern'])}"]
        layouts = ", ".join("[" + ", ".join(_toml_string(a or "") for a in layout) + "]" for layout in rule["layouts"])
        lines.append(f"layouts = [{layouts}]")
        for key in ("note", "family"):
            if key in rule:
                lines.append(f"{key} = {_toml_string(rule[key])}")
        if "follows" in rule:
            lines.append("follows = [" + ", ".join(_toml_string(x) for x in rule["follows"]) + "]")
        if "fsdp_dim" in rule:
            lines.append(f"fsdp_dim = {rule['fsdp_dim']}")
    return "\n".join(lines) + "\n"


def _toml_string(text):
    if "'" not in text and all(" " <= c != "\x7f" for c in text):
        return f"'{text}'"  # a literal string: regex backslashes stay as they are
    return json.dumps(text, ensure_ascii=False)  # a basic string: JSON escapes are valid in TOML
