"""Services and commands as their own processes: their progress (a position in PostgreSQL) and memory.

Peak memory is the kernel's own figure: `VmHWM` from `/proc/<pid>/status` for a service stopped by
the benchmark, `ru_maxrss` from `wait4` for a command that exits by itself. `VmRSS` is sampled
every half second as well, to show whether memory stays flat.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import asyncpg

from commonos.runtime.embedded import free_port


class BenchError(RuntimeError):
    """A measured system failed; the message carries the end of its log."""


def _status_kb(pid: int, key: str) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class ServiceRun:
    """A long-running service (`python -m <module>`), started and stopped by the benchmark."""

    name: str
    module: str
    env: Mapping[str, str]
    log_path: Path
    args: tuple[str, ...] = ()
    http_port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    rss_samples_kb: list[int] = field(default_factory=list)
    _sampler: asyncio.Task[None] | None = None

    def start(self) -> ServiceRun:
        env = {**os.environ, **self.env, "COS_HTTP_PORT": str(self.http_port)}
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", self.module, *self.args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self.started_at = time.monotonic()
        self._sampler = asyncio.create_task(self._sample_rss())
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise BenchError(f"{self.name} exited (code {code}); its log ends:\n{_tail(self.log_path)}")

    def rss_kb(self) -> int | None:
        return _status_kb(self.pid, "VmRSS")

    def peak_rss_kb(self) -> int | None:
        return _status_kb(self.pid, "VmHWM")

    async def _sample_rss(self, interval_s: float = 0.5) -> None:
        while self.proc is not None and self.proc.poll() is None:
            rss = self.rss_kb()
            if rss is not None:
                self.rss_samples_kb.append(rss)
            await asyncio.sleep(interval_s)

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Until `/readyz` answers 200 (its consumers are bound)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive()
            if await _http_ok(self.http_port, "/readyz"):
                return
            await asyncio.sleep(0.05)
        raise BenchError(f"{self.name} not ready within {timeout_s:.0f}s; its log ends:\n{_tail(self.log_path)}")

    async def stop(self, timeout_s: float = 30.0) -> int | None:
        """SIGTERM, then SIGKILL past the timeout; returns the peak RSS (kB) read just before."""
        if self._sampler is not None:
            self._sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sampler
        if self.proc is None or self.proc.poll() is not None:
            return None
        peak = self.peak_rss_kb()
        self.proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.to_thread(self.proc.wait, timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        return peak


async def http_get(port: int, path: str) -> tuple[int, bytes]:
    """A plain HTTP/1.0 GET on 127.0.0.1: (status, body); (0, b"") when nothing answers."""
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 1.0)
    except (OSError, TimeoutError):
        return 0, b""
    try:
        writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
        await writer.drain()
        raw = await asyncio.wait_for(reader.read(), 5.0)
    except (OSError, TimeoutError):
        return 0, b""
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), body


async def batch_totals(port: int, consumer: str) -> dict[str, float]:
    """The consumer's batch count, events and seconds so far, from the service's /metrics."""
    _, body = await http_get(port, "/metrics")
    wanted = {
        "cos_consumer_batch_size_count": "batches",
        "cos_consumer_batch_size_sum": "events",
        "cos_consumer_batch_duration_seconds_sum": "seconds",
    }
    out: dict[str, float] = {}
    label = f'{{consumer="{consumer}"}}'
    for line in body.decode(errors="replace").splitlines():
        name, _, rest = line.partition(label)
        if name in wanted and rest:
            out[wanted[name]] = float(rest.split()[0])
    return out


async def _http_ok(port: int, path: str) -> bool:
    status, _ = await http_get(port, path)
    return status == 200


@dataclass
class Progress:
    """When a consumer's position moved: its first commit, marks passed on the way, the end."""

    first_at: float | None = None
    first_position: int = 0
    done_at: float | None = None
    position: int = 0
    marks: dict[int, float] = field(default_factory=dict)


async def watch_position(
    dsn: str,
    consumer: str,
    target: int,
    *,
    table: str = "projection_positions",
    service: ServiceRun | None = None,
    timeout_s: float = 600.0,
    interval_s: float = 0.05,
    marks: Sequence[int] = (),
    say: Callable[[str], None] = lambda line: None,
    after: int = 0,
) -> Progress:
    """Poll `consumer`'s committed position until it reaches `target` (raises past the timeout). Its first commit
    is the first position past `after` (where a restarted consumer had stopped)."""
    progress = Progress()
    conn: asyncpg.Connection = await asyncpg.connect(dsn)
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + 10.0
    pending_marks = sorted(marks)
    try:
        while True:
            if service is not None:
                service.check_alive()
            position = 0
            with contextlib.suppress(asyncpg.UndefinedTableError):
                position = int(
                    await conn.fetchval(f"SELECT stream_seq FROM {table} WHERE consumer = $1", consumer) or 0
                )
            now = time.monotonic()
            progress.position = position
            if position > after and progress.first_at is None:
                progress.first_at, progress.first_position = now, position
            while pending_marks and position >= pending_marks[0]:
                progress.marks[pending_marks.pop(0)] = now
            if position >= target:
                progress.done_at = now
                return progress
            if now > deadline:
                raise BenchError(f"{consumer} reached stream seq {position:,}, not {target:,}, within {timeout_s:.0f}s")
            if now >= next_report:
                say(f"{consumer}: at stream seq {position:,} of {target:,}")
                next_report = now + 10.0
            await asyncio.sleep(interval_s)
    finally:
        await conn.close()


@dataclass(frozen=True)
class Finished:
    """A command run to its end: exit code, wall time and peak RSS (kB)."""

    returncode: int
    seconds: float
    peak_rss_kb: int
    cpu_s: float


async def run_command(
    argv: Sequence[str], env: Mapping[str, str], stdout_path: Path, stderr_path: Path | None = None
) -> Finished:
    """Run a command to its end with its output in files; `wait4` gives its own peak RSS."""
    return await asyncio.to_thread(_run_command, argv, env, stdout_path, stderr_path)


def _run_command(argv: Sequence[str], env: Mapping[str, str], stdout_path: Path, stderr_path: Path | None) -> Finished:
    full_env = {**os.environ, **env}
    errors = stderr_path or stdout_path.with_suffix(".stderr")
    with stdout_path.open("wb") as out, errors.open("wb") as err:
        started = time.perf_counter()
        proc = subprocess.Popen(list(argv), env=full_env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        seconds = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait for it again
    return Finished(proc.returncode, seconds, int(usage.ru_maxrss), usage.ru_utime + usage.ru_stime)


_TICKS_PER_S: Final = os.sysconf("SC_CLK_TCK")
#: The servers whose CPU time is measured, by the name their process runs under.
SERVERS: Final = ("postgres", "nats-server")


def _stat(pid: int) -> tuple[str, int, list[str]] | None:
    """(command name, parent pid, the fields after the name) of a process, or None if it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    fields = raw[raw.rindex(")") + 2 :].split()
    return name, int(fields[1]), fields


def _cpu_of(fields: list[str], reaped_children: bool = False) -> float:
    """utime + stime (+ the CPU of children it has reaped), in seconds."""
    ticks = int(fields[11]) + int(fields[12])
    if reaped_children:
        ticks += int(fields[13]) + int(fields[14])
    return ticks / _TICKS_PER_S


def cpu_seconds(pids: Mapping[str, int] | None = None) -> dict[str, float]:
    """CPU seconds used so far by the benchmark itself, by the servers it started and by `pids`.

    A server counts with its whole process tree: PostgreSQL's backends, live ones and those that
    exited (the postmaster reaps them, so their time is in its children's share).
    """
    stats: dict[int, tuple[str, int, list[str]]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (found := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = found
    me = os.getpid()
    out: dict[str, float] = {"bench": _cpu_of(stats[me][2]) if me in stats else 0.0}
    for pid, (name, parent, fields) in stats.items():
        if parent == me and name in SERVERS:
            tree = _cpu_of(fields, reaped_children=True)
            tree += sum(_cpu_of(f) for _, p, f in stats.values() if p == pid)
            out[name] = out.get(name, 0.0) + tree
    for label, pid in (pids or {}).items():
        if pid in stats:
            out[label] = _cpu_of(stats[pid][2])
    return out


@dataclass
class CpuUse:
    """CPU used during one measurement, as a share of one core (100 = one core busy all along)."""

    started_at: float = field(default_factory=time.monotonic)
    before: dict[str, float] = field(default_factory=cpu_seconds)
    after: dict[str, float] = field(default_factory=dict)
    ended_at: float = 0.0

    def stop(self, pids: Mapping[str, int] | None = None) -> CpuUse:
        self.after = cpu_seconds(pids)
        self.ended_at = time.monotonic()
        return self

    def percent(self) -> dict[str, float]:
        wall = self.ended_at - self.started_at
        if wall <= 0:
            return {}
        return {k: round(100 * (v - self.before.get(k, 0.0)) / wall) for k, v in self.after.items()}
