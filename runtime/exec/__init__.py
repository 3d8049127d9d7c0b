"""Running the model on a device: where it runs and in what dtype (device.py), the model runner
that loads a checkpoint and runs one ForwardBatch (model_runner.py), decode steps as CUDA graphs
(graph_runner.py), and the per-step context every attention layer reads (context.py)."""
