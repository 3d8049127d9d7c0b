"""Everything that exists only for the CPU, behind one door.

- precision.py: `--dtype auto` chosen from matmul rates measured at startup;
- host_threads.py: the engine is built serially so the engine thread's OpenMP pool is the only one;
- thread_budget.py: that pool's thread count, from the cores the process may use, lowered between
  steps while other processes hold some of them;
- kernel_linear.py: the shared base of the CPU linear layers, and oneDNN weight packing;
- packed_linear.py, dual_linear.py, int8_linear.py, int4_linear.py: the layer kinds built on it;
- block_weights.py, block_linear.py: a GGUF's quantized weights served from their codes, with no
  copy in the activations' dtype (`--quantization gguf`);
- output_layer.py: the output layer that times its ways per batch size;
- weight_prefetch.py: whether the block kernels prefetch every layer's weights, timed at warm-up;
- timing.py: which of several ways is fastest here (alternating, best of three), for those choices;
- prepare.py: `resolve_quantization` (what --quantization, set or not, means here) and
  `prepare(model, precision, quantization)`, the calls the model runner makes.
A GPU reader can skip this folder: the runner is device-neutral but for that call.
"""

from runtime.cpu.block_weights import int16_activations_default
from runtime.cpu.host_threads import serial_on_this_thread
from runtime.cpu.precision import MatmulRates, Precision, choose, measure_rates, resolve_precision
from runtime.cpu.prepare import check_quantization, prepare, resolve_quantization
from runtime.cpu.thread_budget import ThreadGovernor, allowed_cpus, cgroup_quota, thread_ceiling
from runtime.cpu.weight_prefetch import choose_weight_prefetch

__all__ = ["MatmulRates", "Precision", "ThreadGovernor", "allowed_cpus", "cgroup_quota", "check_quantization", "choose",
           "choose_weight_prefetch", "int16_activations_default",
           "measure_rates", "prepare", "resolve_precision", "resolve_quantization", "serial_on_this_thread",
           "thread_ceiling"]
