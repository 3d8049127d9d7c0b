"""Text in and out of the engine: tokenization and chat templates (tokenizer.py), and incremental
detokenization with stop strings (detokenizer.py)."""
