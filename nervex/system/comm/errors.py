"""The one error type of the parallel mode's control plane: what went wrong, where, and the HTTP status it maps to."""

from __future__ import annotations

from typing import Any, Dict, Optional


class ProtocolError(Exception):
    """A request, message, stored file or state transition the control plane refuses.

    Servers turn it into a JSON response ``{"error": message, "field": field}`` with ``status``; clients raise it from
    such a response. The message names what is wrong and, where there is one, the field (``field``: a dotted path such
    as ``'arrays.reward'`` or ``'header.X-Nervex-Timestamp'``). It never contains a secret.

    Args:
        status: the HTTP status: 400 malformed input, 401 missing or bad authentication, 403 authenticated but not
            allowed (another worker's lease, a protocol or config-hash mismatch), 404 unknown id, 409 a conflicting
            state (a task already done), 413 a body over its cap, 429 back-pressure, 507 storage full.
        message: what is wrong, for a person.
        field: the offending field, if any.
        retry_after: seconds a client should wait before retrying (429, 503), else None.
    """

    def __init__(self, status: int, message: str, field: Optional[str] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.status = int(status)
        self.message = message
        self.field = field
        self.retry_after = retry_after

    def to_json(self) -> Dict[str, Any]:
        body: Dict[str, Any] = {"error": self.message}
        if self.field is not None:
            body["field"] = self.field
        return body

    def __str__(self) -> str:
        where = f" (field '{self.field}')" if self.field else ""
        return f"{self.status}: {self.message}{where}"
