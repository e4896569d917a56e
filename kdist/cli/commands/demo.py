"""`kdist demo`: the main job."""

from kdist.cli.commands._shared import positive
from kdist.demo import DEFAULT_MESH, run_demo


def register(commands, common):
    demo = commands.add_parser(
        "demo", parents=[common], help="train a small model under a preset and show where its variables live"
    )
    demo.add_argument(
        "--mesh",
        help=f'mesh preset (default "{DEFAULT_MESH}" on 8 devices; on other device counts, a preset that fits them)',
    )
    demo.add_argument("--steps", type=positive, default=5, help="training steps (default 5)")
    demo.add_argument("--batch-size", type=positive, default=64, help="global batch size (default 64)")
    demo.set_defaults(run=run, default_fake_devices=8)


def run(args):
    run_demo(args.mesh, steps=args.steps, batch_size=args.batch_size)
    return 0
