"""Ollama's API room: /api/chat, /api/generate, the model routes (/api/tags, /api/show, /api/ps,
/api/version) and the ones that manage models, which answer 501 (routes.py); its request shapes
(protocol.py), their translation into the chat pipeline's request (translate.py), answers and NDJSON
streams (render.py), what it says about the served model (models.py) and its error shape (errors.py)."""
