"""docs/plan.md's tables of estimate / XLA's figure say what the stored rows say, so no re-estimate leaves them stale.

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
