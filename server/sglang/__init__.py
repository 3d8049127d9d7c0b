"""SGLang's native API: /generate and the admin routes (routes.py), their bodies (protocol.py),
and which of SGLang's /generate fields we do, take as a hint, or refuse (compat.py)."""
