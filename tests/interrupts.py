"""Stop signals sent to a cold ``corrtree`` command (an empty kernel cache, so that it
compiles) at chosen moments, and what a user must see then: the test suite runs a few
trials (``tests/test_edges.py``), ``python tests/interrupts.py N`` runs ``N`` of each
kind and prints a summary.

A trial starts the command in a session of its own (as a terminal runs a foreground
job), sends the signal to its process group after ``delay`` seconds, and checks that
it ends with exit status 130 (or 0 when it finished first) and one line on stderr
beyond the compilation notice, with no traceback, and that no process it started is
left 2 s later (each trial marks its processes with an environment variable).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path

CLI = [sys.executable, "-m", "corrtree.cli"]
#: The commands the trials interrupt: a cold warm-up, and a cold training run whose
#: method has the most kernels.
COMMANDS = {
    "warmup": ["warmup", "--methods", "kernel"],
    "train": [
        "train",
        "--data",
        "sphere",
        "--width",
        "4096",
        "--method",
        "kernel",
        "--iters",
        "30",
        "--quiet",
    ],
}
#: How a trial stops the command: Ctrl-C, Ctrl-C twice 0.1 s apart, SIGTERM.
KINDS = {
    "ctrl-c": [signal.SIGINT],
    "double ctrl-c": [signal.SIGINT, signal.SIGINT],
    "sigterm": [signal.SIGTERM],
}
_MARK = "CORRTREE_INTERRUPT_TRIAL"


def _marked(mark: str) -> list[int]:
    """Processes whose environment holds ``mark`` (this trial's command and helpers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if f"{_MARK}={mark}".encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def _wait_for_handlers(pid: int, longest: float = 30.0) -> None:
    """Until process ``pid`` catches SIGTERM (``SigCgt`` in ``/proc/PID/status``): the
    moment ``corrtree.cli.main`` has installed its handlers, before numpy, numba and
    scipy load.  Python catches SIGINT from its start (unless it inherited SIG_IGN), so
    SIGTERM marks the command's own handlers."""
    start = time.monotonic()
    while time.monotonic() - start < longest:
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return  # it has ended
        caught = next(ln for ln in status.splitlines() if ln.startswith("SigCgt:"))
        if int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1:
            return
        time.sleep(0.002)


def trial(command: str, kind: str, delay: float | None, timeout: float = 300.0) -> str | None:
    """One trial; ``None`` when every check holds, else what went wrong.  ``delay``: seconds
    after the start, or ``None`` for the moment the command installs its stop handlers."""
    mark = uuid.uuid4().hex
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "NUMBA_CACHE_DIR": str(Path(tmp) / "cache"), _MARK: mark}
        args = COMMANDS[command] + (["--out", str(Path(tmp) / "out")] if command == "train" else [])
        proc = subprocess.Popen(
            [*CLI, *args],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,
        )
        if delay is None:
            _wait_for_handlers(proc.pid)
        else:
            time.sleep(delay)
        for k, sig in enumerate(KINDS[kind]):
            if k:
                time.sleep(0.1)
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break  # it had finished
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            return f"still running {timeout:.0f} s after the signal"
        time.sleep(2.0)
        stray = _marked(mark)
        for pid in stray:
            os.kill(pid, signal.SIGKILL)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    said = [ln for ln in lines if "compiling the kernels of" not in ln]
    if stray:
        return f"{len(stray)} process(es) left 2 s after the exit: {err!r}"
    if proc.returncode == 0 and not said:
        return None  # it finished before the signal
    if proc.returncode != 130:
        return f"exit status {proc.returncode}: {err!r}"
    if "Traceback" in err or "Exception ignored" in err or len(said) != 1:
        return f"not one line: {err!r}"
    if not said[0].startswith("corrtree: ") or not any(
        w in said[0] for w in ("interrupted", "terminated")
    ):
        return f"not the interruption's line: {err!r}"
    return None


def delays(count: int, seed: int, longest: float) -> list[float]:
    """``count`` moments spread over ``[0.1, longest]`` s, in a seeded random order (the
    first ones while the modules still load)."""
    import random

    rng = random.Random(seed)
    step = (longest - 0.1) / max(count, 1)
    return [0.1 + step * (k + rng.random()) for k in range(count)]


if __name__ == "__main__":  # pragma: no cover - the full series, outside the suite
    count = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    failures = 0
    for command in COMMANDS:
        for kind in KINDS:
            bad = []
            for delay in delays(count, zlib.crc32(f"{command} {kind}".encode()), 25.0):
                why = trial(command, kind, delay)
                if why is not None:
                    bad.append(f"{delay:.2f} s: {why}")
            failures += len(bad)
            print(f"{command:7s} {kind:14s} {count - len(bad)}/{count} clean", flush=True)
            for line in bad:
                print("   ", line)
    sys.exit(1 if failures else 0)
