"""`kdist plan`: rank the meshes of N devices for a model and recommend one."""


def register(commands, common):
    plan = commands.add_parser(
        "plan",
        parents=[common],
        help="rank every mesh of N devices for a model (memory per device, communication) and recommend one",
        description=(
            "Plan a model's mesh without devices: every data x fsdp x model split of --devices is "
            "estimated from the model's real variables (built abstractly, nothing allocated). "
            "--verify also compiles the training step of each mesh on fake CPU devices and shows XLA's "
            "memory figures beside the estimate."
        ),
    )
    plan.add_argument("model", help='a zoo name (e.g. "mlp", "tiny-transformer", "llama3-8b") or "module:function"')
    plan.add_argument("--devices", type=int, required=True, help="number of devices to plan for")
    plan.add_argument("--batch-size", type=int, required=True, help="global batch size")
    plan.add_argument("--seq-len", type=int, help="sequence length (tokens per example) for models with unknown lengths")
    plan.add_argument("--memory", help='memory per device, e.g. "80GB", "80GiB", "8e10"')
    plan.add_argument("--optimizer", default="adam", help='Keras optimizer name (default "adam")')
    plan.add_argument("--dtype", help='count weights and activations in this dtype (e.g. "bfloat16")')
    plan.add_argument("--bandwidth", default="100GB/s", help='collective bandwidth per device (default "100GB/s")')
    plan.add_argument("--latency", type=float, default=10e-6, help="seconds per collective step (default 1e-5)")
    plan.add_argument("--rules", help='rule set name or rules file (default: kdist\'s rules, "auto")')
    plan.add_argument(
        "--verify", action="store_true",
        help="compile each mesh's training step on fake devices (as many as --devices, unless --fake-devices says)",
    )
    plan.add_argument("--json", action="store_true", help="print the plan as JSON")
    # Planning needs no devices; --verify compiles on --devices fake devices.
    plan.set_defaults(run=run, default_fake_devices=lambda args: args.devices if args.verify else None)


def run(args):
    import rich
    from rich.console import Console

    from kdist import zoo
    from kdist.memory import parse_size
    from kdist.planner import plan

    if args.verify:
        _check_devices(args.devices)
    # The builder, not a built model: --verify rebuilds the model for each mesh.
    build = zoo.model_builder(args.model) if args.verify else None
    model = build if build is not None else zoo.load_model(args.model)
    result = plan(
        model,
        args.devices,
        batch_size=args.batch_size,
        sequence_length=args.seq_len,
        optimizer=args.optimizer,
        dtype=args.dtype,
        memory_per_device=parse_size(args.memory, "--memory") if args.memory else None,
        bandwidth=args.bandwidth,
        latency=args.latency,
        rules=args.rules,
        verify=args.verify,
    )
    if args.json:
        print(result.to_json())
    else:
        Console(width=max(rich.get_console().width, 150)).print(result)
    return 0 if result.recommendation is not None else 1


def _check_devices(n):
    import jax

    from kdist.errors import KdistError

    if jax.device_count() < n:
        raise KdistError(f"--verify compiles on {n} devices, but JAX has {jax.device_count()}: add --fake-devices {n}.")

