"""frontend_lang: the `@program` DSL, in SGLang's shape (SGLang programs port by changing the import).

    import frontend_lang as sgl

    @sgl.function
    def qa(s, question):
        s += sgl.user(question)
        s += sgl.assistant(sgl.gen("answer", max_tokens=64))

Backends: an in-process `Engine` (or `EngineBackend(engine)`), `Runtime(model_path=...)` (a local
server process), `RuntimeEndpoint(url)` for a running radixserve server, and
`OpenAI(base_url, model, api_key)` for any OpenAI-compatible server. The README's porting
section lists what ports and what does not.
"""

from frontend_lang.backends import Backend, BackendError, EngineBackend, OpenAI, RuntimeEndpoint
from frontend_lang.backends.local_runtime import Runtime
from frontend_lang.ir import (assistant, assistant_begin, assistant_end, gen, greedy_token_selection, select, system,
                              system_begin, system_end, token_length_normalized, user, user_begin, user_end)
from frontend_lang.program import Program, program, set_default_backend
from frontend_lang.state import ForkGroup, ProgramState

# SGLang spells the decorator `function`; keep both so ported programs need no other change.
function = program

__all__ = ["Backend", "BackendError", "EngineBackend", "ForkGroup", "OpenAI", "Program", "ProgramState", "Runtime",
           "RuntimeEndpoint", "assistant", "assistant_begin", "assistant_end", "function", "gen",
           "greedy_token_selection", "program", "select", "set_default_backend", "system", "system_begin",
           "system_end", "token_length_normalized", "user", "user_begin", "user_end"]
