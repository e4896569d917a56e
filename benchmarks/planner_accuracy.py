"""Every stored row of the planner against XLA:GPU's deviceless compile, counted by the class of its band.

Reads the rows of benchmarks/results/planner_vs_deviceless_*.json (the estimate
beside XLA:GPU's figure compiled for deviceless H100s, written by
planner_vs_deviceless_sharded.py and planner_vs_gpu.py --deviceless) and counts,
per class of the band a plan prints (docs/plan.md, "What fits"), the rows issue
21's rule accepts (0.95 <= estimate / XLA's figure <= 1.10), those more than 5%
under, those more than 10% over, those inside the band the plan printed for
them, and those under it (XLA's figure above the band's top: the plan promised
too little). Rows stored without a band are counted apart. No compile runs here:
it sums what the stored rows say, so it is as current as their last re-estimate.

Run: python benchmarks/planner_accuracy.py
Writes benchmarks/results/planner_accuracy.json and README.md's table (between
the "accuracy" markers); tests/test_doc_figures.py checks that table against
the stored rows.
"""

import collections
import json
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
README = ROOT / "README.md"
MARKERS = ("<!-- accuracy:start -->", "<!-- accuracy:end -->")
NO_BAND = "no band stored"
COLUMNS = (
    ("rows", "rows"),
    ("accepted", "0.95–1.10"),
    ("under", "more than 5% under"),
    ("over", "more than 10% over"),
    ("in_band", "in their band"),
    ("under_band", "under their band"),
)


def stored_rows():
    """(file name, row) of every stored row with a ratio, file by file."""
    for path in sorted(RESULTS.glob("planner_vs_deviceless_*.json")):
        for row in json.loads(path.read_text())["rows"]:
            if row.get("ratio") is not None:
                yield path.name, row


def counts(rows):
    """{band class: {column: count}} over `rows` ((file, row) pairs), and "all" over every row."""
    table = collections.defaultdict(collections.Counter)
    for _, row in rows:
        ratio = row["estimate"] / row["xla_gpu_deviceless"]
        banded = row.get("in_band") is not None  # None: the plan printed no band (an uncalibrated target)
        for name in (row.get("band_class", NO_BAND), "all"):
            counter = table[name]
            counter["rows"] += 1
            counter["accepted"] += 0.95 <= ratio <= 1.10
            counter["under"] += ratio < 0.95
            counter["over"] += ratio > 1.10
            counter["in_band"] += banded and row["in_band"]
            counter["under_band"] += banded and not row["in_band"] and ratio < 1
    return {name: {key: int(table[name][key]) for key, _ in COLUMNS} for name in table}


def markdown(table):
    """The README table of `counts`: one line per band class, the classes by rows, then every row."""
    names = sorted((n for n in table if n != "all"), key=lambda n: (n == NO_BAND, -table[n]["rows"], n))
    lines = ["| band class | " + " | ".join(title for _, title in COLUMNS) + " |"]
    lines.append("| --- |" + " ---: |" * len(COLUMNS))
    for name in [*names, "all"]:
        label = "**every stored row**" if name == "all" else name
        lines.append(f"| {label} | " + " | ".join(str(table[name][key]) for key, _ in COLUMNS) + " |")
    return "\n".join(lines)


def readme_block(text):
    """README.md's accuracy markers and what lies between them, or None."""
    found = re.search(re.escape(MARKERS[0]) + ".*?" + re.escape(MARKERS[1]), text, re.S)
    return found.group(0) if found else None


def readme_table(text):
    """The table between README.md's accuracy markers (empty if none is there yet), or None."""
    block = readme_block(text)
    return None if block is None else block[len(MARKERS[0]) : -len(MARKERS[1])].strip("\n")


def main():
    rows = list(stored_rows())
    table = counts(rows)
    files = sorted({name for name, _ in rows})
    text = markdown(table)
    print(text)
    out = {"files": files, "counts": table, "summed_at": time.strftime("%Y-%m-%d %H:%M:%S")}
    (RESULTS / "planner_accuracy.json").write_text(json.dumps(out, indent=1) + "\n")
    readme = README.read_text()
    block = readme_block(readme)
    if block is None:
        raise SystemExit(f"README.md has no {MARKERS[0]} ... {MARKERS[1]} block to write the table into")
    README.write_text(readme.replace(block, f"{MARKERS[0]}\n{text}\n{MARKERS[1]}"))


if __name__ == "__main__":
    main()
