"""oxinfer's loggers. A library leaves logging to its application and configures nothing of it: its
events go through structlog where the application configured structlog (its processors and level;
`oxinfer run`, `serve` and `bench` configure it with `configure_logging`), and otherwise through
Python's `logging` under the same names ("oxinfer.engine", "oxinfer.runtime"...), so that an
application that configures nothing sees warnings and errors only (Python's last-resort handler),
`logging.basicConfig(level=logging.INFO)` or pytest's caplog see the rest, and an application's own
structlog output is never changed by importing oxinfer. Event keys are the stats field names."""

from __future__ import annotations

import logging
import sys

import structlog

_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
           "exception": logging.ERROR, "critical": logging.CRITICAL}


class _CurrentStderr:
    """Whatever sys.stderr is when a line is written: pytest, notebooks and daemons swap it, and a
    logger holding the old one writes to a closed file ("I/O operation on closed file")."""

    def write(self, s: str) -> int:
        return sys.stderr.write(s)

    def flush(self) -> None:
        sys.stderr.flush()


def configure_logging(level: str | int = "INFO", json: bool = False) -> None:
    """An application's choice (the CLI and server make it): structlog's events to stderr at
    `level`, as lines or JSON; oxinfer's then go through it."""
    if isinstance(level, str):
        names = {k: v for k, v in logging.getLevelNamesMapping().items() if k != "NOTSET"}
        if level.upper() not in names:
            raise ValueError(f"log level {level!r}: one of {', '.join(n.lower() for n in names)}")
        level = names[level.upper()]
    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(level),
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso"),
            structlog.processors.JSONRenderer() if json else structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(_CurrentStderr()),
        cache_logger_on_first_use=False,
    )


class Logger:
    """`log.info("event", key=value)`, as structlog's: through structlog where the application
    configured it, else through `logging.getLogger(name)` as "event key=value ..." (the record's
    `oxinfer_event` holds the event's dict, for handlers that want its fields)."""

    def __init__(self, name: str, context: dict | None = None):
        self._name, self._context = name, context or {}
        self._std = logging.getLogger(name)

    def bind(self, **kw) -> Logger:
        return Logger(self._name, {**self._context, **kw})

    def _emit(self, method: str, event: str, kw: dict) -> None:
        if structlog.is_configured():
            getattr(structlog.get_logger(self._name), method)(event, **self._context, **kw)
            return
        level = _LEVELS[method]
        if not self._std.isEnabledFor(level):
            return
        fields = {**structlog.contextvars.get_contextvars(), **self._context, **kw}
        text = " ".join([event, *(f"{k}={v!r}" if isinstance(v, str) and " " in v else f"{k}={v}"
                                  for k, v in fields.items())])
        self._std.log(level, "%s", text, exc_info=method == "exception",
                      extra={"oxinfer_event": {"event": event, **fields}}, stacklevel=3)

    def debug(self, event: str, **kw) -> None:
        self._emit("debug", event, kw)

    def info(self, event: str, **kw) -> None:
        self._emit("info", event, kw)

    def warning(self, event: str, **kw) -> None:
        self._emit("warning", event, kw)

    def error(self, event: str, **kw) -> None:
        self._emit("error", event, kw)

    def exception(self, event: str, **kw) -> None:
        self._emit("exception", event, kw)


def get_logger(name: str) -> Logger:
    return Logger(name)
