"""Ctrl-C and SIGTERM stop a command within seconds, even while the main thread waits on a
compiled decode loop (where Python runs no signal handler until the loop returns).

Inside `interruptible()`, both signals raise KeyboardInterrupt in the main thread as soon
as Python runs there; a watcher thread, woken by the signal itself (`signal.set_wakeup_fd`),
ends the process `grace` seconds later if that has not happened. Either way the command
prints what was saved and exits with status 130. Records are appended whole and fsynced,
and a torn last line is dropped on resume, so an exit at any moment loses nothing written."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from typing import Callable, List, Optional

EXIT_STATUS = 130
_progress: List[Optional[Callable[[], str]]] = [None]
_cleanups: List[Callable[[], None]] = []


def progress(describe: Optional[Callable[[], str]]) -> None:
    """What the interrupted command has saved so far, for the message (e.g. '12 records')."""
    _progress[0] = describe


def on_interrupt(cleanup: Callable[[], None]) -> Callable[[], None]:
    """Run `cleanup` (e.g. remove a half-built directory) if the command is interrupted;
    returns a function that cancels it."""
    _cleanups.append(cleanup)
    return lambda: _cleanups.remove(cleanup) if cleanup in _cleanups else None


def message() -> str:
    saved = _progress[0]() if _progress[0] else "everything written before is kept"
    return f"interrupted: {saved}; run the same command to resume"


def finish() -> int:
    """Run the cleanups and print the message; the exit status to return."""
    while _cleanups:
        with contextlib.suppress(Exception):
            _cleanups.pop()()
    print(message(), file=sys.stderr, flush=True)
    _progress[0] = None
    return EXIT_STATUS


def _raise(signum, frame):
    raise KeyboardInterrupt


@contextlib.contextmanager
def interruptible(grace: float = 2.0):
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    old_fd = signal.set_wakeup_fd(write_fd)
    old = {s: signal.signal(s, _raise) for s in (signal.SIGINT, signal.SIGTERM)}
    stop = threading.Event()

    def watch():
        os.read(read_fd, 1)  # a signal arrived (or the block ended)
        os.close(read_fd)
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            if stop.is_set():
                return
            time.sleep(0.05)
        if not stop.is_set():
            os._exit(finish())

    threading.Thread(target=watch, daemon=True, name="interrupt-watcher").start()
    try:
        yield
    finally:
        stop.set()
        signal.set_wakeup_fd(old_fd)
        for s, handler in old.items():
            signal.signal(s, handler)
        with contextlib.suppress(OSError):
            os.write(write_fd, b"\0")
        os.close(write_fd)
