"""The three kinds of failure, so that whoever catches one can decide without guessing.

* `DataError`: an input is wrong (an event, a file, an argument, a value out of range). Retrying cannot
  help: a consumer dead-letters the event with the message as its reason, a command prints it in one
  line and exits 2. A `ValueError`, so that code written against the builtin still catches it.
* `OperationalError`: something the code depends on is unavailable now (NATS, PostgreSQL, a stream,
  a lock). It may pass: services retry with backoff and report not-ready meanwhile.
* anything else is a bug: it is never dead-lettered, never retried, it stops the service loudly
  (`BugError` names one found on purpose, such as a check that raised where it must not).

Every error class of the project derives from one of these (tests/unit/test_errors.py checks it).
"""

from __future__ import annotations


class CosError(Exception):
    """Base of every error this project raises on purpose."""


class DataError(CosError, ValueError):
    """An input is wrong; the message says which and why, in one line."""


class ConfigError(DataError):
    """A setting or configuration file is wrong: the message names the file or variable, and the key."""


class OperationalError(CosError, RuntimeError):
    """A dependency is unavailable now; retrying later may succeed."""


class BugError(CosError, RuntimeError):
    """The project's own code broke a rule it must keep: stop, do not dead-letter or retry."""
