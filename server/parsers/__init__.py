"""Reading a model's text: reasoning (`<think>`) split off (reasoning.py), and each family's
tool-call format read into calls (tools/)."""
