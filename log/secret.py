"""The log secret: the key that sequencers and engines of a namespace share and no client
holds. Every record a sequencer appends to `<ns>.log` (and every `ordo log skip` record)
ends with an HMAC-SHA256 tag under it, and every reader drops a record whose tag does not
check (log/records.py); every dependent-transaction step the engine re-sequences carries
one in its `"@ollp"` record (procedures/ollp.py). The secret itself is never written to
Kafka.

Where it comes from, the first that is set:
    ORDO_LOG_SECRET        the secret itself (at least MIN_SECRET characters)
    ORDO_LOG_SECRET_FILE   a file holding it (`--log-secret-file`; a command exports the
                           option here, so the processes it starts read the same file)
    the user's own file    `$XDG_CONFIG_HOME/ordo/log-secret` (else ~/.config/ordo/...),
                           made with a random secret, mode 0600, by the first process that
                           needs it: every Ordo process of one user on one machine shares
                           it, so `ordo run`, `ordo demo` and a local broker need no setup.

Processes on other machines (a sequencer elsewhere, a Ray cluster's workers) need the same
secret: set ORDO_LOG_SECRET or ORDO_LOG_SECRET_FILE for all of them. A partition worker
is handed its driver's keys (`use_keys`), so a Ray cluster needs nothing more.

Rotating the secret: the current secret signs; earlier secrets, still needed to read what
they signed, are accepted for reading only. They come from ORDO_LOG_SECRET_PREVIOUS
(whitespace-separated) and from the lines after the first of the secret file
(docs/operations.md, 'Rotating the log secret')."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile
import time

SECRET_ENV = "ORDO_LOG_SECRET"
SECRET_FILE_ENV = "ORDO_LOG_SECRET_FILE"
PREVIOUS_ENV = "ORDO_LOG_SECRET_PREVIOUS"
MIN_SECRET = 16
TAG_BYTES = 32

_keys: tuple[bytes, ...] | None = None  # the current key first, then earlier ones (reading only)
_source = ""


class SecretError(RuntimeError):
    """No usable log secret: says which setting and why."""


def log_key() -> bytes:
    """This process's current key, found once: what it signs with."""
    return log_keys()[0]


def log_keys() -> tuple[bytes, ...]:
    """Every key this process accepts: the current one, then earlier ones."""
    global _keys
    if _keys is None:
        _keys = _find_keys()
    return _keys


def use_keys(keys: tuple[bytes, ...], source: str) -> None:
    """Take the keys a driver found, and where it found them (a partition worker in
    another process)."""
    global _keys, _source
    _keys, _source = tuple(keys), source


def forget_key() -> None:
    """Find the key again on next use (after the settings changed)."""
    global _keys
    _keys = None


def secret_source() -> str:
    """Where the current key came from, for a message that has to name it."""
    log_keys()
    return _source


def _find_keys() -> tuple[bytes, ...]:
    global _source
    previous = tuple(_checked(text.encode(), PREVIOUS_ENV) for text in os.environ.get(PREVIOUS_ENV, "").split())
    text = os.environ.get(SECRET_ENV)
    if text:
        _source = f"the variable {SECRET_ENV}"
        return (_checked(text.encode(), SECRET_ENV), *previous)
    path = os.environ.get(SECRET_FILE_ENV)
    if path:
        _source = f"the file {path} ({SECRET_FILE_ENV} / --log-secret-file)"
        return (*_read(path, f"{SECRET_FILE_ENV} / --log-secret-file"), *previous)
    path = default_secret_path()
    _user_secret(path)
    keys = _read(path, "this user's log secret")
    # When it was made tells a file made by mistake (none was where this process looked) at once.
    made = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(os.stat(path).st_mtime))
    _source = (
        f"the file {path} (this user's, made {made}, as none of {SECRET_ENV}, {SECRET_FILE_ENV} or "
        f"--log-secret-file is set)"
    )
    return (*keys, *previous)


def default_secret_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ordo", "log-secret")


def _read(path: str, source: str) -> tuple[bytes, ...]:
    """The file's secrets, one a line: the current one first, earlier ones after it."""
    try:
        with open(path, "rb") as f:
            lines = [line.strip() for line in f.read().splitlines() if line.strip()]
            return tuple(_checked(line, f"{path} ({source})") for line in lines or [b""])
    except OSError as exc:
        raise SecretError(f"cannot read the log secret file {path} ({source}): {exc.strerror}") from None


def _checked(secret: bytes, source: str) -> bytes:
    if len(secret) < MIN_SECRET:
        raise SecretError(
            f"the log secret from {source} has {len(secret)} characters; it needs at least "
            f"{MIN_SECRET} (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)"
        )
    return secret


def _user_secret(path: str) -> None:
    """Make the user's secret file if missing; two processes making it at once agree, since
    a file is put in place only where none is (a hard link never replaces one)."""
    if os.path.exists(path):
        return
    try:
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".log-secret.")
        try:
            with os.fdopen(fd, "w") as f:  # mkstemp makes it 0600
                f.write(secrets.token_hex(32) + "\n")
            try:
                os.link(temporary, path)
            except FileExistsError:
                pass  # another process made it first: its secret counts
        finally:
            os.unlink(temporary)
    except OSError as exc:
        raise SecretError(
            f"cannot make the log secret file {path} ({exc.strerror}): set {SECRET_ENV} or --log-secret-file"
        ) from None


def tag(purpose: bytes, body: bytes | memoryview, key: bytes | None = None) -> bytes:
    """The HMAC of `body` for one purpose (a log record in its place, an OLLP step), so a
    tag made for one can never pass as another's."""
    mac = hmac.new(key or log_key(), purpose + b"\0", hashlib.sha256)
    mac.update(body)  # a batch of up to a megabyte: not copied
    return mac.digest()


def verify(purpose: bytes, body: bytes | memoryview, expected: bytes) -> bool:
    """Whether `expected` is the tag of `body` under any key this process accepts."""
    return any(hmac.compare_digest(expected, tag(purpose, body, key)) for key in log_keys())


def seal(body: bytes, context: bytes) -> bytes:
    """A log record: its body and the tag of the body in `context` (where it belongs,
    log/records.py's `record_context`)."""
    return body + tag(b"log\0" + context, body)


def unseal_before_places(value: bytes) -> memoryview | None:
    """The body of a log record sealed as logs were before tags covered where a record
    belongs (its body alone), or None. Readers take such records only at a log's start,
    before its first record sealed in place (log/records.py, `LogCursor.accept`)."""
    if len(value) <= TAG_BYTES:
        return None
    body = memoryview(value)[:-TAG_BYTES]
    return body if verify(b"log", body, value[-TAG_BYTES:]) else None


def unseal(value: bytes, context: bytes) -> memoryview | None:
    """The body of a sealed log record (a view, not a copy), or None if its tag does not
    check in `context`."""
    if len(value) <= TAG_BYTES:
        return None
    body = memoryview(value)[:-TAG_BYTES]
    return body if verify(b"log\0" + context, body, value[-TAG_BYTES:]) else None
