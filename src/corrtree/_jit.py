"""numba's ``njit`` for every corrtree kernel, with three guarantees numba lacks.

- **A cache is optional.**  ``cache=True`` makes numba look for a writable folder when
  the function is *defined* (``NUMBA_CACHE_DIR``, the package's ``__pycache__``, the
  user's cache folder) and raise when there is none, so a read-only container could not
  even import corrtree.  Here such a kernel is defined without a cache: it compiles in
  memory, once per process, and :data:`uncached` names it (a run logs that it does).
- **A damaged cache file is recompiled.**  Each cached file carries a BLAKE2 digest of
  its content; a truncated, garbled or foreign index or data file is reported on the
  ``corrtree`` logger, removed and compiled again, instead of a traceback out of
  ``pickle``.  A file that cannot be written (a full disk) leaves the kernel compiled
  and uncached.
- **A kernel is compiled again when any of corrtree's sources changed.**  numba stamps a
  cached kernel with its own file's time and size only, but a kernel carries the code of
  the kernels it calls from other modules (inlined, or linked into its library): after a
  change to a helper alone (an editable install updated in place) it would load the old
  helper's code.  The stamp here adds a digest of every source file of the package
  (:func:`package_digest`).
- **An interrupt does not break a compilation.**  numba's compiler calls into LLVM and
  back into Python through ctypes; a ``KeyboardInterrupt`` raised in there is swallowed
  ("Exception ignored on calling ctypes callback function"), leaves a half-built library
  behind ("no compiled object yet") or crashes the process.  So SIGINT and SIGTERM are
  held while a kernel compiles or loads in the main thread and delivered to the handler
  that was in place as soon as the outermost compilation ends; a program that must stop
  at once (the command line) sets :func:`on_held_signal` to end the process instead.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numba
from numba.core.caching import FunctionCache, IndexDataCacheFile

__all__ = ["njit", "on_held_signal", "package_digest", "uncached"]

logger = logging.getLogger("corrtree")

#: Qualified names of the kernels defined without a cache (no writable cache folder).
uncached: list[str] = []

_HELD_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_DIGEST = 32
#: Index files record this version: numba's, marked so that numba's own (undigested)
#: files of the same kernels read as another version (ignored and rewritten), not damage.
_VERSION = f"{numba.__version__}+corrtree-blake2b"


class _CheckedCacheFile(IndexDataCacheFile):
    """numba's index and data files, each followed by a BLAKE2 digest of its content."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._version = _VERSION

    def _dump(self, obj: Any) -> bytes:
        data = super()._dump(obj)
        return data + hashlib.blake2b(data, digest_size=_DIGEST).digest()

    def _load_index(self) -> dict:
        try:
            with open(self._index_path, "rb") as f:
                version = pickle.load(f)
                data = f.read()
        except FileNotFoundError:
            return {}
        if version != self._version:
            return {}
        stamp, overloads = _checked_loads(data, self._index_path)
        return overloads if stamp == self._source_stamp else {}

    def _load_data(self, name: str) -> Any:
        path = self._data_path(name)
        with open(path, "rb") as f:
            data = f.read()
        return _checked_loads(data, path)

    def discard(self) -> None:
        """Remove the index (so that every overload compiles and is saved afresh)."""
        with contextlib.suppress(OSError):
            os.unlink(self._index_path)


class _DamagedCacheFile(Exception):
    pass


@functools.cache
def package_digest(root: str) -> str:
    """A BLAKE2 digest of the names and contents of every ``.py`` file under ``root`` (a
    package's folder; a file: that file), once per process: part of the stamp of every
    cached kernel of the package.  O(size of the sources), about a millisecond."""
    h = hashlib.blake2b(digest_size=16)
    paths = [root] if os.path.isfile(root) else []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        paths += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    for path in paths:
        h.update(os.path.relpath(path, root).encode())
        with contextlib.suppress(OSError), open(path, "rb") as f:
            h.update(f.read())
    return h.hexdigest()


def _package_root(module: str) -> str:
    """The folder of the top-level package ``module`` belongs to (or its own file)."""
    top = sys.modules.get(module.split(".", 1)[0])
    where = list(getattr(top, "__path__", [])) or [getattr(top, "__file__", None) or ""]
    return os.path.abspath(where[0]) if where[0] else ""  # "": no sources (a session)


def _checked_loads(data: bytes, path: str) -> Any:
    body, digest = data[:-_DIGEST], data[-_DIGEST:]
    if len(data) <= _DIGEST or hashlib.blake2b(body, digest_size=_DIGEST).digest() != digest:
        raise _DamagedCacheFile(f"{path} does not match its digest")
    return pickle.loads(body)


class _RepairingCache(FunctionCache):
    """A function cache whose damaged files are compiled again, and whose writes may
    fail (the kernel is then compiled but not cached)."""

    def __init__(self, py_func: Callable) -> None:
        super().__init__(py_func)
        self._name = f"{py_func.__module__}.{py_func.__qualname__}"
        self._cache_file = _CheckedCacheFile(
            cache_path=self._cache_path,
            filename_base=self._impl.filename_base,
            source_stamp=(
                self._impl.locator.get_source_stamp(),
                package_digest(_package_root(py_func.__module__)),
            ),
        )

    def load_overload(self, sig: Any, target_context: Any) -> Any:
        try:
            return super().load_overload(sig, target_context)
        except Exception as exc:  # any damage: truncated, garbled, foreign
            logger.warning(
                "the cached kernel %s was damaged (%s); compiling it again", self._name, exc
            )
            self._cache_file.discard()
            return None

    def save_overload(self, sig: Any, data: Any) -> None:
        try:
            super().save_overload(sig, data)
        except Exception as exc:  # a full disk, a folder made read-only since
            logger.warning("could not cache the kernel %s (%s)", self._name, exc)


class _Held:
    """The signals held while the main thread compiles, and the handlers they go to."""

    depth: ClassVar[int] = 0
    pending: ClassVar[list[int]] = []
    previous: ClassVar[dict[int, Any]] = {}
    hook: ClassVar[Callable[[int], None] | None] = None


def on_held_signal(hook: Callable[[int], None] | None) -> None:
    """Call ``hook(signum)`` at once for SIGINT or SIGTERM arriving while a kernel
    compiles, instead of delivering the signal when the compilation ends (``None``:
    deliver it then, the default).  The hook must not return into the compiler: it
    ends the process (the command line's does, with its one-line message)."""
    _Held.hook = hook


def _hold(signum: int, frame: Any) -> None:
    if _Held.hook is not None:
        _Held.hook(signum)
    _Held.pending.append(signum)


@contextlib.contextmanager
def _held_signals() -> Iterator[None]:
    """SIGINT and SIGTERM held in the main thread, delivered when the outermost window
    closes (by the handler that was in place when it opened)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    if _Held.depth == 0:
        _Held.pending.clear()
        # a handler installed outside Python (getsignal gives None) is left alone
        held = [s for s in _HELD_SIGNALS if signal.getsignal(s) is not None]
        _Held.previous = {s: signal.signal(s, _hold) for s in held}
    _Held.depth += 1
    try:
        yield
    finally:
        _Held.depth -= 1
        if _Held.depth == 0:
            for s, handler in _Held.previous.items():
                signal.signal(s, handler)
            if _Held.pending:
                _deliver(_Held.pending[0], _Held.previous[_Held.pending[0]])


def _deliver(signum: int, handler: Any) -> None:
    """What ``signum`` would have done had it not been held."""
    if handler is signal.SIG_IGN or handler is None:
        return
    if handler is signal.SIG_DFL:
        os.kill(os.getpid(), signum)
        return
    handler(signum, None)


def _guarded(compile_: Callable[[Any], Any]) -> Callable[[Any], Any]:
    @functools.wraps(compile_)
    def compile(sig: Any) -> Any:
        with _held_signals():
            return compile_(sig)

    return compile


def njit(**options: Any) -> Callable[[Callable], Any]:
    """``numba.njit(**options)`` with an optional, self-repairing cache and
    compilations that signals do not interrupt (see the module's notes)."""

    def decorate(fn: Callable) -> Any:
        try:
            dispatcher = numba.njit(**options)(fn)
        except RuntimeError as exc:  # cache=True and no writable cache folder
            if not options.get("cache") or "no locator" not in str(exc):
                raise
            uncached.append(fn.__qualname__)
            dispatcher = numba.njit(**{**options, "cache": False})(fn)
        else:
            if options.get("cache"):
                dispatcher._cache = _RepairingCache(fn)
        dispatcher.compile = _guarded(dispatcher.compile)
        return dispatcher

    return decorate
