"""What every route shares: server state and body reading (state.py), errors in OpenAI's shape
(errors.py) and Prometheus metrics (metrics.py)."""
