"""Who may use the JDBC server: a file of users and password hashes, one ``user:hash`` a line
(blank lines and ``#`` comments allowed), the hash ``pbkdf2_sha256$<iterations>$<salt>$<hash>``
(PBKDF2-HMAC-SHA256 of the UTF-8 password, salt and 32-byte hash in base64). ``lakehouse
sql-passwd`` writes it; the server's login (``lakehouse.sql.PasswordFileAuthenticator``, Java,
jars/sql) reads it at every login, so users added or removed count from the next connection.

No password is stored, and none is ever on a command line: the file's path is a setting
(``sql.auth_file``), and in a container it is a mounted secret.

Standard library only.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import ipaddress
import os
import re
import secrets
from pathlib import Path

from lakehouse.errors import LakehouseError
from lakehouse.settings import Settings

SCHEME = "pbkdf2_sha256"
# PBKDF2-HMAC-SHA256 rounds of a new hash (about 0.1 s here, per login); each line keeps its own
ITERATIONS = 210_000
MIN_ITERATIONS = 1000
_USER = re.compile(r"^[A-Za-z0-9_.@-]{1,128}$")
# what the Java side accepts too (lakehouse.sql.PasswordFile)
_LINE = re.compile(
    r"^([A-Za-z0-9_.@-]{1,128}):" + SCHEME + r"\$(\d{1,9})\$([A-Za-z0-9+/=]+)\$([A-Za-z0-9+/=]+)$"
)
LOOPBACK_NAMES = ("localhost",)


class SqlAccessError(LakehouseError, ValueError):
    """The JDBC server's login cannot be set up as the settings say."""


def is_loopback(host: str) -> bool:
    """Whether the server bound to ``host`` answers this machine only."""
    if host.strip().lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def hash_password(password: str, iterations: int = ITERATIONS, salt: bytes | None = None) -> str:
    if not password:
        raise SqlAccessError("a password must not be empty")
    if iterations < MIN_ITERATIONS:
        raise SqlAccessError(f"at least {MIN_ITERATIONS} iterations")
    salt = salt if salt is not None else secrets.token_bytes(16)
    digest = hashlib.pbkdf2_hmac("sha256", password.encode(), salt, iterations, dklen=32)
    b64 = base64.b64encode
    return f"{SCHEME}${iterations}${b64(salt).decode()}${b64(digest).decode()}"


def parse_users(text: str, where: str) -> dict[str, str]:
    """User -> hash of a password file's text; :class:`SqlAccessError` names the first line that
    is not a user (``where`` is the file, for the message)."""
    users: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _LINE.match(line)
        problem = None
        if not match:
            problem = f"is not user:{SCHEME}$<iterations>$<salt>$<hash>"
        else:
            try:
                salt = base64.b64decode(match[3], validate=True)
                digest = base64.b64decode(match[4], validate=True)
            except ValueError:
                salt = digest = b""
            if int(match[2]) < MIN_ITERATIONS or len(salt) < 8 or len(digest) != 32:
                problem = (
                    f"needs at least {MIN_ITERATIONS} iterations, 8 bytes of salt, a 32-byte hash"
                )
            elif match[1] in users:
                problem = f"names user {match[1]} a second time"
        if problem:
            raise SqlAccessError(
                f"{where} line {number} {problem} (lakehouse sql-passwd writes such lines)"
            )
        users[match[1]] = line.split(":", 1)[1]
    return users


def verify(users: dict[str, str], user: str, password: str) -> bool:
    """Whether ``password`` is ``user``'s (what the server's login checks)."""
    stored = users.get(user)
    if stored is None or not password:
        return False
    _, iterations, salt, digest = stored.split("$")
    computed = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(salt), int(iterations), dklen=32
    )
    return hmac.compare_digest(computed, base64.b64decode(digest))


def read_users(path: Path) -> dict[str, str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        why = getattr(exc, "strerror", None) or "not a text file"
        raise SqlAccessError(f"setting 'sql.auth_file': cannot read {path}: {why}") from None
    return parse_users(text, f"setting 'sql.auth_file': {path}")


def server_login(settings: Settings) -> Path | None:
    """The password file the server checks logins against (absolute), or None for no login
    (allowed on a loopback address only). Checked before Spark starts: a server bound beyond
    loopback without a login, or a password file it cannot use, is refused in one line."""
    host = settings.sql.host
    if not settings.sql.auth_file:
        if is_loopback(host):
            return None
        raise SqlAccessError(
            f"lakehouse serve-sql binds to {host}, beyond loopback, where it needs a login: set "
            "sql.auth_file to a file of users and password hashes (lakehouse sql-passwd USER "
            "--file FILE writes one), or bind to 127.0.0.1"
        )
    path = Path(os.path.expanduser(settings.sql.auth_file)).absolute()
    if not read_users(path):
        raise SqlAccessError(
            f"setting 'sql.auth_file': {path} names no user (lakehouse sql-passwd USER --file "
            f"{path} adds one)"
        )
    return path


def set_user(path: Path, user: str, password: str | None, iterations: int = ITERATIONS) -> str:
    """Add ``user`` to password file ``path`` (created readable by its owner only), change
    their password, or remove them (``password`` None); the other lines are kept. What was
    done: added, changed, removed."""
    if not _USER.match(user):
        raise SqlAccessError(
            f"user name {user!r}: use letters, digits and . _ @ - (at most 128 characters)"
        )
    lines: list[str] = []
    if path.exists():
        text = path.read_text(encoding="utf-8")
        parse_users(text, str(path))  # a file that is not one is left alone
        lines = text.splitlines()
    mine = [i for i, line in enumerate(lines) if line.strip().startswith(f"{user}:")]
    if password is None:
        if not mine:
            raise SqlAccessError(f"{path} has no user {user}")
        done = "removed"
        del lines[mine[0]]
    else:
        entry = f"{user}:{hash_password(password, iterations)}"
        if mine:
            lines[mine[0]] = entry
            done = "changed"
        else:
            lines.append(entry)
            done = "added"
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write("".join(f"{line}\n" for line in lines))
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(partial)
        raise
    return done
