"""`kdist sweep MODEL`: time a model's training step under several mesh shapes."""

import sys


def register(commands, common):
    sweep = commands.add_parser(
        "sweep", parents=[common], help="train a model under each mesh shape and compare step time, memory and losses"
    )
    sweep.add_argument("model", help='a zoo model ("mlp", "cnn", "tiny-transformer") or "module:function"')
    sweep.add_argument("--devices", type=int, default=8, metavar="N", help="devices to build meshes on (default 8)")
    sweep.add_argument(
        "--meshes", default="all", metavar="SPECS",
        help='comma-separated mesh specs, e.g. "8x1,2x4,fsdp" (default "all": every data x model '
        'factorisation, then dp, fsdp and tp)',
    )
    sweep.add_argument("--steps", type=int, default=10, metavar="N", help="timed steps per shape (default 10)")
    sweep.add_argument("--warmup", type=int, default=2, metavar="N", help="warm-up steps per shape (default 2)")
    sweep.add_argument("--batch-size", type=int, default=64, metavar="B", help="global batch size (default 64)")
    sweep.add_argument("--strict", action="store_true", help="fail shapes whose rules had to replicate a dimension")
    sweep.add_argument("--seed", type=int, default=0, metavar="S", help="seed for weights and data (default 0)")
    sweep.add_argument("--out", metavar="DIR", help="write sweep.csv, sweep.json and sweep.png there")
    sweep.set_defaults(run=run, default_fake_devices=lambda args: args.devices)


def run(args):
    from pathlib import Path

    import jax
    from rich.console import Console

    from kdist.errors import SpecError
    from kdist.sweeps import random_data, sweep
    from kdist.zoo import load_model

    console = Console()
    available = jax.devices()
    if args.devices < 1 or args.devices > len(available):
        raise SpecError(
            f"--devices {args.devices}: this machine has {len(available)} {available[0].platform} device(s). "
            f"Pass --devices 1 to {len(available)}, or --fake-devices {max(args.devices, 1)} on CPU."
        )
    samples = args.batch_size * min(args.steps + args.warmup, 4)
    try:
        data, loss = random_data(load_model(args.model, abstract=True), samples, seed=args.seed)
    except ValueError as e:  # an unknown model, or one random_data cannot feed
        print(f"kdist: error: {e}", file=sys.stderr)
        return 2
    meshes = "all" if args.meshes == "all" else [m.strip() for m in args.meshes.split(",") if m.strip()]
    result = sweep(
        lambda: load_model(args.model, abstract=False), data, meshes,
        steps=args.steps, warmup=args.warmup, batch_size=args.batch_size, loss=loss,
        devices=available[: args.devices], strict=args.strict, seed=args.seed, console=console,
    )
    console.print(result)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        result.to_csv(out / "sweep.csv")
        result.to_json(out / "sweep.json")
        _save_plot(result, out / "sweep.png", f"kdist sweep: {args.model}")
        console.print(f"wrote {out / 'sweep.csv'}, {out / 'sweep.json'}, {out / 'sweep.png'}")
    return 0 if result.ok_rows else 1


def _save_plot(result, path, title):
    import matplotlib.pyplot as plt

    plt.close(result.plot(path, title=title))
