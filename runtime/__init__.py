"""radixserve runtime: models, KV pool, scheduler, sampler, tokenizer and the Engine API."""
