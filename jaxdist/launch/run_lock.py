"""One launch at a time in a run directory.

Two launches in one run directory write the same checkpoints, logs and metrics: each resumes
from the other's checkpoints and reads the other's evaluations, and neither run means anything
afterwards. So a launch holds a lock on the directory while its program runs, and a second one
is refused with who holds it. Under the multihost launcher each host's share holds its own
lock (``.launch-host<i>.lock``), since every host launches into the one shared directory.

The lock is ``flock`` on a file of the directory: the kernel drops it when its holder dies,
however it dies, so no stale lock outlives a crashed launcher. The file itself stays (removing
it could split the lock between a holder and a newcomer that opened it before the removal).
"""

from __future__ import annotations

import errno
import fcntl
import glob
import logging
import os
import socket
import time

from jaxdist.launch.errors import LaunchError

log = logging.getLogger(__name__)


LOCK_FILE = ".launch-host{}.lock"  # formatted with the host index (0 but under multihost)


class RunLock:
    """The lock of one launch (one host's share) on its run directory, held until `release`."""

    def __init__(self, run_dir: str, host_index: int = 0) -> None:
        """Take the lock, or raise `LaunchError` naming the launch that holds it."""
        path = os.path.join(run_dir, LOCK_FILE.format(host_index))
        self._fd: int | None = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        if not _try_lock(self._fd):
            holder = _read(self._fd)
            self.release()
            raise LaunchError(f"{run_dir} is in use by another launch ({holder}): two launches in one run "
                              f"directory would mix their checkpoints and results; wait for it to end or stop "
                              f"it, or choose another run directory")
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"pid {os.getpid()} on {socket.gethostname()}, since {time.strftime('%Y-%m-%d %H:%M:%S')}"
                  .encode(), 0)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor drops the flock
            self._fd = None


def holder(run_dir: str) -> str | None:
    """Who holds a lock in `run_dir` now (any host's share), or None: for a caller about to
    delete the directory."""
    for path in sorted(glob.glob(os.path.join(run_dir, LOCK_FILE.format("*")))):
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            if not _try_lock(fd):
                return _read(fd)
        finally:
            os.close(fd)
    return None


def _try_lock(fd: int) -> bool:
    """Whether this descriptor now holds the lock; on a filesystem without locks, yes (a
    launch is not refused for what its filesystem cannot do, only told)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as error:
        if error.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        log.warning("this filesystem does not lock files (%s): nothing stops another launch from using the same "
                    "run directory at once", error)
        return True


def _read(fd: int) -> str:
    return os.pread(fd, 200, 0).decode(errors="replace").strip() or "a launch that has not said who it is"
