"""SaslHandshake and SaslAuthenticate: SASL/PLAIN login (docs/KAFKA.md "Tenancy and authentication").

Only PLAIN is offered. SaslHandshake v0 announces that the next frame is a
bare PLAIN token (read by the server's frame loop); v1 announces a
SaslAuthenticate request. A failed login answers and then closes the
connection. The token itself is checked by :meth:`Broker.plain_login`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from topics.kafka import errors as E
from topics.kafka import protocol as P

if TYPE_CHECKING:
    from topics.kafka.broker import Broker, ConnState

__all__ = ["sasl_handshake", "sasl_authenticate"]


def sasl_handshake(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """SaslHandshake: accept PLAIN (UNSUPPORTED_SASL_MECHANISM for anything else)."""
    R = P.RESPONSES[P.SASL_HANDSHAKE]
    if req.mechanism != "PLAIN":
        return R(error_code=E.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN"])
    conn.sasl_mechanism = "PLAIN"
    conn.sasl_raw = v == 0
    return R(error_code=E.NONE, mechanisms=["PLAIN"])


def sasl_authenticate(broker: Broker, conn: ConnState, req: Any, v: int) -> Any:
    """SaslAuthenticate: log in with a PLAIN token after a v1 SaslHandshake.

    ILLEGAL_SASL_STATE without that handshake, SASL_AUTHENTICATION_FAILED for
    a bad token; both close the connection after the response.
    """
    R = P.RESPONSES[P.SASL_AUTHENTICATE]
    if conn.sasl_mechanism != "PLAIN" or conn.sasl_raw:
        conn.close_after = True
        return R(
            error_code=E.ILLEGAL_SASL_STATE, error_message="SaslHandshake first", auth_bytes=b""
        )
    err = broker.plain_login(conn, req.auth_bytes)
    if err is not None:
        conn.close_after = True
        return R(error_code=E.SASL_AUTHENTICATION_FAILED, error_message=err, auth_bytes=b"")
    return R(error_code=E.NONE, error_message=None, auth_bytes=b"", session_lifetime_ms=0)
