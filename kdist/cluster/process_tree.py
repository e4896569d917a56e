"""The processes a launched run started, found through /proc, and stopping every one of them.

A launched process can start children that leave its process group
(`setsid`, `start_new_session=True`, daemons): killing the group misses
them, and once their parent is gone they are re-parented to init.
`ProcessTree` finds them two ways, without psutil:

- by ancestry: the descendants of the run's processes, scanned while the
  run goes on, so a child re-parented later is still known;
- by the run's marker in their environment (`KDIST_LAUNCH_ID=<id>`), which
  every descendant inherits unless it clears its environment.

Each process is remembered with its start time, so a reused process id is
never signalled. Linux only (/proc); elsewhere only the process groups of
the run's own processes are signalled.
"""

import os
import signal
import time

MARKER = "KDIST_LAUNCH_ID"


def process_table():
    """{pid: (ppid, pgid, start time, state)} of every process /proc lists ({} without /proc)."""
    table = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return table
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                data = f.read()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()  # after "pid (command) "
        if len(fields) > 19:
            table[int(name)] = (int(fields[1]), int(fields[2]), int(fields[19]), fields[0].decode())
    return table


class ProcessTree:
    """The processes of one launched run: its ranks and everything they started.

    Example:

    ```python
    tree = ProcessTree("run-1")
    tree.add(proc.pid)      # each launched process
    tree.scan()             # now and then while the run goes on
    tree.stop(grace=5.0)    # SIGTERM, then SIGKILL after `grace` seconds, until none is left
    ```
    """

    def __init__(self, launch_id):
        self.marker = f"{MARKER}={launch_id}".encode()
        self.known = {}  # pid -> start time
        self.groups = set()  # process groups led by the run's own processes
        self.own = _self_and_ancestors()

    def add(self, pid):
        """Track a process the launcher started (it leads its own process group)."""
        entry = process_table().get(pid)
        self.known[pid] = entry[2] if entry else None
        self.groups.add(pid)

    def scan(self, *, environments=False):
        """Record every live descendant of the known processes (and, with `environments`, every marked one)."""
        table = process_table()
        children = {}
        for pid, (ppid, *_rest) in table.items():
            children.setdefault(ppid, []).append(pid)
        stack = [pid for pid in self.known if self._same(pid, table)]
        while stack:
            for child in children.get(stack.pop(), ()):
                if child not in self.known and child not in self.own:
                    self.known[child] = table[child][2]
                    stack.append(child)
        if environments:
            for pid in table:
                if pid not in self.known and pid not in self.own and self._marked(pid):
                    self.known[pid] = table[pid][2]
        return table

    def alive(self, table=None):
        """The tracked processes still running (zombies excluded)."""
        table = process_table() if table is None else table
        return [pid for pid in self.known if self._same(pid, table) and table[pid][3] not in ("Z", "X")]

    def signal(self, sig):
        """Send `sig` to every tracked process and to the process groups the run's processes lead."""
        table = self.scan(environments=True)
        for group in self.groups:
            reused = group in table and not self._same(group, table)  # the id now names another process
            if group not in self.own and not reused:
                _quietly(os.killpg, group, sig)
        for pid in self.alive(table):
            _quietly(os.kill, pid, sig)

    def stop(self, grace):
        """SIGTERM everything, SIGKILL what is left after `grace` seconds, until nothing is left."""
        self.signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and self.alive(self.scan()):
            time.sleep(0.05)
        deadline = time.monotonic() + 5
        while True:
            self.signal(signal.SIGKILL)
            if not self.alive(self.scan(environments=True)) or time.monotonic() > deadline:
                return
            time.sleep(0.05)

    def _same(self, pid, table):
        entry = table.get(pid)
        return entry is not None and self.known.get(pid) in (None, entry[2]) and pid not in self.own

    def _marked(self, pid):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                return self.marker in f.read().split(b"\0")
        except OSError:
            return False


def _self_and_ancestors():
    table = process_table()
    own, pid = set(), os.getpid()
    while pid and pid not in own:
        own.add(pid)
        pid = table.get(pid, (0,))[0]
    return own


def _quietly(kill, target, sig):
    try:
        kill(target, sig)
    except (ProcessLookupError, PermissionError):
        pass
