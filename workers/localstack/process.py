"""A daemonised child process tracked by a run file (pid + port), so a later command can find and stop it."""

from __future__ import annotations

__all__ = ["RunRecord", "ManagedProcess", "pid_alive"]

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path

_POLL = 0.1


@dataclass(frozen=True)
class RunRecord:
    """What a run file holds: the service's pid, its port and the command line it was started with."""

    pid: int
    port: int
    argv: tuple[str, ...]

    @classmethod
    def read(cls, path: Path) -> RunRecord | None:
        """The record in `path`, or None when there is none or it is unreadable (treated as not running)."""
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            return cls(pid=int(raw["pid"]), port=int(raw["port"]), argv=tuple(str(a) for a in raw["argv"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        """Write atomically (temp file + rename), so a reader never sees half a record."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text(json.dumps(asdict(self)), encoding="utf-8")
        tmp.replace(path)


def _proc_state(pid: int) -> str | None:
    """The one-letter state from /proc/<pid>/stat, or None when the process does not exist."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError:
        return "?"
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else "?"


def _reap(pid: int) -> None:
    """Collect a dead child of this process so it does not linger as a zombie."""
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def pid_alive(pid: int, marker: str | None = None) -> bool:
    """True when `pid` runs (zombies count as dead) and, if given, its command line contains `marker`."""
    _reap(pid)
    if Path("/proc").is_dir():
        state = _proc_state(pid)
        if state is None or state in ("Z", "X"):
            return False
        if marker is None:
            return True
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode("utf-8", "replace")
        except OSError:
            return False
        return marker in cmdline
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ManagedProcess:
    """One service process: spawned in its own session with output to a log, found again through its run file.

    `marker` is a string the process's command line must contain; it guards against a recycled pid.
    """

    def __init__(self, name: str, run_file: Path, log_file: Path, marker: str) -> None:
        self.name = name
        self.run_file = run_file
        self.log_file = log_file
        self.marker = marker
        self._popen: subprocess.Popen[bytes] | None = None

    def record(self) -> RunRecord | None:
        """The run record of the live process, or None (a stale record is removed)."""
        rec = RunRecord.read(self.run_file)
        if rec is None:
            return None
        if self._alive(rec.pid):
            return rec
        self.run_file.unlink(missing_ok=True)
        return None

    def is_running(self) -> bool:
        """True while the recorded process is alive."""
        return self.record() is not None

    def spawn(self, argv: list[str], port: int, cwd: Path, env: dict[str, str] | None = None) -> RunRecord:
        """Start `argv` detached from this terminal (new session), append its output to the log, record it."""
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        with self.log_file.open("ab") as log:
            self._popen = subprocess.Popen(  # argv is built by this package, never from a shell string
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                close_fds=True,
            )
        rec = RunRecord(pid=self._popen.pid, port=port, argv=tuple(argv))
        rec.write(self.run_file)
        return rec

    def exited(self) -> bool:
        """True when the process this object spawned has already exited (e.g. a bad config)."""
        return self._popen is not None and self._popen.poll() is not None

    def stop(self, timeout: float = 30.0) -> bool:
        """SIGTERM, wait up to `timeout` s, then SIGKILL; True if something was running."""
        return self._signal_and_wait(signal.SIGTERM, timeout)

    def kill(self) -> bool:
        """SIGKILL at once (a crash, for restart tests); True if something was running."""
        return self._signal_and_wait(signal.SIGKILL, 0.0)

    def _signal_and_wait(self, sig: signal.Signals, grace: float) -> bool:
        rec = self.record()
        if rec is None:
            return False
        self._send(rec.pid, sig)
        if not self._wait_gone(rec.pid, grace) and sig != signal.SIGKILL:
            self._send(rec.pid, signal.SIGKILL)
        self._wait_gone(rec.pid, 15.0)
        self.run_file.unlink(missing_ok=True)
        return True

    def _send(self, pid: int, sig: signal.Signals) -> None:
        try:
            if os.getpgid(pid) == pid:
                os.killpg(pid, sig)
            else:
                os.kill(pid, sig)
        except ProcessLookupError:
            pass

    def _wait_gone(self, pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._alive(pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL)
        return True

    def _alive(self, pid: int) -> bool:
        if self._popen is not None and self._popen.pid == pid:
            return self._popen.poll() is None
        return pid_alive(pid, self.marker)
