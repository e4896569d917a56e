"""Writing files and directories atomically: to a temporary sibling, then renamed into place.

A reader never sees half a file, and a failed write leaves what was there.
"""

import contextlib
import os
import shutil
import tempfile


def write_text(path, text):
    """Write `text` to `path` atomically (a temporary file in the same directory, then `os.replace`)."""
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


@contextlib.contextmanager
def staged_directory(path):
    """Yield a temporary sibling directory of `path`; on success it replaces `path` (kept on failure).

    The caller checks beforehand that replacing `path` is allowed. The old
    content is moved aside first and deleted only after the new one is in place.
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
    old = None
    if os.path.lexists(path):
        old = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", suffix=".old", dir=parent)
        os.rmdir(old)
        os.replace(path, old)
    os.replace(staging, path)
    if old is not None and os.path.isdir(old):
        shutil.rmtree(old, ignore_errors=True)
    elif old is not None:
        os.unlink(old)
