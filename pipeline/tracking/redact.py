"""Secrets never reach the tracking store or the outputs.

A parameter whose key looks like a secret (token, password, api_key, secret, credential, ...)
is logged as "[redacted]", and a password inside a URL (https://user:PASSWORD@host, as in an
MLFLOW_TRACKING_URI or a teacher URL) is replaced wherever a value is logged or written.
"""

from __future__ import annotations

import re
from typing import Any

REDACTED = "[redacted]"
# Searched in the last part of a dotted key (embed.hf_token -> hf_token), anywhere in it (HFTOKEN,
# db_password_file): a false alarm costs a hidden value, a miss a leaked one. Not "tokenizer" or
# "author", which are common and never secret.
SECRET_KEY = re.compile(
    r"(?i)(secret|token(?!iz)|passw(or)?d|passwd|pwd|api[_-]?key|access[_-]?key|credential|"
    r"private[_-]?key|auth(?!or))"
)
_URL_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/@:\s]*):(?P<password>[^/@\s]+)@")


def is_secret_key(key: str) -> bool:
    return bool(SECRET_KEY.search(str(key).rsplit(".", 1)[-1]))


def redact_text(text: str) -> str:
    """`text` with the password of every URL in it replaced."""
    return _URL_PASSWORD.sub(lambda m: f"{m.group('head')}:{REDACTED}@", text)


def redact_params(params: dict[str, Any]) -> dict[str, str]:
    """Params as strings, fit to log: secret-looking keys' values and URL passwords replaced."""
    return {k: REDACTED if is_secret_key(k) else redact_text(str(v)) for k, v in params.items()}
