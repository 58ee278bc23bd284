"""`sbx serve`: a Scheduler served over HTTP and WebSocket (docs/server.md). Needs the
`exec-sandbox[server]` extra (FastAPI, uvicorn, websockets)."""
