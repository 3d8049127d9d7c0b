"""Choosing tokens: the batched sampler (sampler.py) and one step's sampling (step_sampler.py),
prompt-lookup speculation (speculative.py), and constrained decoding with xgrammar (grammar.py,
json_grammar.py, grammar_vocab.py)."""
