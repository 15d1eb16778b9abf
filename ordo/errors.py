"""The exceptions Ordo's client API raises: one family, each with a message that says what
happened and what to do. Each also derives from the built-in exception a caller would
expect (a timeout is a TimeoutError, an unreachable broker a ConnectionError), so code
written against those keeps working."""

from __future__ import annotations


class OrdoError(Exception):
    """Anything the Ordo client could not do."""


class BrokerUnavailable(OrdoError, ConnectionError):
    """No Kafka broker answered at the bootstrap servers within the time allowed."""


class TopicMissing(OrdoError, RuntimeError):
    """The namespace's topics do not exist: no engine has run on it yet, or the namespace
    is mistyped."""


class NotSent(OrdoError, RuntimeError):
    """The broker did not take (acknowledge) some requests."""


class Timeout(OrdoError, TimeoutError):
    """What the client waited for did not happen within the time allowed."""


class OutcomeTimeout(Timeout):
    """A request's outcome did not arrive within the time allowed."""
