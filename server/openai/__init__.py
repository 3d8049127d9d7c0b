"""OpenAI's Chat Completions, Completions and Models API: the routes (routes.py) and the bodies
only this protocol has (protocol.py). Chat requests go through the shared pipeline
(server/pipeline/); this room translates bodies in and renders events out."""
