"""`kdist demo`: the main job."""


def register(commands, common):
    demo = commands.add_parser(
        "demo", parents=[common], help="train a small model under a preset and show where its variables live"
    )
    demo.add_argument("--mesh", default="2x4", help='mesh preset (default "2x4")')
    demo.add_argument("--steps", type=int, default=5, help="training steps (default 5)")
    demo.add_argument("--batch-size", type=int, default=64, help="global batch size (default 64)")
    demo.set_defaults(run=run, default_fake_devices=8)


def run(args):
    from kdist.demo import run_demo

    run_demo(args.mesh, steps=args.steps, batch_size=args.batch_size)
    return 0
