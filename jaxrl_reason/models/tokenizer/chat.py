"""Chat templates rendered exactly as transformers renders them: its jinja environment (immutable sandbox,
trim/lstrip blocks, loop controls, its globals and ``tojson``), the data a template may see, and
``ChatTemplates``, the chat methods every ``Tokenizer`` has (``chat_prompt``, ``get_chat_template``,
``apply_chat_template``).

    text = tok.apply_chat_template(messages, add_generation_prompt=True)        # str, as transformers
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)   # list[int]
    template = compile_chat_template(source)                                    # a cached jinja2.Template

Control tokens never come from data: with ``tokenize=True`` every control-token string found in messages,
tools, documents and extra variables is wrapped in private-use markers before rendering (``_mark``), then
the marked spans are encoded as plain text and the template's own text with specials allowed (the method of
transformers' ``sanitize_control_tokens=True``), so only the template's control tokens are special.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime

import jinja2
import numpy as np
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

R1_SYSTEM = (
    "A conversation between User and Assistant. The User asks a question, and the Assistant solves it. "
    "The Assistant first thinks about the reasoning process in the mind and then provides the User with "
    "the answer. The reasoning process and answer are enclosed within <think> </think> and <answer> "
    "</answer> tags, respectively, i.e., <think> reasoning process here </think> <answer> answer here </answer>."
)
_START, _END = "\U000f0000", "\U000f0001"  # private-use markers around control tokens found in data
_REASONING = ("reasoning_content", "thinking", "reasoning")


# ---- the chat-template environment of transformers (utils/chat_template_utils.py), replicated ----

class _Generation(Extension):
    """`{% generation %}...{% endgeneration %}` (transformers' assistant-mask tag): renders its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


class _Dict:
    """`dict(...)` / `dict.fromkeys(...)` in templates without handing them the dict type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """`namespace(...)` refusing underscore attributes (no route to CPython internals)."""

    def __init__(*args, **kwargs):
        self, args = args[0], args[1:]
        attrs = dict(*args, **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"chat templates cannot set attribute {name!r} on a namespace")


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    """json.dumps without jinja's HTML escaping, as transformers overrides it."""
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@functools.lru_cache(maxsize=64)
def compile_chat_template(source: str) -> jinja2.Template:
    """Compile like transformers: immutable sandbox, trim/lstrip blocks, loop controls, its globals and tojson."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_Generation, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=lambda fmt: datetime.now().strftime(fmt),
                       dict=_Dict(), namespace=_Namespace)
    return env.from_string(source)


# ---- what a template sees ----

def _plain(x):
    """What a template may see (as transformers): JSON-like data; other objects become '<TypeName>'."""
    if x is None or type(x) in (str, int, float, bool):
        return x
    for base in (str, int, float):  # subclasses (enums, numpy floats) back to the base type
        if isinstance(x, base):
            return base(x) if base is not str else str.__str__(x)
    if isinstance(x, Mapping):
        return {_plain(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return (list if isinstance(x, list) else tuple)(_plain(v) for v in x)
    if isinstance(x, np.generic):
        return _plain(x.item())
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return {f.name: _plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
    if callable(getattr(x, "model_dump", None)):
        return _plain(x.model_dump())
    return f"<{type(x).__name__}>"


def _message(m) -> dict:
    """A message as the template sees it: plain data, keys with None dropped, reasoning under all its names."""
    m = _plain(m)
    if not isinstance(m, dict):
        raise TypeError(f"chat messages must be dicts, got {m!r}")
    m = {k: v for k, v in m.items() if v is not None}
    reasoning = next((m[k] for k in _REASONING if m.get(k) is not None), None)
    return m if reasoning is None else {"thinking": reasoning, **m, "reasoning_content": reasoning}


def _mark(x, control: re.Pattern):
    """Wrap control-token strings inside data in markers (stray markers in the data are removed first)."""
    if isinstance(x, str):
        return control.sub(f"{_START}\\g<0>{_END}", x.replace(_START, "").replace(_END, ""))
    if isinstance(x, dict):
        return {k: _mark(v, control) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_mark(v, control) for v in x]
    return x


class ChatTemplates:
    """The chat methods of ``Tokenizer`` (base.py): they read its ``chat_template``, ``special_tokens_map``,
    ``control_tokens``, ``encode`` and ``token_to_id``."""

    def chat_prompt(self, question: str, system: str = R1_SYSTEM) -> str:
        """DeepSeek-R1-Zero template; generation continues after the opening <think>.
        Encode it with `allow_special=True` (the question is inserted verbatim)."""
        return f"{system} User: {question} Assistant: <think>"

    def get_chat_template(self, name: str | None = None, tools=None) -> str:
        """The template source: `name` of a named template (or a template string), else the default one
        ("tool_use" when tools are given and it exists), as transformers chooses."""
        t = self.chat_template
        if isinstance(t, dict):
            if name is not None and name in t:
                return t[name]
            if name is None:
                key = "tool_use" if tools is not None and "tool_use" in t else "default"
                if key not in t:
                    raise ValueError(f"several chat templates {sorted(t)} and no 'default'; pass chat_template=<name>")
                return t[key]
        if name is not None:
            return name
        if t is None:
            raise ValueError("this tokenizer has no chat_template (tokenizer_config.json 'chat_template' or "
                             "chat_template.jinja); pass chat_template=<jinja source>")
        return t

    def apply_chat_template(self, messages: Sequence[Mapping], add_generation_prompt: bool = False,
                            tokenize: bool = False, tools: Sequence[Mapping] | None = None,
                            documents: Sequence[Mapping] | None = None, chat_template: str | None = None,
                            **extra) -> str | list[int]:
        """Render one conversation exactly as transformers' `apply_chat_template` (variables: messages, tools,
        documents, add_generation_prompt, the named special tokens, `extra`). With `tokenize`, ids in which
        control-token strings from the data are plain text (see module docstring); prefer it to encoding
        the returned string, which cannot tell the template's control tokens from the data's. Not supported:
        batches of conversations, `continue_final_message`, assistant masks, tools given as Python functions."""
        template = compile_chat_template(self.get_chat_template(chat_template, tools))
        if not messages:
            raise ValueError("cannot apply a chat template to an empty conversation")
        if tools is not None and not all(isinstance(t, Mapping) for t in tools):
            raise TypeError("tools must be JSON-schema dicts")
        if documents is not None and not all(isinstance(d, Mapping) for d in documents):
            raise TypeError("documents must be dicts with 'title' and 'text' keys")
        data = ([_message(m) for m in messages], _plain(tools), _plain(documents), _plain(extra))
        if tokenize:
            data = tuple(_mark(x, self._control_re) for x in data)
        chat, tools, documents, extra = data
        text = template.render(messages=chat, tools=tools, documents=documents,
                               add_generation_prompt=add_generation_prompt, **{**self.special_tokens_map, **extra})
        return self._encode_marked(text) if tokenize else text

    @functools.cached_property
    def _control_re(self) -> re.Pattern:
        tokens = sorted(self.control_tokens, key=len, reverse=True)
        return re.compile("|".join(map(re.escape, tokens)) or "(?!)")

    def _encode_marked(self, text: str) -> list[int]:
        """Ids of a rendered chat: marked control tokens (and text split by lone markers) as plain text,
        the rest with specials allowed. Pieces after the first are encoded after a newline that is then
        removed, so SentencePiece-style tokenizers add no prefix space (as transformers does)."""
        pieces = re.split(f"{_START}({self._control_re.pattern}){_END}|[{_START}{_END}]", text)
        newline = self.encode("\n", allow_special=True)
        ids = self.encode(pieces[0], allow_special=True)
        for i, piece in enumerate(pieces[1:], start=1):
            if not piece:
                continue
            as_text = i % 2 == 1
            got = self.encode("\n" + piece, allow_special=not as_text)
            got = got[len(newline):] if got[:len(newline)] == newline else self.encode(piece, allow_special=not as_text)
            if as_text and self.token_to_id(piece) in got:
                raise ValueError(f"cannot keep {piece!r} as text: the tokenizer produces it from plain text")
            ids += got
        return ids
