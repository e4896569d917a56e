"""`kdist inspect`: where each variable of a model lives on a mesh, and how full each device is."""

import sys

from rich.console import Console

from kdist.cli.commands._shared import devices_for, positive
from kdist.inspection.inspector import inspect
from kdist.planning.auto import preset
from kdist.render.progress import steps
from kdist.zoo import MODEL_HELP, load_model


def register(commands, common):
    parser = commands.add_parser(
        "inspect",
        parents=[common],
        help="show where each variable of a model (built without weights) lives on a mesh, and bytes per device",
        description=(
            "Build MODEL without allocating weights, lay it out with a mesh preset and report each variable's "
            "layout, shard and bytes per device, each device's memory by kind, and a summary. On a machine "
            "without accelerators it runs on as many fake CPU devices as the mesh needs."
        ),
    )
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument("--mesh", default="2x4", help='mesh spec (default "2x4")')
    parser.add_argument(
        "--rules", metavar="NAME|FILE", help='a rule set name or .json/.toml rules file (default "auto")'
    )
    parser.add_argument(
        "--optimizer", metavar="NAME", help="plan optimizer state for this Keras optimizer (adam, adamw, sgd, ...)"
    )
    parser.add_argument("--var", metavar="REGEX", help="only variables whose path matches REGEX (re.search)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--csv", action="store_true", help="print one CSV row per variable")
    parser.add_argument("--limit", type=positive, default=40, metavar="N", help="variables to show (default 40)")
    parser.add_argument("--all", action="store_true", help="show every variable")
    parser.add_argument("--grid", metavar="PATH", help="also draw which slice of variable PATH each device holds")
    parser.add_argument("--rows", metavar="AXES", help="mesh axes (comma-separated) drawn as grid rows")
    parser.add_argument("--cols", metavar="AXES", help="mesh axes (comma-separated) drawn as grid columns")
    parser.set_defaults(run=run, default_fake_devices=lambda args: devices_for(args.mesh), abstract=True)


def run(args):
    with steps("kdist inspect", 2) as progress:
        progress.next(f"building {args.model} abstractly")
        model = load_model(args.model)  # abstract: no weights allocated
        progress.next(f"laying it out on {args.mesh}")
        report = inspect(model, preset(args.mesh, rules=args.rules), optimizer=args.optimizer)
    if args.var:
        report = report.select(args.var)
    if args.json:
        print(report.to_json(indent=2))
        return 0
    if args.csv:
        sys.stdout.write(report.to_csv())
        return 0
    console = Console()
    for renderable in report.renderables(width=console.width, limit=None if args.all else args.limit):
        console.print(renderable)
    if args.grid:
        try:
            view = report.grid(args.grid, rows=_axes(args.rows), cols=_axes(args.cols))
        except KeyError as e:
            print(f"kdist: error: {e.args[0]}", file=sys.stderr)
            return 2
        console.print(view)
    return 0


def _axes(text):
    return None if text is None else tuple(a.strip() for a in text.split(",") if a.strip())
