"""`kdist plan`: rank the meshes of N devices for a model and recommend one."""

import jax
from rich.console import Console

from kdist.cli.commands._shared import positive, sequence_lengths
from kdist.errors import PlanError
from kdist.planning.planner import plan
from kdist.planning.targets import DEFAULT_MARGIN
from kdist.units import parse_size
from kdist.zoo import MODEL_HELP, load_model, model_builder


def register(commands, common):
    parser = commands.add_parser(
        "plan",
        parents=[common],
        help="rank every mesh of N devices for a model (memory per device, communication) and recommend one",
        description=(
            "Plan a model's mesh without devices: every data x fsdp x model split of --devices is "
            "estimated from the model's real variables (built abstractly, nothing allocated). "
            "--verify also compiles the training step of each mesh (on fake CPU devices without an "
            "accelerator) and shows XLA's memory figures beside the estimate."
        ),
    )
    parser.add_argument("model", metavar="MODEL", help=MODEL_HELP)
    parser.add_argument("--devices", type=positive, required=True, help="number of devices to plan for")
    parser.add_argument("--batch-size", type=positive, required=True, help="global batch size")
    parser.add_argument(
        "--seq-len",
        type=sequence_lengths,
        help="sequence length (tokens per example) for models with unknown lengths; or lengths per input: "
        '"encoder_token_ids=512,decoder_token_ids=128" (NAME=AxB for one per unknown dimension)',
    )
    parser.add_argument("--memory", help='memory per device, e.g. "80GB", "80GiB", "8e10"')
    parser.add_argument("--optimizer", default="adam", help='Keras optimizer name (default "adam")')
    parser.add_argument("--dtype", help='count weights and activations in this dtype (e.g. "bfloat16")')
    parser.add_argument("--bandwidth", default="100GB/s", help='collective bandwidth per device (default "100GB/s")')
    parser.add_argument("--latency", type=float, default=10e-6, help="seconds per collective step (default 1e-5)")
    parser.add_argument("--rules", help='rule set name or rules file (default: kdist\'s rules, "auto")')
    parser.add_argument(
        "--target",
        help='accelerator to plan for: "gpu", "tpu", "cpu" or a kind such as "H100" (default: the local one, else gpu)',
    )
    parser.add_argument(
        "--attention",
        choices=("fused", "materialized"),
        help="attention as the target runs it (default: Keras's choice there)",
    )
    parser.add_argument(
        "--remat", action="store_true", help="rematerialise every layer: less memory, up to about +33%% compute"
    )
    parser.add_argument(
        "--margin",
        type=float,
        default=DEFAULT_MARGIN,
        help=f"share of device memory kept free (default {DEFAULT_MARGIN})",
    )
    parser.add_argument(
        "--verify-target",
        metavar="KIND",
        help='with --verify: compile for this GPU kind without one ("H100"; needs jax-cuda13-pjrt)',
    )
    parser.add_argument(
        "--verify",
        action="store_true",
        help="compile each mesh's training step on fake devices (as many as --devices, unless --fake-devices says)",
    )
    parser.add_argument("--json", action="store_true", help="print the plan as JSON")
    # Planning needs no devices; --verify compiles on --devices fake devices.
    parser.set_defaults(run=run, default_fake_devices=lambda args: args.devices if args.verify else None)


def run(args):
    console = Console()
    if args.verify and jax.device_count() < args.devices:
        raise PlanError(
            f"--verify compiles on {args.devices} devices, but JAX has {jax.device_count()}: add --fake-devices "
            f"{args.devices}."
        )
    # The builder, not a built model: --verify rebuilds the model for each mesh.
    model = model_builder(args.model) if args.verify else load_model(args.model)
    result = plan(
        model,
        args.devices,
        batch_size=args.batch_size,
        sequence_length=args.seq_len,
        optimizer=args.optimizer,
        dtype=args.dtype,
        memory_per_device=parse_size(args.memory, "--memory") if args.memory is not None else None,
        bandwidth=args.bandwidth,
        latency=args.latency,
        rules=args.rules,
        verify=args.verify,
        progress=not args.json,
        target=args.target,
        attention=args.attention,
        remat=args.remat,
        margin=args.margin,
        verify_target=args.verify_target,
    )
    if args.json:
        print(result.to_json())
    else:
        console.print(result)
    return 0 if result.recommendation is not None else 1
