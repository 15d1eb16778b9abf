"""The log secret: the key that sequencers and engines of a namespace share and no client
holds. Every record a sequencer appends to `<ns>.log` (and every `ordo log skip` record)
ends with an HMAC-SHA256 tag under it, and every reader drops a record whose tag does not
check (sequencer/log.py); every dependent-transaction step the engine re-sequences carries
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
is handed its driver's key (`use_key`), so a Ray cluster needs nothing more."""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import tempfile

SECRET_ENV = "ORDO_LOG_SECRET"
SECRET_FILE_ENV = "ORDO_LOG_SECRET_FILE"
MIN_SECRET = 16
TAG_BYTES = 32

_key: bytes | None = None


class SecretError(RuntimeError):
    """No usable log secret: says which setting and why."""


def log_key() -> bytes:
    """This process's key, found once."""
    global _key
    if _key is None:
        _key = _find_key()
    return _key


def use_key(key: bytes) -> None:
    """Take the key a driver found (a partition worker in another process)."""
    global _key
    _key = key


def forget_key() -> None:
    """Find the key again on next use (after the settings changed)."""
    global _key
    _key = None


def _find_key() -> bytes:
    text = os.environ.get(SECRET_ENV)
    if text:
        return _checked(text.encode(), SECRET_ENV)
    path = os.environ.get(SECRET_FILE_ENV)
    if path:
        return _read(path, f"{SECRET_FILE_ENV} / --log-secret-file")
    return _user_secret(default_secret_path())


def default_secret_path() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "ordo", "log-secret")


def _read(path: str, source: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return _checked(f.read().strip(), f"{path} ({source})")
    except OSError as exc:
        raise SecretError(f"cannot read the log secret file {path} ({source}): {exc.strerror}") from None


def _checked(secret: bytes, source: str) -> bytes:
    if len(secret) < MIN_SECRET:
        raise SecretError(f"the log secret from {source} has {len(secret)} characters; it needs at least "
                          f"{MIN_SECRET} (e.g. `python -c 'import secrets; print(secrets.token_hex(32))'`)")
    return secret


def _user_secret(path: str) -> bytes:
    """The user's secret file, made if missing; two processes making it at once agree,
    since a file is put in place only where none is (a hard link never replaces one)."""
    if not os.path.exists(path):
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
            raise SecretError(f"cannot make the log secret file {path} ({exc.strerror}): set {SECRET_ENV} or "
                              f"--log-secret-file") from None
    return _read(path, "this user's log secret")


def tag(purpose: bytes, body: bytes | memoryview, key: bytes | None = None) -> bytes:
    """The HMAC of `body` for one purpose (a log record, an OLLP step), so a tag made for
    one can never pass as the other's."""
    mac = hmac.new(key or log_key(), purpose + b"\0", hashlib.sha256)
    mac.update(body)  # a batch of up to a megabyte: not copied
    return mac.digest()


def seal(body: bytes) -> bytes:
    """A log record: its body and the body's tag."""
    return body + tag(b"log", body)


def unseal(value: bytes) -> memoryview | None:
    """The body of a sealed log record (a view, not a copy), or None if its tag does not
    check."""
    if len(value) <= TAG_BYTES:
        return None
    body = memoryview(value)[:-TAG_BYTES]
    return body if hmac.compare_digest(value[-TAG_BYTES:], tag(b"log", body)) else None
