"""How much of each keras-hub backbone kdist's rules shard, next to keras-hub's own layout maps.

For every backbone family in `kdist.rules.hub.FAMILIES`, the tiny backbone of
`kdist.zoo.tiny_entries()` is built abstractly (no weights allocated) and each
variable is placed with `ShardedDistribution.place` under the default rules
(rules="auto") on a 2x4 and a 1x8 mesh. The share is the fraction of parameter
bytes with a dimension on the "model" axis, over all parameters (norms and
biases included). Where keras-hub ships `get_layout_map`, its map is applied
the way `keras.distribution.ModelParallel` applies it (Keras's LayoutMap
lookup, no fallbacks) on the same meshes: the share it shards, or the first
variable whose sharded dimension does not divide (JAX refuses to place it).
The published configurations of kdist's zoo (llama3-8b, gemma-2b, ...) are
measured the same way.

Run: python benchmarks/rules_coverage.py
Writes benchmarks/results/rules_coverage.json and the tables of docs/rules.md
(between the "coverage" markers).
"""

import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("KDIST_FAKE_DEVICES", "8")  # before kdist starts jax
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kdist.machine import machine_info  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "rules_coverage.json"
DOCS = ROOT / "docs" / "rules.md"
MESHES = ("2x4", "1x8")
PUBLISHED = (
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
    "mistral-7b",
    "mixtral-8x7b",
    "qwen3-moe-30b",
    "gemma-2b",
    "gemma-7b",
    "bert-base",
    "gpt2-base",
    "vit-base",
)


def variables(model):
    return [(v.path, tuple(v.shape), v.dtype) for v in model.weights]


def nbytes(shape, dtype):
    import numpy as np

    return math.prod(shape) * np.dtype(dtype).itemsize


def kdist_share(vs, spec):
    import kdist

    dist = kdist.preset(spec)
    total = sharded = 0
    for path, shape, dtype in vs:
        size = nbytes(shape, dtype)
        total += size
        sharded += size if "model" in dist.place(path, shape).axes else 0
    return sharded / total


def own_map_share(backbone_class, vs, spec):
    """keras-hub's own layout map applied as ModelParallel would: a share, or why it fails."""
    import kdist

    if not has_own_map(backbone_class):
        return None
    device_mesh = kdist.mesh(spec)
    layout_map = backbone_class.get_layout_map(
        device_mesh, model_parallel_dim_name="model", data_parallel_dim_name="data"
    )
    sizes = dict(zip(device_mesh.axis_names, device_mesh.shape))
    total = sharded = 0
    for path, shape, dtype in vs:
        size = nbytes(shape, dtype)
        total += size
        try:
            layout = layout_map[path]
        except ValueError as e:
            return f"fails: {path} matches several keys ({str(e)[:60]}...)"
        axes = tuple(layout.axes) if layout is not None else ()
        for dim, axis in zip(shape, axes):
            if axis is not None and dim % sizes[axis]:
                return f"fails: {path} {shape} -> {axes}"
        sharded += size if "model" in axes else 0
    return sharded / total


def has_own_map(backbone_class):
    from keras_hub.src.models.backbone import Backbone

    return any("get_layout_map" in k.__dict__ for k in backbone_class.__mro__ if k is not Backbone)


def measure():
    import keras
    import keras_hub

    import kdist
    from kdist import zoo
    from kdist.rules.hub import BACKBONES

    rows = []
    for family, build in zoo.tiny_entries().items():
        keras.backend.clear_session(free_memory=False)
        vs = variables(kdist.abstract_model(build))
        cls = getattr(keras_hub.models, BACKBONES[family])
        row = {"family": family, "backbone": cls.__name__, "own_map": has_own_map(cls), "variables": len(vs)}
        for spec in MESHES:
            row[f"kdist {spec}"] = kdist_share(vs, spec)
            row[f"keras-hub {spec}"] = own_map_share(cls, vs, spec)
        rows.append(row)
    published = []
    for name in PUBLISHED:
        keras.backend.clear_session(free_memory=False)
        model = zoo.load_model(name)
        vs = variables(model)
        row = {"model": name, "backbone": type(model).__name__, "parameters": sum(math.prod(s) for _, s, _ in vs)}
        for spec in MESHES:
            row[f"kdist {spec}"] = kdist_share(vs, spec)
            row[f"keras-hub {spec}"] = own_map_share(type(model), vs, spec)
        published.append(row)
    return rows, published


def cell(value):
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return f"{100 * value:.1f}%"


def tables(rows, published):
    shares = " | ".join(f"kdist {s}" for s in MESHES) + " | " + " | ".join(f"keras-hub map {s}" for s in MESHES)
    rule = "|" + "---|" * (3 + 2 * len(MESHES))
    lines = [
        "Tiny configs (`kdist.zoo.tiny_entries()`):",
        "",
        f"| family | keras-hub backbone | ships get_layout_map | {shares} |",
        rule,
    ]
    lines += [_row(r["family"], r["backbone"], "yes" if r["own_map"] else "no", r) for r in rows]
    lines += [
        "",
        "Published configs (zoo entries):",
        "",
        f"| model | keras-hub backbone | parameters | {shares} |",
        rule,
    ]
    lines += [_row(r["model"], r["backbone"], f"{r['parameters'] / 1e9:.2f}e9", r) for r in published]
    return "\n".join(lines)


def _row(first, second, third, r):
    kdist_cells = " | ".join(cell(r[f"kdist {s}"]) for s in MESHES)
    hub_cells = " | ".join(cell(r[f"keras-hub {s}"]) for s in MESHES)
    return f"| {first} | {second} | {third} | {kdist_cells} | {hub_cells} |"


def write_docs(text, meta):
    start, end = "<!-- coverage:start -->", "<!-- coverage:end -->"
    docs = DOCS.read_text()
    if start not in docs or end not in docs:
        raise SystemExit(f"{DOCS} lacks the {start} / {end} markers.")
    versions = f"keras-hub {meta['keras_hub']}, keras {meta['keras']}, jax {meta['jax']}"
    stamp = f"Generated by `python benchmarks/rules_coverage.py` ({versions})."
    before, rest = docs.split(start, 1)
    after = rest.split(end, 1)[1]
    DOCS.write_text(f"{before}{start}\n{stamp}\n\n{text}\n{end}{after}")


def main():
    t = time.time()
    rows, published = measure()
    meta = machine_info()
    meta["seconds"] = round(time.time() - t, 1)
    text = tables(rows, published)
    print(text)
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"machine": meta, "tiny": rows, "published": published}, indent=2) + "\n")
    write_docs(text, meta)
    print(f"\nwrote {RESULTS.relative_to(ROOT)} and the tables of {DOCS.relative_to(ROOT)} in {meta['seconds']} s")


if __name__ == "__main__":
    main()
