"""The script the engine fault tests run in every task (under mpirun or srun): join, then one task fails.

    engine_fault.py FAULT RANK [sleep]

Every task calls `kdist.initialize()`, prints `READY rank engine coordinator`
(task 0 also `LISTEN address` for each socket listening on the coordinator's
port, hex as in /proc/net/tcp) and meets the others in a barrier. Then task RANK prints `FAULT time` (and
writes the time to the file named by FAULT_TIME_FILE, when set: an engine may
drop a task's forwarded lines) and

- `raise`: raises RuntimeError;
- `exit`: calls sys.exit(3);
- `kill`: SIGKILLs itself (what the OOM killer does);

while the others wait for it in a second barrier (which it never reaches),
or with `sleep`, sleep for 10 minutes outside any collective (so only the
engine can end them).
"""

import os
import signal
import sys
import time

import kdist

config = kdist.initialize()

from jax.experimental import multihost_utils  # noqa: E402
from sockets import listening  # noqa: E402  (this folder is the script's sys.path[0])

fault, fault_rank = sys.argv[1], int(sys.argv[2])
print(f"READY {config.process_id} {config.engine} {config.coordinator_address}", flush=True)
if config.process_id == 0:
    for address in listening(int(config.coordinator_address.rsplit(":", 1)[1])):
        print(f"LISTEN {address}", flush=True)
multihost_utils.sync_global_devices("ready")
if config.process_id == fault_rank:
    fault_time = time.time()
    print(f"FAULT {fault_time!r}", flush=True)
    if os.environ.get("FAULT_TIME_FILE"):
        with open(os.environ["FAULT_TIME_FILE"], "w") as f:
            f.write(repr(fault_time))
    if fault == "raise":
        raise RuntimeError(f"boom in process {config.process_id}")
    if fault == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(3)
if sys.argv[3:] == ["sleep"]:
    time.sleep(600)
multihost_utils.sync_global_devices("never")
print("DONE", flush=True)
