"""The `kdist` command line. Every command takes `--fake-devices N`."""

import argparse
import importlib
import importlib.util
import os
import pkgutil
import sys

import kdist.commands


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kdist", description="Keras 3 distributed training on JAX: presets, checks and reports."
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--fake-devices", type=int, metavar="N",
        help="run on N fake CPU devices (the default where a command has one and no accelerator is installed)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in pkgutil.iter_modules(kdist.commands.__path__):
        importlib.import_module(f"kdist.commands.{module.name}").register(commands, common)
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo", *argv])
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # tf.data is imported by Keras; keep its logs quiet
    _choose_devices(args)
    import kdist  # selects the JAX backend and applies KDIST_FAKE_DEVICES

    try:
        return args.run(args)
    except kdist.KdistError as e:
        print(f"kdist: error: {e}", file=sys.stderr)
        return 2


def _choose_devices(args):
    from kdist.devices import ENV_VAR, fake_devices

    n = args.fake_devices
    if n is None and not os.environ.get(ENV_VAR) and not _has_accelerator():
        default = getattr(args, "default_fake_devices", None)
        n = default(args) if callable(default) else default
    if n is not None:
        fake_devices(n)


def _has_accelerator():
    plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "jax_rocm7_plugin", "libtpu")
    return any(importlib.util.find_spec(name) for name in plugins)


if __name__ == "__main__":
    sys.exit(main())
