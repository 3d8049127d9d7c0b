"""Building blocks shared by the model families, one operator per file."""
