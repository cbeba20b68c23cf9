"""The ``corrtree`` command line: demo, train, predict, bench, experiment, warmup.

:func:`main` installs the command's stop signals (SIGINT, SIGTERM) before anything heavy is
imported: ``import corrtree`` loads its modules on first use, so numpy, numba, scipy and
the commands themselves (:mod:`corrtree._commands`) load under those handlers, and a Ctrl-C
at any moment once :func:`main` runs (the interpreter's own start-up, a few tens of ms,
is Python's) ends the command with one line and exit status 130, never a traceback.  This
module imports the standard library alone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys

EXIT_ERROR = 1
EXIT_INTERRUPTED = 130


def _log_to_stderr() -> None:
    """The library's notices (such as a compilation starting) as ``corrtree: ...`` lines."""
    logger = logging.getLogger("corrtree")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("corrtree: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


#: The stop signals received by this command: the first ends the run (as an exception,
#: so that training saves its checkpoint and the one-line message is printed); any
#: later one is ignored, so that no second exception interrupts that ending half-way.
_stopping: list[int] = []


def _stop(signum, frame):
    """SIGINT (Ctrl-C) and SIGTERM: the first ends the run, later ones are ignored."""
    if _stopping:
        return
    _stopping.append(signum)
    raise KeyboardInterrupt("terminated" if signum == signal.SIGTERM else "interrupted")


def _stop_while_compiling(signum: int) -> None:
    """A stop signal while numba compiles (:mod:`corrtree._jit`): an exception there
    would break the compiler, and waiting could take many seconds, so the command ends
    at once.  The run's files are as they were (compilation happens before the first
    step, and every file is written atomically); a compilation helper exits with this
    process (its pipe closes)."""
    what = "terminated" if signum == signal.SIGTERM else "interrupted"
    with contextlib.suppress(OSError, ValueError):
        if sys.stdout.isatty():  # the progress bar hid the cursor
            sys.stdout.write("\x1b[?25h")
            sys.stdout.flush()
    sys.stderr.write(
        f"corrtree: {what} while compiling the kernels; files on disk are as they were\n"
    )
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)


def main(argv: list[str] | None = None) -> int:
    """Run one ``corrtree`` command; returns its exit status (0, 1 on an error reported in
    one line, 130 when stopped by SIGINT or SIGTERM; 2 from argparse on bad options)."""
    stops = (signal.SIGINT, signal.SIGTERM)
    previous = {s: signal.signal(s, _stop) for s in stops} if _main_thread() else {}
    _stopping.clear()
    held = None
    try:
        from . import _commands, _jit  # under the handlers: numpy, numba, scipy load here
        from ._cli_parser import build_parser

        held = _jit.on_held_signal
        args = build_parser().parse_args(argv)
        _log_to_stderr()
        held(_stop_while_compiling)
        return _commands.COMMANDS[args.command](args)
    except KeyboardInterrupt as exc:
        _stopping.append(signal.SIGINT)  # later signals: ignored while this one ends the run
        msg = str(exc) or "interrupted"
        print(f"corrtree: {msg}", file=sys.stderr)
        _forget_unhandled_interrupt()
        return EXIT_INTERRUPTED
    except Exception as exc:
        commands = sys.modules.get("corrtree._commands")  # absent if its import failed
        if not isinstance(exc, getattr(commands, "ERRORS", (ImportError, OSError))):
            raise
        print(f"corrtree: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    finally:
        if held is not None:
            held(None)
        for s, handler in previous.items():
            signal.signal(s, handler)


def _forget_unhandled_interrupt() -> None:
    """Clear CPython's record of an unhandled ``KeyboardInterrupt``.  An interrupt that
    crossed an ``exec`` of source text on its way here (numba and scipy run such code as
    they compile and load) set it, even though :func:`main` handled the exception, and
    the interpreter would then end itself by SIGINT after the command's one line instead
    of exiting with status 130.  Every evaluation of source text resets the record first
    (``run_eval_code_obj`` in ``Python/pythonrun.c``), and an empty one leaves it clear."""
    exec("pass")  # a constant, evaluated for its side effect on the record


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror}: {exc.filename}" if exc.filename else exc.strerror
    return " ".join(str(exc).split())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
