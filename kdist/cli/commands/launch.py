"""`kdist launch`: run a script as N processes of one JAX run on this machine."""

import argparse
import sys

from kdist.cli.commands._shared import non_negative, positive, seconds
from kdist.cluster.launcher import DEFAULT_GRACE_PERIOD, DEFAULT_HANG_TIMEOUT, launch


def register(commands, common):
    parser = commands.add_parser(
        "launch",
        help="run a script as N cooperating processes on this machine, each with its own fake CPU devices",
        description=(
            "Start N processes of one multi-process JAX run on this machine. Each process gets "
            "KERAS_DISTRIBUTION_* variables (read by kdist.initialize()), a coordinator on loopback, "
            "gloo CPU collectives and its own fake CPU devices. Output lines are prefixed with the rank. "
            "If a process raises, exits non-zero, is killed or hangs, every process (and everything it "
            "started) is stopped, the process and its last output lines are named, and the exit code is non-zero."
        ),
        usage=(
            "kdist launch [-n N] [--devices-per-process D] [--coordinator HOST:PORT] script.py [args ...]\n"
            "       kdist launch [options] -m module [args ...]\n"
            "       kdist launch [options] -- command [args ...]"
        ),
    )
    parser.add_argument("-n", "--num-processes", type=positive, default=2, help="number of processes (default 2)")
    parser.add_argument(
        "--devices-per-process",
        type=non_negative,
        default=4,
        metavar="D",
        help="fake CPU devices per process (default 4; 0 keeps the real devices)",
    )
    parser.add_argument(
        "--coordinator", metavar="HOST:PORT", help="coordinator address (default 127.0.0.1 and a free port)"
    )
    parser.add_argument("--timeout", type=seconds, metavar="S", help="stop every process after S seconds (S > 0)")
    parser.add_argument(
        "--hang-timeout",
        type=_hang_timeout,
        default=DEFAULT_HANG_TIMEOUT,
        metavar="S",
        help=(
            f"stop the run when a process makes no progress for S seconds (default {DEFAULT_HANG_TIMEOUT:g}; "
            "0 or 'off' never)"
        ),
    )
    parser.add_argument(
        "--grace-period",
        type=_grace_period,
        default=DEFAULT_GRACE_PERIOD,
        metavar="S",
        help=f"seconds between SIGTERM and SIGKILL when stopping processes (default {DEFAULT_GRACE_PERIOD:g}; >= 0)",
    )
    parser.add_argument("-m", dest="module", metavar="MODULE", help="run a Python module, as `python -m MODULE`")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="script.py [args], -m module [args], or any command")
    parser.set_defaults(run=run, fake_devices=None)  # the launcher itself needs no devices


def run(args):
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if args.module:
        command = ["-m", args.module, *command]
    if not command:
        print("kdist: error: give a script to run, e.g. `kdist launch -n 2 train.py`", file=sys.stderr)
        return 2
    result = launch(
        command,
        num_processes=args.num_processes,
        devices_per_process=args.devices_per_process or None,
        coordinator_address=args.coordinator,
        timeout=args.timeout,
        hang_timeout=args.hang_timeout,
        grace_period=args.grace_period,
    )
    text = result.report() if result.returncode else result.message
    print("\n".join(f"kdist launch: {line}" for line in text.splitlines()), file=sys.stderr)
    return result.returncode


def _hang_timeout(text):
    """argparse type: seconds > 0, or 0 / "off" / "none" for no hang detection (None)."""
    if text.strip().lower() in ("0", "off", "none"):
        return None
    return seconds(text)


def _grace_period(text):
    """argparse type: a number of seconds >= 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text!r}") from None
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number of seconds >= 0, got {text}")
    return value
