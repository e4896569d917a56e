"""`kdist lint`: check layout rules against a model built without weights. Exit status 1 on errors."""

from rich.console import Console

from kdist.cli.commands._shared import non_negative
from kdist.linting.lint import SIZE_THRESHOLD, lint
from kdist.render.progress import steps
from kdist.zoo import MODEL_HELP, load_model


def register(commands, common):
    parser = commands.add_parser(
        "lint",
        parents=[common],
        help="check layout rules against a model (built abstractly) and a mesh; exit 1 on errors",
        description=(
            "Lint the layout rules for MODEL on a mesh without allocating any weight. Exit status: 0 when "
            "there is no error (warnings allowed unless --fail-on warning), 1 when there is, 2 on bad input."
        ),
    )
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument("--mesh", default="2x4", help='mesh spec (default "2x4"); sizes without -1 need no devices')
    parser.add_argument(
        "--rules",
        default="auto",
        metavar="NAME|FILE",
        help='a rule set name ("auto", "keras-core", "llama", ...) or a .json/.toml rules file (default "auto")',
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--size-threshold",
        type=non_negative,
        metavar="BYTES",
        help="report replicated variables from this size (default 1 MiB)",
    )
    parser.add_argument(
        "--fail-on", choices=("error", "warning"), default="error", help="lowest severity that fails (default error)"
    )
    # An 8-device default as in `kdist demo`: specs with -1 ("data=-1,model=2") resolve against it.
    parser.set_defaults(run=run, default_fake_devices=8, abstract=True)


def run(args):
    threshold = SIZE_THRESHOLD if args.size_threshold is None else args.size_threshold
    with steps("kdist lint", 2) as progress:
        progress.next(f"building {args.model} abstractly")
        model = load_model(args.model)  # abstract: no weights allocated
        progress.next(f"linting on {args.mesh}")
        report = lint(args.rules, model, mesh=args.mesh, size_threshold=threshold)
    if args.json:
        print(report.to_json(indent=2))
    else:
        Console().print(report)
    failing = report.errors if args.fail_on == "error" else report.errors + report.warnings
    return 1 if failing else 0
