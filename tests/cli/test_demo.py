import subprocess
import sys

from tests.subprocess_utils import clean_env


def _python(*argv, timeout=300):
    """`python ARGV` in a fresh process, without this process's device settings, at 120 columns."""
    env = clean_env()
    env["COLUMNS"] = "120"
    return subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, timeout=timeout)


def _kdist(*args):
    return _python("-m", "kdist.cli", *args)


def test_demo_trains_and_reports_placement_on_eight_fake_devices():
    result = _kdist("demo", "--steps", "3")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "8 cpu devices, preset '2x4'" in out
    assert "trained 3 steps" in out
    assert "mlp/d1/kernel" in out and "(·, model)" in out
    assert "Memory per device" in out and "cpu:7" in out


def test_demo_with_another_mesh_and_device_count():
    result = _kdist("demo", "--mesh", "tp", "--fake-devices", "4", "--steps", "2")
    assert result.returncode == 0, result.stderr
    assert "4 cpu devices, preset 'tp'" in result.stdout


def test_bad_spec_exits_with_a_clear_error():
    result = _kdist("demo", "--mesh", "2x3")
    assert result.returncode == 2
    assert "kdist: error: Mesh spec '2x3' asks for 6 devices" in result.stderr


def test_default_fake_device_counts_follow_the_arguments():
    from kdist.cli import build_parser

    def default(*argv):
        args = build_parser().parse_args(list(argv))
        value = args.default_fake_devices
        return value(args) if callable(value) else value

    assert default("demo") == 8
    assert default("inspect", "mlp", "--mesh", "4x8") == 32
    assert default("plan", "mlp", "--devices", "512", "--batch-size", "8") is None  # planning needs no devices
    assert default("plan", "mlp", "--devices", "16", "--batch-size", "8", "--verify") == 16
    assert default("sweep", "mlp", "--devices", "4") == 4


def _kdist_beside_an_accelerator(*args):
    """Run `kdist ARGS` as on a one-GPU machine: an accelerator plugin is installed (simulated), JAX has 1 device."""
    code = (
        "import importlib, sys; cli = importlib.import_module('kdist.cli.main'); "
        f"cli.has_accelerator_plugin = lambda: True; sys.exit(cli.main({list(args)!r}))"
    )
    return _python("-c", code)


def test_demo_on_a_machine_with_one_accelerator_fits_its_mesh_to_the_devices():
    result = _kdist_beside_an_accelerator("demo", "--steps", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "devices: 1 cpu device (the machine's CPU" in out
    assert "The default mesh '2x4' needs 8 devices and JAX has 1 cpu device: using 'dp'" in out
    assert "1 cpu device, preset 'dp'" in out and "trained 2 steps" in out


def test_commands_that_only_lay_out_take_fake_devices_beside_an_accelerator():
    result = _kdist_beside_an_accelerator("inspect", "mlp", "--mesh", "2x4")
    assert result.returncode == 0, result.stderr
    assert "kdist inspect: on 8 fake CPU devices, as nothing runs on them" in result.stderr
    assert "mlp/d1/kernel" in result.stdout
