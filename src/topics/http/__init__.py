"""The HTTP shell: the ASGI app, handlers, SSE, WebSocket and the uvicorn runner."""
