"""frontend_lang: the `@program` DSL, in SGLang's shape (SGLang programs port by changing the import).

    import frontend_lang as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

Backends: an in-process `Engine` (or `EngineBackend(engine)`), `Runtime(model_path=...)` (a local
server process), `RuntimeEndpoint(url)` for a running radixserve server, and
`OpenAI(base_url, model, api_key)` for any OpenAI-compatible server. docs/porting-sglang.md
lists what ports and what does not.
"""

from frontend_lang.backends import Backend, BackendError, EngineBackend, OpenAI, RuntimeEndpoint
from frontend_lang.backends.local_runtime import Runtime
from frontend_lang.global_config import global_config
from frontend_lang.ir import (
                              assistant,
                              assistant_begin,
                              assistant_end,
                              gen,
                              gen_int,
                              gen_string,
                              greedy_token_selection,
                              image,
                              select,
                              separate_reasoning,
                              system,
                              system_begin,
                              system_end,
                              token_length_normalized,
                              unconditional_likelihood_normalized,
                              user,
                              user_begin,
                              user_end,
                              video,
)

# SGLang spells the decorator `function` (bare or called); `program` is ours.
from frontend_lang.program import Program, flush_cache, function, get_server_info, program, set_default_backend
from frontend_lang.state import ForkGroup, ProgramState
from frontend_lang.typed_gen import REGEX_BOOL, REGEX_FLOAT, REGEX_INT, REGEX_STR

__all__ = ["REGEX_BOOL", "REGEX_FLOAT", "REGEX_INT", "REGEX_STR", "Backend", "BackendError", "EngineBackend",
           "ForkGroup", "OpenAI", "Program", "ProgramState", "Runtime", "RuntimeEndpoint", "assistant",
           "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string",
           "get_server_info", "global_config", "greedy_token_selection", "image", "program", "select",
           "separate_reasoning", "set_default_backend", "system", "system_begin", "system_end",
           "token_length_normalized", "unconditional_likelihood_normalized", "user", "user_begin", "user_end",
           "video"]
