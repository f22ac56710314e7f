"""Prompt rendering: one dataset row -> (prompt text, prompt ids), through a plain str.format template
or the tokenizer's chat template. Control tokens come only from the template, never from the row.

    fmt = PromptFormat("plain", template="{prompt} Assistant: <think>")   # `{prompt}` = row[prompt_field]
    fmt = PromptFormat("chat", system="Answer in <answer> tags.")         # tokenizer.apply_chat_template
    fmt = PromptFormat("chat", chat_kwargs=(("enable_thinking", False),))  # template variables (Qwen3)
    text, ids = render_prompt(tokenizer, row, "question", fmt)             # str, list[int]
"""

from __future__ import annotations

import dataclasses
import re
import string
from collections.abc import Mapping

import jinja2

from jaxrl_reason.data.loading import DataError
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.models.tokenizer.chat import _mark
from jaxrl_reason.utils.validation import check_hyperparameters

KINDS = ("plain", "chat")
_FORMATTER = string.Formatter()


def _parse(template: str) -> list[tuple[str, str | None, str, str | None]]:
    """``string.Formatter().parse`` pieces (literal, field, spec, conversion), named fields only."""
    if not isinstance(template, str):
        raise DataError(f"prompt template must be a string, got {type(template).__name__}")
    try:
        pieces = list(_FORMATTER.parse(template))
    except ValueError as e:
        raise DataError(f"prompt template {template!r}: {e} (write literal braces as {{{{ and }}}})") from e
    for _, name, spec, _ in pieces:
        if name is not None and not re.match(r"[A-Za-z_]", name):
            raise DataError(f"prompt template {template!r}: fields must be named, e.g. {{prompt}}, got {{{name}}}")
        if spec and "{" in spec:
            raise DataError(f"prompt template {template!r}: nested fields in format specs are not supported")
    return pieces


@dataclasses.dataclass(frozen=True)
class PromptFormat:
    """How a row becomes a prompt.

    kind="plain": ``template`` is a str.format template over the row's fields, where ``{prompt}`` is the
    row's prompt field (whatever its name) and any other ``{name}`` the field ``name``; its literal text
    may hold control tokens (``"{prompt} Assistant: <think>"``); bos is prepended when the tokenizer's
    ``add_bos_token`` is set. kind="chat": the prompt field (a string, or a list of role/content messages)
    goes through the tokenizer's chat template with the generation prompt; ``system`` is prepended as a
    system message (unless the conversation starts with one); ``chat_kwargs`` ((name, value) pairs) are passed to
    the template as variables, as ``apply_chat_template(..., **kwargs)`` does (e.g. Qwen3's ``enable_thinking``)."""

    kind: str = "plain"
    template: str = "{prompt}"
    system: str | None = None
    chat_kwargs: tuple[tuple[str, object], ...] = ()

    def __post_init__(self):
        check_hyperparameters(self)
        if self.kind not in KINDS:
            raise DataError(f"PromptFormat.kind must be one of {KINDS}, got {self.kind!r}")
        if self.chat_kwargs and self.kind != "chat":
            raise DataError("PromptFormat.chat_kwargs apply to kind='chat' (variables of the chat template)")
        if self.kind == "chat":
            if self.template != "{prompt}":
                raise DataError("PromptFormat.template applies to kind='plain'; a chat prompt is rendered by "
                                 "the tokenizer's chat template")
            return
        if self.system is not None:
            raise DataError("PromptFormat.system applies to kind='chat'; write it into the plain template")
        if not any(name is not None for _, name, _, _ in _parse(self.template)):
            raise DataError(f"prompt template {self.template!r} references no field (e.g. {{prompt}})")


def render_prompt(tokenizer: Tokenizer, row: Mapping, prompt_field: str, fmt: PromptFormat) -> tuple[str, list[int]]:
    """(prompt text, prompt ids) of one row; ValueError for a missing field or a chat template that fails
    (with the template line). The ids equal encoding the text with specials allowed, except that every
    control-token string inside the row's values is encoded as plain text."""
    if prompt_field not in row:
        raise DataError(f"no field {prompt_field!r} in the row (fields: {list(row)})")
    if fmt.kind == "chat":
        return _render_chat(tokenizer, _messages(row[prompt_field], prompt_field, fmt.system), dict(fmt.chat_kwargs))
    return _render_plain(tokenizer, row, prompt_field, fmt.template)


def _render_plain(tokenizer: Tokenizer, row: Mapping, prompt_field: str, template: str) -> tuple[str, list[int]]:
    # Values are marked the way apply_chat_template marks message contents, so the whole text is encoded
    # in one piece (natural merges across template/value boundaries) while the values' control-token
    # strings stay text; encoding literals and values separately would split BPE words at each boundary.
    values = {**row, "prompt": row[prompt_field]}
    shown, marked = [], []
    for literal, name, spec, conversion in _parse(template):
        shown.append(literal)
        marked.append(literal)
        if name is None:
            continue
        try:
            value, _ = _FORMATTER.get_field(name, (), values)
        except (KeyError, IndexError, AttributeError, TypeError) as e:
            raise DataError(f"prompt template field {{{name}}}: not in the row ({type(e).__name__}: {e}; the "
                             f"row's fields: {list(row)})") from e
        value = _FORMATTER.format_field(_FORMATTER.convert_field(value, conversion), spec)
        shown.append(value)
        marked.append(_mark(value, tokenizer._control_re))
    ids = tokenizer._encode_marked("".join(marked))
    return "".join(shown), ([tokenizer.bos_id] if tokenizer.add_bos_token else []) + ids


def _messages(value, prompt_field: str, system: str | None) -> list[dict]:
    """The conversation of a prompt field: its messages, or one user message; ``system`` first."""
    head = [{"role": "system", "content": system}] if system else []
    if not isinstance(value, list):
        return head + [{"role": "user", "content": str(value)}]
    if not value or not all(isinstance(m, Mapping) and "role" in m and "content" in m for m in value):
        raise DataError(f"field {prompt_field!r} is a list but not a non-empty list of {{'role', 'content'}} "
                         f"messages: {str(value)[:200]}")
    return (head if value[0]["role"] != "system" else []) + list(value)


def _render_chat(tokenizer: Tokenizer, messages: list[dict], kwargs: dict) -> tuple[str, list[int]]:
    try:
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
        ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **kwargs)
    except jinja2.TemplateError as e:
        raise _template_failure(tokenizer, e) from e
    except ValueError as e:  # no chat template, several without a default, a control token made from text
        raise DataError(f"chat prompt: {e}") from e
    except Exception as e:  # a Python error inside the template (e.g. str + list)
        if _template_lineno(e) is None:
            raise
        raise _template_failure(tokenizer, e) from e
    return text, ids


def _template_lineno(err: BaseException) -> int | None:
    """The template line being run when ``err`` was raised (jinja maps template frames to '<template>')."""
    tb, line = err.__traceback__, None
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == "<template>":
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _template_failure(tokenizer: Tokenizer, err: Exception) -> ValueError:
    """ValueError with jinja's message and the template's source line where it failed."""
    lineno = getattr(err, "lineno", None) or _template_lineno(err)
    try:
        lines = tokenizer.get_chat_template().splitlines()
    except ValueError:
        lines = []
    where = f" at line {lineno}: {lines[lineno - 1].strip()!r}" if lineno and 0 < lineno <= len(lines) else ""
    message = getattr(err, "message", None) or str(err)
    return ValueError(f"the chat template failed{where}: {type(err).__name__}: {message}")
