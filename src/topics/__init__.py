"""topics: a single-node, persistent event-log server.

Records are appended to named topics over the JSON `/v0` HTTP API, read back by
sequence number, pushed over SSE and WebSocket, fanned out by routers and handed
to workers through lease queues. The public surface is deliberately small: the
engine lives in :mod:`topics.engine`, the HTTP shell in :mod:`topics.http`.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
