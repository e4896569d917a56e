"""Writing files and directories atomically: to a temporary sibling, then renamed into place.

A reader never sees half a file, and a failed write leaves what was there:
the old content is replaced only once the new one is complete, and deleted
only after the new one is in place.
"""

import contextlib
import fcntl
import os
import shutil
import tempfile


def write_text(path, text):
    """Write `text` to `path` atomically (a temporary file in the same directory, then `os.replace`).

    Example:

    ```python
    write_text("/tmp/report.json", '{"ok": true}')
    ```
    """
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    sync_directory(directory)


def sibling(path, tag):
    """A hidden sibling of `path` named after it and `tag` ("/a/ckpt", "new" -> "/a/.ckpt.new").

    The name is the same in every process, so processes that share a file
    system agree on it without talking to each other.
    """
    path = os.path.abspath(os.fspath(path))
    return os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.{tag}")


def replace_directory(new, path):
    """Move the complete directory `new` to `path`, replacing what is there; the old content is deleted last.

    `path` is renamed aside first (so `path` is, at every moment, either the
    old or the new content, and briefly absent), then `new` is renamed onto
    it, and only then is the old content deleted.
    """
    new, path = os.path.abspath(os.fspath(new)), os.path.abspath(os.fspath(path))
    old = None
    if os.path.lexists(path):
        old = sibling(path, f"old{os.getpid()}")
        remove(old)
        os.replace(path, old)
    try:
        os.replace(new, path)
    except BaseException:
        if old is not None and not os.path.lexists(path):
            os.replace(old, path)  # put the old content back
        raise
    sync_directory(os.path.dirname(path))
    if old is not None:
        remove(old)


def remove(path):
    """Delete a file, link or directory tree at `path` if there is one."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


@contextlib.contextmanager
def exclusive(directory):
    """Hold an exclusive lock on `directory` while the block runs: one kdist writer there at a time.

    The lock is the kernel's (`flock` on the directory itself), so it creates
    no file and is released when the block ends or the process dies. It
    orders processes of separate runs on one machine; the processes of one
    multi-process run coordinate through barriers instead and must not take it.
    """
    fd = os.open(directory, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def sync_directory(directory):
    """Flush a directory's entries (renames, new files) to disk, where the platform allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def staged_directory(path):
    """Yield a temporary sibling directory of `path`; on success it replaces `path` (kept on failure).

    The caller checks beforehand that replacing `path` is allowed. The old
    content is moved aside first and deleted only after the new one is in place.

    Example:

    ```python
    with staged_directory("/tmp/out") as staging:
        write_text(os.path.join(staging, "a.txt"), "a")
    ```
    """
    path = os.path.abspath(os.fspath(path))
    parent = os.path.dirname(path)
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=parent)
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_directory(staging, path)
