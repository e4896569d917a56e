"""Progress for long work (sweeps, `plan --verify`, the launcher): a bar on a terminal, plain lines otherwise."""

import contextlib
import time

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class Steps:
    """Reports `total` steps of work: `update(text)` for the current stage, `advance()` when a step is done.

    On a terminal it draws a rich progress bar (gone when done); piped or
    redirected, it writes one line per stage to stderr, so a log shows
    what is running and for how long.
    """

    def __init__(self, title, total, console=None, enabled=True):
        self.title, self.total, self.done = title, total, 0
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.start = time.perf_counter()
        self._bar = None
        self._task = None
        self._begun = False

    def __enter__(self):
        if self.enabled and self.console.is_terminal:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=self.console,
                transient=True,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc):
        if self._bar is not None:
            self._bar.__exit__(*exc)
        return False

    def update(self, text):
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {text}")
        elif self.enabled:
            elapsed = time.perf_counter() - self.start
            self.console.print(
                f"{self.title} [{self.done + 1}/{self.total}, {elapsed:.0f} s]: {text}", highlight=False, markup=False
            )

    def advance(self):
        self.done += 1
        if self._bar is not None:
            self._bar.advance(self._task)

    def next(self, text):
        """Start the next step: the previous one (if any) is done, `text` is the new stage."""
        if self._begun:
            self.advance()
        self._begun = True
        self.update(text)


@contextlib.contextmanager
def steps(title, total, console=None, enabled=True):
    """`with steps("sweep", 7) as progress: progress.update("2x4: compiling"); progress.advance()`."""
    with Steps(title, total, console, enabled and total > 0) as progress:
        yield progress
