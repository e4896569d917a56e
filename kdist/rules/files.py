"""Rule files: a `RuleSet` written to and read from JSON or TOML.

A rules file is data only: it is parsed with `json` or `tomllib`, never
executed. Each rule has a `pattern` (a regex matched against whole variable
paths), `layouts` (one layout, or a list of candidate layouts) and optionally a
`note` and a `family`. An axis is a role ("data", "fsdp", "model", "expert"),
a mesh axis name, "..." (as many replicated dimensions as needed) or a
replicated dimension: `null` in JSON, `""` in TOML (which has no null).

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

from kdist.errors import RuleError

FORMATS = (".json", ".toml")
_TOP_KEYS = {"name", "rules"}
_RULE_KEYS = {"pattern", "layouts", "note", "family"}


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
    path = pathlib.Path(path)
    fmt = _format(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise RuleError(f"Cannot read rules file {str(path)!r}: {e.strerror or e}.") from None
    except UnicodeDecodeError as e:
        raise RuleError(f"Rules file {str(path)!r} is not UTF-8 text: {e}.") from None
    try:
        if fmt == ".json":
            data = json.loads(text)
        else:
            import tomllib

            data = tomllib.loads(text)
    except (ValueError, TypeError) as e:  # json.JSONDecodeError and tomllib.TOMLDecodeError are ValueErrors
        raise RuleError(f"Rules file {str(path)!r} is not valid {fmt[1:].upper()}: {e}.") from None
    data = _from_toml_nulls(data) if fmt == ".toml" else data
    return rules_from_data(data, f"rules file {str(path)!r}", default_name=path.stem)


def save_rules(rules, path):
    """Write `rules` (a `RuleSet`) to a `.json` or `.toml` file that `load_rules` reads back."""
    path = pathlib.Path(path)
    fmt = _format(path)
    data = rules.to_dict()
    text = json.dumps(data, indent=2) + "\n" if fmt == ".json" else _to_toml(data)
    path.write_text(text, encoding="utf-8")


def rules_from_data(data, source="rule set", default_name="custom"):
    """Build a `RuleSet` from plain data, with errors that name `source` and the bad entry."""
    from kdist.rules.rule import Rule, RuleSet

    if not isinstance(data, dict) or not isinstance(data.get("rules"), list):
        raise RuleError(
            f"The {source} must be a mapping with a 'rules' list (and optionally a 'name'); "
            f"received {_kind(data)}."
        )
    unknown = sorted(set(data) - _TOP_KEYS)
    if unknown:
        raise RuleError(f"The {source} has unknown top-level keys {unknown}; expected {sorted(_TOP_KEYS)}.")
    name = data.get("name", default_name)
    if not isinstance(name, str):
        raise RuleError(f"The {source} has name {name!r}; a name must be a string.")
    rules = []
    for i, entry in enumerate(data["rules"]):
        where = f"rules[{i}] of the {source}"
        if not isinstance(entry, dict):
            raise RuleError(f"{where} must be a mapping with 'pattern' and 'layouts'; received {_kind(entry)}.")
        missing = sorted({"pattern", "layouts"} - set(entry))
        unknown = sorted(set(entry) - _RULE_KEYS)
        if missing or unknown:
            problem = f"lacks {missing}" if missing else f"has unknown keys {unknown}"
            raise RuleError(f"{where} {problem}; a rule has keys {sorted(_RULE_KEYS)} ('pattern' and 'layouts' required).")
        for key in ("pattern", "note", "family"):
            if key in entry and not isinstance(entry[key], str):
                raise RuleError(f"{where}: {key!r} must be a string; received {entry[key]!r}.")
        try:
            rules.append(Rule(entry["pattern"], _layouts(entry["layouts"], where), entry.get("note", ""), entry.get("family", "")))
        except RuleError as e:
            raise RuleError(f"{where}: {e}") from None
    return RuleSet(rules, name=name)


def _layouts(value, where):
    if not isinstance(value, list):
        raise RuleError(f"{where}: 'layouts' must be a list (one layout or a list of layouts); received {value!r}.")
    if all(a is None or isinstance(a, str) for a in value):
        return [tuple(value)]
    layouts = []
    for layout in value:
        if not isinstance(layout, list) or not all(a is None or isinstance(a, str) for a in layout):
            raise RuleError(
                f"{where}: each layout must be a list of axis names (a role, a mesh axis, '...' "
                f"or null for a replicated dimension); received {layout!r}."
            )
        layouts.append(tuple(layout))
    return layouts


def _format(path):
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        raise RuleError(f"Rules file {str(path)!r} must end in .json or .toml; received {suffix or 'no suffix'!r}.")
    return suffix


def _kind(value):
    return f"{type(value).__name__} {value!r}"[:120]


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
    return "\n".join(lines) + "\n"


def _toml_string(text):
    if "'" not in text and all(" " <= c != "\x7f" for c in text):
        return f"'{text}'"  # a literal string: regex backslashes stay as they are
    return json.dumps(text, ensure_ascii=False)  # a basic string: JSON escapes are valid in TOML
