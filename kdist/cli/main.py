"""The `kdist` command line: parsing, the choice of devices, and one error policy for every command.

Any kdist error (a bad value, a missing optional dependency, a model that
cannot be built) prints one line, `kdist: error: ...`, and exits 2; argparse
does the same for malformed arguments. Tracebacks are for kdist's own bugs.
"""

import argparse
import importlib
import os
import pkgutil
import sys

from kdist.cli import commands
from kdist.cluster.engines import running_alone
from kdist.devices import ENV_VAR, fake_devices, has_accelerator_plugin
from kdist.errors import KdistError
from kdist.version import __version__
from kdist.zoo import hub_models_only

# kdist owns this process: TensorFlow (imported later by tf.data or keras-hub) starts without its
# oneDNN and absl start-up lines. TF_CPP_MIN_LOG_LEVEL alone does not silence the oneDNN one.
QUIET_ENV = {"TF_ENABLE_ONEDNN_OPTS": "0", "TF_CPP_MIN_LOG_LEVEL": "2"}


def build_parser():
    parser = argparse.ArgumentParser(
        prog="kdist", description="Keras 3 distributed training on JAX: presets, checks and reports."
    )
    parser.add_argument("--version", action="version", version=f"kdist {__version__}")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--fake-devices",
        type=device_count,
        metavar="N",
        help="run on N fake CPU devices (0: the machine's real devices). Default: as many as the command needs "
        "when no accelerator is installed",
    )
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in pkgutil.iter_modules(commands.__path__):
        if module.name.startswith("_"):
            continue
        importlib.import_module(f"kdist.cli.commands.{module.name}").register(subcommands, common)
    return parser


def main(argv=None):
    for name, value in QUIET_ENV.items():
        os.environ.setdefault(name, value)
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        args = parser.parse_args(["demo", *argv])
    try:
        # Single-process tools, also inside an srun / mpirun job; they never tokenize: keras-hub starts 4 s sooner.
        with running_alone(), hub_models_only():
            choose_devices(args)
            return args.run(args)
    except KdistError as e:
        print(f"kdist: error: {e}", file=sys.stderr)
        return 2


def choose_devices(args):
    """Give JAX the fake CPU devices asked for (--fake-devices), else the command's default where it applies.

    A command's default (`default_fake_devices`) applies where no accelerator
    is installed; with one, the command runs on the accelerators, unless it
    only lays variables out (`abstract`): then it takes the fake CPU devices
    anyway, since nothing runs on them, and says so in one line.
    """
    n = getattr(args, "fake_devices", None)
    if n is None and not os.environ.get(ENV_VAR):
        default = getattr(args, "default_fake_devices", None)
        n = default(args) if callable(default) else default
        if n and has_accelerator_plugin():
            if getattr(args, "abstract", False):
                print(
                    f"kdist {args.command}: on {n} fake CPU devices, as nothing runs on them "
                    "(--fake-devices 0 for this machine's accelerators)",
                    file=sys.stderr,
                )
            else:
                n = None
    if n:
        fake_devices(n)


def device_count(text):
    """argparse type of --fake-devices: an integer >= 0."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a device count such as 8, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a device count >= 0, got {n}")
    return n
