"""Progress of long steps: a bar on a terminal, coarse log lines anywhere else.

Library code reports progress through this module and never decides how it is shown:

* :func:`reporter` gives a callable ``update(fraction)`` for a step whose fraction done is known
  (reading a large file, the density field); close it with ``update.close()`` or use it as a
  context manager.
* :func:`stage` is a context manager for a step that reports nothing while it runs (marching cubes
  in scikit-image holds the GIL, so no thread can speak for it): a line when it starts and one when
  it ends, once the run has been going for a while (a short run stays quiet).

How it is shown is set once by the program (:func:`configure`; the command line calls it):
``"auto"`` (the default) draws a tqdm bar when the stream is a terminal and writes coarse lines
(``density field: 40% (12 s)``, at most every ``interval`` seconds and every 10 %) when it is not,
``"bar"`` and ``"lines"`` force one, ``"off"`` shows nothing. Lines go through the logger
``microdreamer.progress`` at INFO; :func:`configure` attaches a handler writing them to the stream
(so they appear under a pipe or in a log file without ``--verbose``). A library user who never calls
:func:`configure` gets the lines through ordinary logging, at INFO.

A program that shows progress its own way (``microdreamer serve`` sends it to the page) also
registers a listener (:func:`subscribe`): it is called with every step's description and fraction done (None when a
:func:`stage` starts), whatever the mode, in the thread that reports.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from collections.abc import Callable, Iterator

logger = logging.getLogger(__name__)

MODES = ("auto", "bar", "lines", "off")


class _Settings:
    mode = "lines"  # library default: lines through logging (silent unless INFO is enabled)
    stream = None  # None: sys.stderr at the time of use
    interval = 10.0  # seconds between two lines of one reporter
    delay = 2.0  # a reporter stays silent for its first `delay` seconds; stages announce after it
    start = time.perf_counter()
    handler: logging.Handler | None = None


_settings = _Settings()
_listeners: list = []  # callables (desc, fraction | None) -> None; see subscribe()


def subscribe(listener) -> Callable[[], None]:
    """Call ``listener(desc, fraction)`` at each update of every reporter (``fraction`` in [0, 1]) and
    ``listener(desc, None)`` as each :func:`stage` starts, from now on; returns the function that stops
    it. An exception the listener raises propagates into the step that reported (a caller may stop a
    step that way: ``microdreamer serve`` cancels jobs so)."""
    _listeners.append(listener)

    def unsubscribe() -> None:
        if listener in _listeners:
            _listeners.remove(listener)

    return unsubscribe


def _notify(desc: str, fraction: float | None) -> None:
    for listener in list(_listeners):
        listener(desc, fraction)


def configure(mode: str = "auto", stream=None, interval: float = 10.0, delay: float = 2.0) -> None:
    """Choose how progress is shown for the rest of the process (see the module docstring).

    Args:
        mode: ``"auto" | "bar" | "lines" | "off"``.
        stream: where bars and lines go (default: ``sys.stderr`` at the time of use).
        interval: at least this many seconds between two lines of one step.
        delay: steps shorter than this show nothing; stages announce themselves only once the run
            (counted from this call) has lasted this long.
    """
    if mode not in MODES:
        raise ValueError(f"unknown progress mode {mode!r}; use one of {', '.join(MODES)}")
    _settings.mode, _settings.stream = mode, stream
    _settings.interval, _settings.delay = float(interval), float(delay)
    _settings.start = time.perf_counter()
    if _settings.handler is not None:
        logger.removeHandler(_settings.handler)
        _settings.handler = None
    if mode in ("auto", "lines"):
        handler = _StreamHandler(stream)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
        _settings.handler = handler
    else:
        logger.propagate = True


def reset() -> None:
    """Back to the library default: lines through ordinary logging (no handler of this module's own)."""
    if _settings.handler is not None:
        logger.removeHandler(_settings.handler)
        _settings.handler = None
    logger.propagate = True
    logger.setLevel(logging.NOTSET)
    _settings.mode, _settings.stream, _settings.interval, _settings.delay = "lines", None, 10.0, 2.0
    _settings.start = time.perf_counter()


class _StreamHandler(logging.StreamHandler):
    """A stream handler that looks up ``sys.stderr`` at each record (pytest swaps it per test)."""

    def __init__(self, stream=None) -> None:
        super().__init__(stream or sys.stderr)
        self._fixed = stream

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = self._fixed or sys.stderr
        super().emit(record)


def _stream():
    return _settings.stream or sys.stderr


def _use_bar() -> bool:
    if _settings.mode == "bar":
        return True
    if _settings.mode != "auto":
        return False
    isatty = getattr(_stream(), "isatty", None)
    try:
        return bool(isatty and isatty())
    except (OSError, ValueError):
        return False


def _format_seconds(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f} s"
    return f"{int(seconds // 60)} min {seconds % 60:02.0f} s"


class Reporter:
    """``update(fraction)`` for one step; shown as a bar or as coarse lines (see the module docstring)."""

    def __init__(self, desc: str) -> None:
        self.desc = desc
        self.start = time.perf_counter()
        self.fraction = 0.0
        self._bar = None
        self._next_step = 0.1
        self._last_line = None  # time of the last line written, None before the first
        self._closed = False
        if _settings.mode != "off" and _use_bar():
            from tqdm import tqdm

            self._bar = tqdm(total=100, desc=desc, unit="%", leave=False, file=_stream(),
                             bar_format="{l_bar}{bar}| {elapsed}")  # fmt: skip

    def __call__(self, fraction: float) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        self.fraction = fraction
        if _listeners:
            _notify(self.desc, fraction)
        if self._closed:
            return
        if self._bar is not None:
            self._bar.n = int(round(100 * fraction))
            self._bar.refresh()
            return
        if _settings.mode == "off":
            return
        if fraction >= 1.0:  # the step is done: its last line now, not when the caller closes it
            self.close()
            return
        now = time.perf_counter()
        elapsed = now - self.start
        if elapsed < _settings.delay or fraction < self._next_step:
            return
        if self._last_line is not None and now - self._last_line < _settings.interval:
            return
        self._last_line = now
        self._next_step = (int(fraction * 10) + 1) / 10
        logger.info("%s: %d%% (%s)", self.desc, int(100 * fraction), _format_seconds(elapsed))

    def close(self) -> None:
        """End the step: the bar disappears; a step that wrote lines, or ran longer than the delay,
        writes its last one."""
        if self._closed:
            return
        self._closed = True
        elapsed = time.perf_counter() - self.start
        if self._bar is not None:
            self._bar.close()
        elif _settings.mode != "off" and (self._last_line is not None or elapsed >= _settings.delay):
            logger.info("%s: done in %s", self.desc, _format_seconds(elapsed))

    def __enter__(self) -> Reporter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def reporter(desc: str) -> Reporter:
    """A progress reporter for a step whose fraction done is known: call it with fractions in [0, 1]."""
    return Reporter(desc)


@contextlib.contextmanager
def stage(desc: str) -> Iterator[None]:
    """A step that cannot report its progress: a line as it starts and one as it ends, written only
    once the run has lasted ``delay`` seconds (so short runs stay quiet)."""
    start = time.perf_counter()
    if _listeners:
        _notify(desc, None)
    announce = _settings.mode != "off" and start - _settings.start >= _settings.delay
    if announce:
        logger.info("%s ...", desc)
    yield
    if announce:
        logger.info("%s: done in %s", desc, _format_seconds(time.perf_counter() - start))
