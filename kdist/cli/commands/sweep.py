"""`kdist sweep MODEL`: time a model's training step under several mesh shapes."""

from pathlib import Path

import jax
from rich.console import Console

from kdist.cli.commands._shared import non_negative, positive
from kdist.errors import SpecError
from kdist.render.plot import pyplot
from kdist.runtime.sample_data import random_data
from kdist.runtime.sweeping import sweep
from kdist.zoo import MODEL_HELP, load_model


def register(commands, common):
    parser = commands.add_parser(
        "sweep", parents=[common], help="train a model under each mesh shape and compare step time, memory and losses"
    )
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument(
        "--devices", type=positive, default=8, metavar="N", help="devices to build meshes on (default 8)"
    )
    parser.add_argument(
        "--meshes",
        default="all",
        metavar="SPECS",
        help='comma-separated mesh specs, e.g. "8x1,2x4,fsdp" (default "all": every data x model '
        "factorisation, then dp, fsdp and tp)",
    )
    parser.add_argument(
        "--top",
        type=positive,
        metavar="K",
        help="sweep only the K meshes kdist plan ranks first (by estimated step time) and show the estimate",
    )
    parser.add_argument("--steps", type=positive, default=10, metavar="N", help="timed steps per shape (default 10)")
    parser.add_argument(
        "--warmup", type=non_negative, default=2, metavar="N", help="warm-up steps per shape (default 2)"
    )
    parser.add_argument("--batch-size", type=positive, default=64, metavar="B", help="global batch size (default 64)")
    parser.add_argument("--strict", action="store_true", help="fail shapes whose rules had to replicate a dimension")
    parser.add_argument(
        "--seed", type=non_negative, default=0, metavar="S", help="seed for weights and data (default 0)"
    )
    parser.add_argument(
        "--out", metavar="DIR", help="write sweep.csv, sweep.json and sweep.png there (needs matplotlib)"
    )
    parser.set_defaults(run=run, default_fake_devices=lambda args: args.devices)


def run(args):
    console = Console()
    if args.out:
        pyplot()  # a missing matplotlib is said now, not after the sweep
    available = jax.devices()
    if args.devices > len(available):
        raise SpecError(
            f"--devices {args.devices}: this machine has {len(available)} {available[0].platform} device(s). "
            f"Pass --devices 1 to {len(available)}, or --fake-devices {args.devices} for fake CPU devices."
        )
    if args.top is not None and args.meshes != "all":
        raise SpecError(f"--top {args.top} picks the meshes from the plan: leave out --meshes {args.meshes!r}.")
    samples = args.batch_size * min(args.steps + args.warmup, 4)
    data, loss = random_data(load_model(args.model, abstract=True), samples, seed=args.seed)
    meshes = "all" if args.meshes == "all" else [m.strip() for m in args.meshes.split(",") if m.strip()]
    result = sweep(
        lambda: load_model(args.model, abstract=False),
        data,
        meshes,
        steps=args.steps,
        warmup=args.warmup,
        batch_size=args.batch_size,
        loss=loss,
        devices=available[: args.devices],
        strict=args.strict,
        seed=args.seed,
        top=args.top,
    )
    console.print(result)
    if args.top is not None and len(result.rows) < args.top:
        console.print(f"--top {args.top}: the plan ranks {len(result.rows)} meshes that fit; all were swept.")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.to_csv(out / "sweep.csv")
        result.to_json(out / "sweep.json")
        pyplot().close(result.plot(out / "sweep.png", title=f"kdist sweep: {args.model}"))
        console.print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, {out / 'sweep.png'}", highlight=False)
    return 0 if result.ok_rows else 1
