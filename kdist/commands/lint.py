"""`kdist lint`: check layout rules against a model built without weights. Exit status 1 on errors."""

import sys


def register(commands, common):
    lint = commands.add_parser(
        "lint",
        parents=[common],
        help="check layout rules against a model (built abstractly) and a mesh; exit 1 on errors",
        description=(
            "Lint the layout rules for MODEL on a mesh without allocating any weight. Exit status: 0 when "
            "there is no error (warnings allowed unless --fail-on warning), 1 when there is, 2 on bad input."
        ),
    )
    lint.add_argument("model", metavar="MODEL", help="a zoo entry (e.g. llama3-8b, tiny-transformer) or module:function returning a model")
    lint.add_argument("--mesh", default="2x4", help='mesh spec (default "2x4"); sizes without -1 need no devices')
    lint.add_argument(
        "--rules", default="auto", metavar="NAME|FILE",
        help='a rule set name ("auto", "keras-core", "llama", ...) or a .json/.toml rules file (default "auto")',
    )
    lint.add_argument("--json", action="store_true", help="print the report as JSON")
    lint.add_argument("--size-threshold", type=int, metavar="BYTES", help="report replicated variables from this size (default 1 MiB)")
    lint.add_argument("--fail-on", choices=("error", "warning"), default="error", help="lowest severity that fails (default error)")
    # An 8-device default as in `kdist demo`: specs with -1 ("data=-1,model=2") resolve against it.
    lint.set_defaults(run=run, default_fake_devices=8)


def run(args):
    from rich.console import Console

    from kdist.linter import SIZE_THRESHOLD, lint
    from kdist.zoo import load_model

    threshold = SIZE_THRESHOLD if args.size_threshold is None else args.size_threshold
    try:
        model = load_model(args.model)  # abstract: no weights allocated
        report = lint(args.rules, model, mesh=args.mesh, size_threshold=threshold)
    except (ValueError, ImportError) as e:  # unknown model, keras-hub missing, a model without variables
        print(f"kdist: error: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(report.to_json(indent=2))
    else:
        Console().print(report)
    failing = report.errors if args.fail_on == "error" else report.errors + report.warnings
    return 1 if failing else 0

