"""The Anthropic Messages API room: /v1/messages and /v1/messages/count_tokens (routes.py), its
request shapes (protocol.py), the translation into the chat pipeline's request (translate.py), the
answer and its stream as Anthropic's content blocks and events (render.py), and its error shape
(errors.py)."""
