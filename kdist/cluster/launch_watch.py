"""Watching launched processes for hangs: their output lines and the heartbeats `launch_child` sends.

A process counts as hung after `hang_timeout` seconds when

- it runs under `launch_child` (a Python target) and has sent no heartbeat
  (stopped, or frozen holding the GIL), or has printed nothing while its
  main thread stayed on one line (a wait, a deadlock, a collective whose
  peers never come);
- it is any other command and has printed nothing.

A process whose target has returned ("done": it may wait for its peers at
exit) is not watched. When several processes are stalled, the one stalled
first is named: the others usually wait for it.
"""

import collections
import threading
import time

TAIL_LINES = 20


class _Rank:
    def __init__(self, bootstrapped, now):
        self.bootstrapped = bootstrapped
        self.tail = collections.deque(maxlen=TAIL_LINES)
        self.last_output = now
        self.last_beat = now
        self.where = None
        self.where_since = now
        self.done = False


class Watch:
    """What the launcher knows about each process's progress; fed by its reader threads.

    Example:

    ```python
    watch = Watch(2, bootstrapped=True, hang_timeout=300)
    watch.output(0, "epoch 1")                  # an output line of rank 0
    watch.beat(1, "at train.py:12 in main")     # a heartbeat of rank 1
    watch.hung(time.monotonic(), finished=set())  # None, or (rank, what happened)
    ```
    """

    def __init__(self, n, bootstrapped, hang_timeout):
        now = time.monotonic()
        self.ranks = [_Rank(bootstrapped, now) for _ in range(n)]
        self.hang_timeout = hang_timeout
        self.lock = threading.Lock()

    def output(self, rank, line):
        """Record an output line of `rank`."""
        with self.lock:
            watched = self.ranks[rank]
            watched.tail.append(line)
            watched.last_output = time.monotonic()

    def beat(self, rank, line):
        """Record a heartbeat line of `rank`: "at FILE:LINE in FUNCTION", or "done"."""
        now = time.monotonic()
        with self.lock:
            watched = self.ranks[rank]
            watched.last_beat = now
            if line == "done":
                watched.done = True
            elif line.startswith("at ") and line[3:] != watched.where:
                watched.where, watched.where_since = line[3:], now

    def hung(self, now, finished):
        """(rank, what it did) for the process stalled first past `hang_timeout`, or None."""
        limit = self.hang_timeout
        if limit is None:
            return None
        stalled = []
        with self.lock:
            for rank, watched in enumerate(self.ranks):
                if rank in finished or watched.done:
                    continue
                if watched.bootstrapped and now - watched.last_beat > limit:
                    silent = now - watched.last_beat
                    stalled.append(
                        (watched.last_beat, rank, f"sent no heartbeat for {silent:.0f} s (stopped or frozen)")
                    )
                    continue
                since = max(watched.last_output, watched.where_since) if watched.bootstrapped else watched.last_output
                if now - since > limit:
                    where = f" while its main thread stayed at {watched.where}" if watched.where else ""
                    stalled.append((since, rank, f"printed nothing{where} for {now - since:.0f} s"))
        if not stalled:
            return None
        stalled.sort()
        _, rank, what = stalled[0]
        others = [r for _, r, _ in stalled[1:]]
        also = f"; processes {others} stalled after it" if others else ""
        return rank, f"hung: it {what} (hang_timeout={limit:g} s){also}"
