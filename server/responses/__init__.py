"""OpenAI's Responses API: the routes (routes.py), request bodies (protocol.py), the answer's
shapes for /openapi.json (schema.py) and the stored responses `previous_response_id` continues
(store.py). A request becomes a chat request of the shared pipeline (server/pipeline/)."""
