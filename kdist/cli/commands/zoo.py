"""`kdist zoo`: the model names that `inspect`, `lint`, `plan` and `sweep` take."""

from rich.console import Console
from rich.text import Text

from kdist.render.text import table
from kdist.zoo import ENTRIES


def register(commands, common):
    parser = commands.add_parser("zoo", help="list the models kdist's commands take by name")
    parser.add_argument("--names", action="store_true", help="print the names only, one per line")
    parser.set_defaults(run=run)


def run(args):
    if args.names:
        print("\n".join(ENTRIES))
        return 0
    t = table(
        title="Models by name (kdist inspect / lint / plan / sweep MODEL)",
        caption="Also: module:function returning a Keras model, or a keras-hub preset (hub:NAME or a preset "
        "directory). keras-hub entries need keras-hub (pip install 'kdist[hub]' and pip install --no-deps keras-hub).",
    )
    t.add_column("name", no_wrap=True)
    t.add_column("model")
    for name, (_, description) in ENTRIES.items():
        t.add_row(Text(name), Text(description))
    Console().print(t)
    return 0
