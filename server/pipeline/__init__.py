"""The one chat pipeline every protocol room shares: a chat request (request.py) is planned once
(chat.py: template, constraint, parsers, retention), run on the engine (engine_client.py), and its
outputs rendered as protocol-free messages and deltas. structured.py turns output constraints and
tools into one engine constraint; retention.py keeps marked prefixes cached."""
