"""CLI commands: each module here defines `register(commands, common)`.

`commands` is the argparse subparsers object and `common` the parent parser
that carries `--fake-devices`. A command sets `run=function(args) -> exit code`
with `set_defaults`, and may set `default_fake_devices`: the fake CPU device
count on a machine without accelerators, or a function of the parsed args
returning it; and `abstract=True` when it only lays variables out (nothing
runs), so that the default applies on accelerator machines too.
"""
