"""The live view of the prefix cache: GET /cache (JSON) and GET /cache/view (a page, static/)."""
