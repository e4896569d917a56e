"""Exit on fault: once a process has joined a job, a Python fault in it ends it at once, so the engine ends the job.

A process of a JAX distributed run that raises would otherwise wait at
exit in jax's shutdown barrier (up to 300 s) while its peers wait for it
in a collective: `mpirun` and `srun` see no failed task and the job hangs.
`install(config)` (called by `kdist.initialize()`) sets

- `sys.excepthook`: print "kdist: process R of N (ENGINE) raised ...", the
  traceback, flush, and `os._exit(1)`;
- a wrapper around `sys.exit` and an `atexit` handler: a non-zero
  `sys.exit(code)` ends the process with `os._exit(code)` once Python's
  own clean-up (finally blocks, context managers) has run;
- under an `srun` step, on exiting: `scancel` of the step one second
  later (srun ends a step when a task fails only with
  `--kill-on-bad-exit`); the second lets slurmstepd forward this task's
  last lines, which a cancelled step may otherwise drop.

`kdist launch` has its own fault handling (`launch_child.py`), which runs first.
"""

import atexit
import os
import shutil
import subprocess
import sys
import traceback

_OUTPUT_GRACE_S = 1  # seconds between this task's exit and the scancel of its step
_state = {"installed": False, "exit_code": None, "label": "", "scancel": None}


def install(config):
    """Make uncaught exceptions and non-zero `sys.exit` end this process of `config`'s job at once."""
    _state["label"] = f"process {config.process_id} of {config.num_processes} ({config.engine})"
    _state["scancel"] = _slurm_step_cancel()
    if _state["installed"]:
        return
    _state["installed"] = True
    sys.excepthook = _excepthook
    real_exit = sys.exit

    def exit_recording_code(code=None):
        _state["exit_code"] = code
        real_exit(code)

    exit_recording_code.__doc__ = real_exit.__doc__
    sys.exit = exit_recording_code
    atexit.register(_exit_now_if_failed)  # registered after jax started: runs before jax's own clean-up


def _excepthook(kind, value, tb):
    try:
        print(f"kdist: {_state['label']} raised {kind.__name__}; ending the job.", file=sys.stderr)
        traceback.print_exception(kind, value, tb)
    finally:
        _end(1)


def _exit_now_if_failed():
    code = _state["exit_code"]
    if code is None or code == 0:
        return
    if not isinstance(code, int):
        code = 1  # sys.exit("message"): Python has printed the message already
    print(f"kdist: {_state['label']} exited with code {code}; ending the job.", file=sys.stderr)
    _end(code)


def _end(code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    if _state["scancel"]:
        try:
            subprocess.Popen(
                ["sh", "-c", f'sleep {_OUTPUT_GRACE_S}; exec "$@"', "scancel", *_state["scancel"]],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        except OSError:
            pass
    os._exit(code)


def _slurm_step_cancel():
    """The `scancel` command that ends this srun step's other tasks, or None outside an srun step."""
    job, step = os.environ.get("SLURM_JOB_ID"), os.environ.get("SLURM_STEP_ID")
    command = shutil.which("scancel")
    if not (job and step and command):
        return None
    return [command, "--quiet", f"{job}.{step}"]
