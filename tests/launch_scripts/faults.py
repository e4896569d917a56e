"""The script the launcher's fault tests run in every process: join the run, then fail one way.

    faults.py FAULT RANK TOKEN

Every process calls `kdist.initialize()` (so JAX's distributed client is up
and would keep a failing process alive at exit), prints `READY`, starts
grandchildren whose command line holds TOKEN (one in its process group,
one in a new session, one daemon that double-forks away from it) and prints
`CHILD pid` for each; process 0 prints `LISTEN address` for each socket
listening on the coordinator's port. Once all processes got there,
process RANK prints
`FAULT time` and fails:

- `raise`: raises RuntimeError;
- `exit`: calls sys.exit(3);
- `signal`: kills itself with SIGKILL;
- `hang`: sleeps for an hour;
- `none`: does not fail (the run ends normally).

The other processes work for 2 s, printing, then wait in a collective
barrier for the failed one.
"""

import os
import signal
import subprocess
import sys
import time

import kdist

config = kdist.initialize()

from jax.experimental import multihost_utils  # noqa: E402
from sockets import listening  # noqa: E402  (this folder is the script's sys.path[0])

fault, fault_rank, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rank = config.process_id


def say(line):
    """One line in one write: the processes and grandchildren here share stdout, and print() may split a line."""
    os.write(1, f"{line}\n".encode())


say(f"READY {rank} {os.getpid()}")

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)", token]
DAEMON = (
    "import os, subprocess, sys\n"
    "forked = os.fork()\n"
    "if forked == 0:\n"
    "    os.setsid()\n"
    "    p = subprocess.Popen(sys.argv[1:])\n"
    "    os.write(1, f'CHILD {p.pid}\\n'.encode())\n"
    "    os._exit(0)\n"
    "os.waitpid(forked, 0)\n"  # its CHILD line is out before the fault's traceback can be
)
children = [
    subprocess.Popen(SLEEPER),
    subprocess.Popen(SLEEPER, start_new_session=True),
]
for child in children:
    say(f"CHILD {child.pid}")
subprocess.run([sys.executable, "-c", DAEMON, *SLEEPER], check=True)


if rank == 0:
    for address in listening(int(config.coordinator_address.rsplit(":", 1)[1])):
        say(f"LISTEN {address}")

multihost_utils.sync_global_devices("ready")  # every process has started its children and printed
if rank == fault_rank and fault != "none":
    say(f"FAULT {time.time()!r}")
    if fault == "raise":
        raise RuntimeError(f"boom in process {rank}")
    if fault == "exit":
        sys.exit(3)
    if fault == "signal":
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "hang":
        time.sleep(3600)
else:
    for _ in range(4):
        say("WORKING")
        time.sleep(0.5)
multihost_utils.sync_global_devices("faults")
say("DONE")
