"""frontend_lang: the `@program` DSL, in SGLang's shape (SGLang programs port by changing the import).

    from frontend_lang import program, system, user, assistant, gen, select, set_default_backend

    @program
    def qa(s, question):
        s += user(question)
        s += assistant(gen("answer", max_tokens=64))

Backends: an in-process `Engine` (or `EngineBackend(engine)`), `RuntimeEndpoint(url)` for a
radixserve server, and `OpenAI(base_url, model, api_key)` for any OpenAI-compatible server.
"""

from frontend_lang.backends import Backend, BackendError, EngineBackend, OpenAI, RuntimeEndpoint
from frontend_lang.ir import assistant, gen, select, system, user
from frontend_lang.program import Program, program, set_default_backend
from frontend_lang.state import ProgramState

# SGLang spells the decorator `function`; keep both so ported programs need no other change.
function = program

__all__ = ["Backend", "BackendError", "EngineBackend", "OpenAI", "Program", "ProgramState", "RuntimeEndpoint",
           "assistant", "function", "gen", "program", "select", "set_default_backend", "system", "user"]
