"""LoRA adapters at run time: load and unload, in SGLang's and vLLM's shapes (routes.py, protocol.py)."""
