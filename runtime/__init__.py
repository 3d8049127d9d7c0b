"""radixserve runtime: models, KV pool, scheduler, sampler, tokenizer and the Engine API."""

from runtime.engine import Engine, QueueFullError
from runtime.engine_args import EngineArgs
from runtime.output import Logprobs, Output
from runtime.sampling.pooling import PoolingParams
from runtime.sampling_params import SamplingParams

__all__ = ["Engine", "EngineArgs", "Logprobs", "Output", "PoolingParams", "QueueFullError", "SamplingParams"]
