"""server: the OpenAI-compatible and native (SGLang-shaped) HTTP server over the runtime Engine.

Start it with `python -m server` or `radixserve`; build the app in-process with
`server.app.build_app(engine)`.
"""
