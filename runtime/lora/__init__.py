"""Multi-LoRA: many PEFT adapters on one base model, mixed in one batch.

adapter.py reads and checks one adapter (and names its identity: name + digest of its files);
registry.py holds the engine's adapters (load, unload, least-recently-used room, who uses which);
apply.py adds each step's per-adapter low-rank deltas around the model's projections;
namespace.py is the prefix cache's tagged key, so adapter KV is reachable only by that adapter.
"""

from runtime.lora.adapter import AdapterIdentity
from runtime.lora.registry import AdapterBusy, AdapterNotFound, LoraRegistry

__all__ = ["AdapterBusy", "AdapterIdentity", "AdapterNotFound", "LoraRegistry"]
