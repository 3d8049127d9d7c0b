"""Where a model's weights come from: the built-in models (builtin_models.py, default_model.py),
assembled from registry packages and converted once from GGUF into a Hugging Face folder
(gguf_convert.py; the families it maps in gguf_families.py), with the GGUF's own quantized
tensors kept beside it (gguf_groups.py, gguf_int8_groups.py). Reading a folder's config and
safetensors is runtime/models/weights.py."""
