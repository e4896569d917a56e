"""docs/plan.md's tables of estimate / XLA's figure, and README.md's count of them, say what the stored rows say, so
no re-estimate leaves them stale.

Each table of docs/plan.md is read against the stored results
(`benchmarks/results/planner_vs_deviceless_*.json`, or `..._*.json` for short)
named in the paragraphs before it, the nearest first, or else in its section.
A table with families down the side and meshes across (or meshes down the
side and families across, or one config's meshes across) gives each cell's
ratio, which must be the ratio of a stored row of that family and mesh; a
table of ranges ("estimate / XLA | lowest | highest") gives each family's
smallest and largest ratio, the meshes they were on and how many rows were in
their band ("in band": "5 of 6"). A cell that names a family or mesh no
stored row has (a config planned once, not stored) is not checked;
`test_the_checks_reach_most_of_the_tables` keeps that rare.
"""

import importlib.util
import json
import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
STORED = re.compile(r"planner_vs_deviceless_[a-z0-9_]+\.json|`\.\.\.(_[a-z0-9_]+\.json)`")
TABLE = re.compile(r"(?:^\|.*\|\n)+", re.M)
RATIO = re.compile(r"\**([0-9]\.[0-9]{3})\**(?: \([^)]*\))?")  # "1.063 (1.049)": today's, (an earlier estimate's)
RANGE = re.compile(r"([0-9]\.[0-9]{3})[–-]([0-9]\.[0-9]{3})")


def _norm(name):
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _stored_rows(text):
    """The rows of the stored results `text` names."""
    names = {m.group(1) and f"planner_vs_deviceless{m.group(1)}" or m.group(0) for m in STORED.finditer(text)}
    return [r for n in sorted(names) if (RESULTS / n).exists() for r in json.loads((RESULTS / n).read_text())["rows"]]


def _tables():
    """(section title, table, [stored rows]) per table of docs/plan.md: the rows of the files named in each
    paragraph before it, the nearest first, then in its whole section (a cell is read against the first that has
    its family and mesh)."""
    text = (ROOT / "docs" / "plan.md").read_text()
    for section in re.split(r"\n(?=#{2,3} )", text):
        for table in TABLE.finditer(section):
            paragraphs = [*reversed(section[: table.start()].split("\n\n")), section]
            rowsets = [rows for rows in map(_stored_rows, paragraphs) if rows]
            if rowsets:
                yield section.splitlines()[0], table.group(0), rowsets


def _of_family(rowsets, name, mesh=None):
    """The rows of the family a table names ("Gemma 3", "XLM-RoBERTa", "GPT-2 small, batch 16 x 512"; on `mesh`)
    in the first of `rowsets` that has any: its config's first word, else a label it begins, else the first word
    it begins with ("Gemma-2B widths": gemma)."""
    wanted = _norm(name.split(",")[0])
    for rows in rowsets:
        rows = [r for r in rows if mesh in (None, r["mesh"])]
        for matches in (
            lambda r: _norm(r["config"].split()[0]) == wanted,
            lambda r: _norm(r["config"]).startswith(wanted),
            lambda r: wanted.startswith(_norm(r["config"].split()[0])),
        ):
            found = [r for r in rows if matches(r)]
            if found:
                return found
    return []


def _cells(table):
    return [[c.strip() for c in line.strip().strip("|").split("|")] for line in table.strip().splitlines()]


def _checked_cells():
    """(where, what the doc says, what the stored rows say or None when no row is of that family and mesh)."""
    for title, table, rowsets in _tables():
        head, _, *body = _cells(table)
        if "lowest" in head and "highest" in head:
            yield from _range_cells(title, head, body, rowsets)
        elif "=" in head[0]:  # one config, meshes across
            for line in body:
                for mesh, cell in zip(head, line):
                    if RATIO.fullmatch(cell):
                        yield _ratio_cell(title, rowsets[0][0]["config"].split()[0], mesh, cell, rowsets)
        elif any("=" in h for h in head[1:]):  # families down, meshes across
            for line in body:
                for mesh, cell in zip(head[1:], line[1:]):
                    if RATIO.fullmatch(cell):
                        yield _ratio_cell(title, line[0], mesh, cell, rowsets)
        elif head[0].startswith("mesh"):  # meshes down, families across ("mesh (512)" starts a second block)
            for line in body:
                for i, cell in enumerate(line[1:], 1):
                    mesh = line[max(j for j in range(i) if head[j].startswith("mesh"))]
                    if "=" in mesh and RATIO.fullmatch(cell):
                        yield _ratio_cell(title, head[i], mesh, cell, rowsets)


def _ratio_cell(title, family, mesh, cell, rowsets):
    ratios = [f"{r['ratio']:.3f}" for r in _of_family(rowsets, family, mesh.strip("* "))]
    said = RATIO.fullmatch(cell).group(1)
    return f"{title} | {family} | {mesh}", said, (said if said in ratios else ratios) if ratios else None


def _range_cells(title, head, body, rowsets):
    low_at, high_at = head.index("lowest"), head.index("highest")
    for line in body:
        found = RANGE.fullmatch(line[1]) if len(line) > high_at else None
        if not found:
            continue
        family = _of_family(rowsets, line[0])
        where = f"{title} | {line[0]}"
        if not family:
            yield where, line[1], None
            continue
        ratios = {r["mesh"]: f"{r['ratio']:.3f}" for r in family}
        low, high = min(ratios.values()), max(ratios.values())
        said = f"{found.group(1)}–{found.group(2)} | {line[low_at]} | {line[high_at]}"
        # Where several meshes share the smallest or largest ratio, the table may name any of them.
        lowest = line[low_at] if ratios.get(line[low_at]) == low else min(ratios, key=ratios.get)
        highest = line[high_at] if ratios.get(line[high_at]) == high else max(ratios, key=ratios.get)
        yield where, said, f"{low}–{high} | {lowest} | {highest}"
        if "in band" in head and re.fullmatch(r"\d+ of \d+", line[head.index("in band")]):
            in_band = f"{sum(bool(r['in_band']) for r in family)} of {len(family)}"
            yield f"{where} | in band", line[head.index("in band")], in_band


def test_every_figure_of_plan_md_tables_is_a_stored_row():
    stale = [(where, said, stored) for where, said, stored in _checked_cells() if stored is not None and said != stored]
    assert not stale, "docs/plan.md differs from benchmarks/results (where, docs, stored):\n" + "\n".join(
        map(str, stale)
    )


def test_the_checks_reach_most_of_the_tables():
    """Most cells are checked (a change to the tables' form would otherwise pass unchecked)."""
    cells = list(_checked_cells())
    unmatched = [where for where, _, stored in cells if stored is None]
    assert len(cells) > 1000 and len(unmatched) < 0.05 * len(cells), unmatched


def _planner_accuracy():
    """benchmarks/planner_accuracy.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("planner_accuracy", ROOT / "benchmarks" / "planner_accuracy.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_counts_every_stored_row_as_the_stored_rows_say():
    accuracy = _planner_accuracy()
    rows = list(accuracy.stored_rows())
    table = accuracy.counts(rows)
    assert accuracy.readme_table((ROOT / "README.md").read_text()) == accuracy.markdown(table), (
        "README.md's accuracy table is stale: run python benchmarks/planner_accuracy.py"
    )
    every = table["all"]
    assert every["rows"] == len(rows) == sum(t["rows"] for name, t in table.items() if name != "all")
    assert every["accepted"] + every["under"] + every["over"] == every["rows"]


def test_the_accuracy_count_puts_each_row_in_one_column_by_its_ratio():
    accuracy = _planner_accuracy()

    def row(estimate, band=True, in_band=True):
        return "f.json", {"estimate": estimate, "xla_gpu_deviceless": 100.0, "ratio": estimate / 100.0} | (
            {"band_class": "fsdp transformers", "in_band": in_band} if band else {}
        )

    table = accuracy.counts([row(94.9, in_band=False), row(95.0), row(110.0), row(110.1), row(120.0, in_band=False)])
    assert table["fsdp transformers"] == {
        "rows": 5, "accepted": 2, "under": 1, "over": 2, "in_band": 3, "under_band": 1
    }  # fmt: skip
    assert accuracy.counts([row(90.0, band=False)])[accuracy.NO_BAND] == {
        "rows": 1, "accepted": 0, "under": 1, "over": 0, "in_band": 0, "under_band": 0
    }  # fmt: skip
