"""Pooling routes: embeddings, rerank and score on the generating model and its cache (routes.py)."""
