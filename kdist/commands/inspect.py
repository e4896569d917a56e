"""`kdist inspect`: where each variable of a model lives on a mesh, and how full each device is."""

import math
import re
import sys

# A mesh with a -1 axis ("dp", "data=-1,model=2") absorbs this many fake devices by default.
ABSORB_DEVICES = 8


def register(commands, common):
    inspect = commands.add_parser(
        "inspect",
        parents=[common],
        help="show where each variable of a model (built without weights) lives on a mesh, and bytes per device",
        description=(
            "Build MODEL without allocating weights, lay it out with a mesh preset and report each variable's "
            "layout, shard and bytes per device, each device's memory by kind, and a summary. On a machine "
            "without accelerators it runs on as many fake CPU devices as the mesh needs."
        ),
    )
    inspect.add_argument("model", metavar="MODEL", help="a zoo entry (e.g. mlp, llama3-8b) or module:function returning a model")
    inspect.add_argument("--mesh", default="2x4", help='mesh spec (default "2x4")')
    inspect.add_argument("--rules", metavar="FILE", help="a .json or .toml rules file (default: kdist's built-in rules)")
    inspect.add_argument("--optimizer", metavar="NAME", help="plan optimizer state for this Keras optimizer (adam, adamw, sgd, ...)")
    inspect.add_argument("--var", metavar="REGEX", help="only variables whose path matches REGEX (re.search)")
    inspect.add_argument("--json", action="store_true", help="print the report as JSON")
    inspect.add_argument("--csv", action="store_true", help="print one CSV row per variable")
    inspect.add_argument("--limit", type=int, default=40, metavar="N", help="table rows to show (default 40)")
    inspect.add_argument("--all", action="store_true", help="show every variable")
    inspect.add_argument("--grid", metavar="PATH", help="also draw which slice of variable PATH each device holds")
    inspect.add_argument("--rows", metavar="AXES", help="mesh axes (comma-separated) drawn as grid rows")
    inspect.add_argument("--cols", metavar="AXES", help="mesh axes (comma-separated) drawn as grid columns")
    inspect.set_defaults(run=run, default_fake_devices=lambda args: devices_for(args.mesh))


def devices_for(spec):
    """Devices a mesh spec needs: the product of its sizes, or a multiple of it (>= 8) when one axis is -1.

    >>> devices_for("2x4"), devices_for("4x8"), devices_for("data=-1,model=2"), devices_for("dp")
    (8, 32, 8, 8)
    """
    text = spec.strip().lower().replace(" ", "")
    if text in ("dp", "tp", "fsdp", "auto"):
        return ABSORB_DEVICES
    sizes = [int(s) for s in re.findall(r"-?\d+", text)]
    fixed = math.prod(s for s in sizes if s > 0) or 1
    if -1 not in sizes:
        return fixed
    return fixed * max(1, -(-ABSORB_DEVICES // fixed))


def run(args):
    from rich.console import Console

    import kdist
    from kdist.render import report_renderables
    from kdist.zoo import load_model

    try:
        model = load_model(args.model)  # abstract: no weights allocated
        distribution = kdist.preset(args.mesh, rules=_rules(args.rules))
        report = kdist.inspect(model, distribution, optimizer=args.optimizer)
        if args.var:
            report = report.select(args.var)
    except ValueError as e:
        print(f"kdist: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(indent=2))
        return 0
    if args.csv:
        sys.stdout.write(report.to_csv())
        return 0
    console = Console()
    for renderable in report_renderables(report, limit=None if args.all else args.limit, width=console.width):
        console.print(renderable)
    if args.grid:
        try:
            view = report.grid(args.grid, rows=_axes(args.rows), cols=_axes(args.cols))
        except (KeyError, ValueError) as e:
            print(f"kdist: error: {e.args[0] if e.args else e}", file=sys.stderr)
            return 2
        console.print(view)
    return 0


def _rules(path):
    if path is None:
        return None
    from kdist.rules.files import load_rules

    return load_rules(path)


def _axes(text):
    return None if text is None else tuple(a.strip() for a in text.split(",") if a.strip())
