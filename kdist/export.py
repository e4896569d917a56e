"""JSON export shared by kdist's reports (inspect, lint, plan, sweep)."""

import json

import numpy as np


class JSONExport:
    """Adds `to_json` to a report class that has `to_dict()`."""

    def to_json(self, path=None, indent=1):
        """The report as JSON text; also written to `path` when given."""
        text = json.dumps(self.to_dict(), indent=indent, default=_plain)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text


def _plain(value):
    if isinstance(value, (np.generic, np.ndarray)):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
