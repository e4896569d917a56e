"""What runs first in every Python process `kdist launch` starts: fault reports and a heartbeat.

The launcher runs this module's source with `python -c` (it imports no
kdist module, so the script's own imports and environment settings come
first), followed by the target: `script PATH ARGS...`, `module NAME ARGS...`
or `code TEXT ARGS...`. It then

- runs the target as `python PATH`, `python -m NAME` or `python -c TEXT`
  would (same `sys.argv`, `sys.path[0]` and `__main__`);
- on an uncaught exception (or `sys.exit` with a non-zero code) prints the
  traceback, writes a one-line account to the file named by
  KDIST_LAUNCH_FAULT_FILE and ends the process at once with `os._exit`:
  a process of a JAX distributed run would otherwise wait for its peers
  at exit (jax's shutdown barrier), and the launcher could not tell;
- makes C's stdout line-buffered (Python's `-u`, which the launcher sets,
  leaves it unbuffered): C++ libraries such as Gloo print one line in
  several writes, and a line the script prints from another thread would
  otherwise land in the middle of theirs;
- writes a heartbeat line every second to the pipe named by
  KDIST_LAUNCH_HEARTBEAT_FD: where the main thread is (file:line), so the
  launcher can tell a process that makes no progress from a busy one, and
  "done" when the target has returned (the process may then wait for its
  peers at exit). The heartbeat thread has ended by then: CPython ends a
  daemon thread still running at exit wherever it is, and one ended inside
  a C++ destructor (a jax array freed by its garbage collection) aborts the
  process ("terminate called after throwing an instance of ...").
"""

import ctypes
import json
import os
import runpy
import sys
import threading
import traceback

FAULT_FILE = "KDIST_LAUNCH_FAULT_FILE"
HEARTBEAT_FD = "KDIST_LAUNCH_HEARTBEAT_FD"
BEAT_SECONDS = 1.0
LINE_BUFFERED = 1  # _IOLBF in glibc's stdio.h
C_BUFFER_BYTES = 8192


def main(argv):
    """Run the target in `argv` ([kind, target, *args]) under the fault handler and the heartbeat."""
    fault_file = os.environ.pop(FAULT_FILE, None)
    last_beat = _start_heartbeat(os.environ.pop(HEARTBEAT_FD, None))
    _line_buffer_c_stdout()
    kind, target, *args = argv
    try:
        _run(kind, target, args)
    except SystemExit as e:
        if e.code is None or e.code == 0:
            last_beat()
            raise
        code = e.code if isinstance(e.code, int) else 1
        if not isinstance(e.code, int):
            print(e.code, file=sys.stderr)  # as Python does for sys.exit("message")
        _end(fault_file, {"exit": code}, code)
    except BaseException as e:  # every uncaught exception ends the process, KeyboardInterrupt included
        fault = {"exception": type(e).__name__, "hint": ""}
        try:
            traceback.print_exception(type(e), e, _user_frames(e.__traceback__))
            fault = {"exception": _describe(e), "hint": _hint(e)}
        except Exception:  # an exception whose message cannot be made: still end the process now
            pass
        _end(fault_file, fault, 1)
    last_beat()


def _run(kind, target, args):
    if kind == "script":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
        runpy.run_path(target, run_name="__main__")
    elif kind == "module":
        sys.argv = [target, *args]
        sys.path[0] = os.getcwd()
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        namespace = {"__name__": "__main__", "__builtins__": __builtins__}
        exec(compile(target, "<string>", "exec"), namespace)


def _user_frames(tb):
    """The traceback without this module's and runpy's frames, as `python script.py` would print it."""
    ours = {main.__code__, _run.__code__}
    while tb is not None and (tb.tb_frame.f_code in ours or tb.tb_frame.f_globals.get("__name__") == "runpy"):
        tb = tb.tb_next
    return tb


def _line_buffer_c_stdout():
    try:
        libc = ctypes.CDLL(None)
        libc.malloc.restype = ctypes.c_void_p
        # glibc gives no buffer for a NULL one; this one is never freed, as C flushes stdout at exit.
        buffer = ctypes.c_void_p(libc.malloc(C_BUFFER_BYTES))
        libc.setvbuf(ctypes.c_void_p.in_dll(libc, "stdout"), buffer, LINE_BUFFERED, C_BUFFER_BYTES)
    except (OSError, ValueError, AttributeError):  # no C library, or one without that symbol: leave it as it is
        pass


def _end(fault_file, fault, code):
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    try:
        ctypes.CDLL(None).fflush(None)  # os._exit leaves C's buffers unwritten
    except (OSError, AttributeError):
        pass
    if fault_file:
        try:
            with open(fault_file, "w", encoding="utf-8") as f:
                json.dump(fault, f)
        except OSError:
            pass
    os._exit(code)


def _describe(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:300]}" if text else type(error).__name__


def _hint(error):
    """Advice when a process of a multi-process run fails on devices without having joined the run."""
    try:
        processes = int(os.environ.get("KERAS_DISTRIBUTION_NUM_PROCESSES", "1"))
    except ValueError:
        return ""
    internals = sys.modules.get("kdist.jax_internals")
    joined = internals is None or internals.in_distributed_run()
    if processes < 2 or joined or "device" not in str(error).lower():
        return ""
    return (
        f"this process is one of {processes} but never joined the run, so it sees only its own devices: "
        "call kdist.initialize() first thing in the script, before building a preset, a model or any array."
    )


def _start_heartbeat(fd):
    """Start the heartbeat thread; returns the function that ends it and sends "done"."""
    if fd is None:
        return lambda: None
    fd = int(fd)
    os.set_inheritable(fd, False)
    main_thread = threading.main_thread().ident

    def send(line):  # from the thread, then ("done") from the main thread once the thread has ended
        try:
            os.write(fd, (line.replace("\n", " ") + "\n").encode(errors="replace"))
        except OSError:
            pass

    stop = threading.Event()

    def beat():
        while not stop.is_set():
            frame = sys._current_frames().get(main_thread)
            send(f"at {frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}" if frame else "at ?")
            del frame  # held only while read: the main thread's locals are freed by the main thread, not here
            stop.wait(BEAT_SECONDS)

    thread = threading.Thread(target=beat, name="kdist-launch-heartbeat", daemon=True)
    thread.start()

    def last():
        stop.set()
        thread.join()
        send("done")

    return last


if __name__ == "__main__":
    main(sys.argv[1:])
