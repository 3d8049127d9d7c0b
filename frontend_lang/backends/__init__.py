"""Backends a program runs on: an in-process Engine, a radixserve server, or any OpenAI-compatible API."""

from frontend_lang.backends.base import Backend, BackendError
from frontend_lang.backends.engine_backend import EngineBackend
from frontend_lang.backends.openai_backend import OpenAI
from frontend_lang.backends.runtime_endpoint import RuntimeEndpoint

__all__ = ["Backend", "BackendError", "EngineBackend", "OpenAI", "RuntimeEndpoint"]
