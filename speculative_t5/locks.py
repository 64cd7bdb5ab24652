"""One writer per run directory or output file: an advisory lock file (`run.lock` in a
directory, `FILE.lock` beside a file) held with `fcntl.flock` while a command writes, and
naming its holder (pid, host, start time) so a second writer is refused in one line.

The kernel drops a flock when its process dies (even by SIGKILL), so a lock file left by a
dead writer is stale and simply taken over; on NFS, Linux emulates flock with POSIX locks,
which other hosts see. Where a filesystem has no locks at all, the file's contents decide:
a live pid on this host, or any other host, holds it. A clean exit removes the file.
`move_aside` is how a restart leaves the earlier run's files: moved, never deleted."""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import time
from typing import Callable, Iterator, Optional, Sequence

DIR_LOCK = "run.lock"


def lock_path_of(path: str, directory: bool) -> str:
    """The lock file of a run directory (inside it) or of an output file (beside it)."""
    return os.path.join(path, DIR_LOCK) if directory else path + ".lock"


def _holder(fd: int) -> dict:
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        info = json.loads(os.read(fd, 4096).decode() or "{}")
        return info if isinstance(info, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(info: dict) -> bool:
    """Whether the writer a lock file names may still run (always, on another host)."""
    if not info.get("pid"):
        return False
    if info.get("host") != socket.gethostname():
        return True
    try:
        os.kill(int(info["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError):
        return True
    return True


class Lock:
    """A held lock file; `release()` (or leaving the `with` block) removes it."""

    def __init__(self, path: str, subject: str, what: str = "directory"):
        self.path, self.subject, self.what, self._fd = path, subject, what, None

    def _refuse(self, info: dict) -> ValueError:
        if info.get("pid"):
            since = info.get("since")
            since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) \
                if isinstance(since, (int, float)) else "?"
            who = f"pid {info['pid']} on host {info.get('host', '?')} since {since}"
        else:
            who = f"another process (lock file {self.path})"
        return ValueError(f"{self.subject} is being written by {who}; wait for it or use "
                          f"another {self.what}")

    def acquire(self) -> "Lock":
        """Take the lock or raise ValueError naming its holder."""
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                info = _holder(fd)
                if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES) or _alive(info):
                    os.close(fd)
                    raise self._refuse(info) from None
                # no locks on this filesystem, and the file names no live writer: ours
            try:  # the holder may have removed the file between our open and our flock
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": time.time()}).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)  # before the unlock: a waiter that opened it retries
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> "Lock":
        return self if self._fd is not None else self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def hold(path: str, directory: bool = True, what: Optional[str] = None,
         prepare: Optional[Callable[[], None]] = None) -> Iterator[Optional[Lock]]:
    """Hold the lock of a run directory (created if missing) or output file for the block,
    then run `prepare()` (checks and set-up only its writer may do). Several processes (one
    program in lock-step): only process 0 writes, so only it locks and prepares; it tells
    the others whether it could, so none goes on alone."""
    import jax
    what = what or ("directory" if directory else "output")
    coordinator = jax.process_index() == 0
    lock, error = None, None
    if coordinator:
        try:
            os.makedirs(path if directory else os.path.dirname(os.path.abspath(path)),
                        exist_ok=True)
            lock = Lock(lock_path_of(path, directory), path, what).acquire()
            if prepare is not None:
                prepare()
        except BaseException as e:  # noqa: B036 (released whatever stopped it, then raised)
            if lock is not None:
                lock.release()
            if not isinstance(e, (ValueError, OSError)):
                raise
            error = e
    if jax.process_count() > 1:
        import numpy as np
        from jax.experimental import multihost_utils
        refused = int(multihost_utils.broadcast_one_to_all(np.int32(error is not None)))
        if refused and error is None:
            raise ValueError(f"process 0 could not start writing {path} (its message says why)")
    if error is not None:
        raise error
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()


def move_aside(path: str, names: Sequence[str], quiet: bool = False) -> Optional[str]:
    """Move those of `names` (files or directories a command wrote in the run directory
    `path`) that exist into path/before_restart_<time>/; nothing else is touched. Returns
    that directory, if one was made."""
    found = [n for n in names if os.path.lexists(os.path.join(path, n))]
    if not found:
        return None
    stamp = time.strftime("%Y%m%d_%H%M%S")
    aside, k = os.path.join(path, f"before_restart_{stamp}"), 1
    while os.path.exists(aside):
        k += 1
        aside = os.path.join(path, f"before_restart_{stamp}_{k}")
    os.makedirs(aside)
    for name in found:
        os.rename(os.path.join(path, name), os.path.join(aside, name))
    if not quiet:
        print(f"restart: the earlier run's files are in {aside} (delete it to free the space)")
    return aside
