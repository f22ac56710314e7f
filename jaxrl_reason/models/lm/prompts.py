"""Prompt templates at the level of token ids: a template string with named fields (``{question}``) whose
literal text is our own (encoded once, control tokens allowed) and whose fields are data (token ids).
The same prompt is built on the host (SFT data) or inside jit from right-padded segments.

    parts = parse_template("{question}:{memory}>", ("question", "memory"), tokenizer)
    ids = render_parts(parts, {"question": [...], "memory": [...]}, tokenizer.bos_id)     # list[int], <bos> first
    toks, lens = prompt_from_parts(parts, {"question": (q [B, L], q_lens [B]), ...}, width, bos_id=..., pad_id=...)

Used by the agents that hold their prompts as templates (MemAgent, JoyAgents).
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp

from jaxrl_reason.models.tokenizer import Tokenizer

_FIELD = re.compile(r"\{(\w+)\}")


def template_parts(template: str, fields: tuple[str, ...]) -> tuple:
    """'{question}|{chunk}>' -> (("field", "question"), ("text", "|"), ...): the structure of a template,
    without a tokenizer; ValueError unless each of ``fields`` occurs exactly once and no other field does."""
    parts, names = [], []
    for i, piece in enumerate(_FIELD.split(template)):
        if i % 2:
            if piece not in fields:
                raise ValueError(f"template {template!r}: unknown field {{{piece}}}; allowed: {fields}")
            names.append(piece)
            parts.append(("field", piece))
        elif piece:
            parts.append(("text", piece))
    for f in fields:
        if names.count(f) != 1:
            raise ValueError(f"template {template!r} must contain {{{f}}} exactly once (found {names.count(f)})")
    return tuple(parts)


def parse_template(template: str, fields: tuple[str, ...], tokenizer: Tokenizer, one_per_char: bool = False
                   ) -> tuple:
    """'{question}|{chunk}>' -> (("field", "question"), ("lit", (ids...)), ...): ``template_parts`` with
    the literal text encoded by ``tokenizer`` (control tokens allowed: the template is our own text).
    ValueError if a literal has text the tokenizer maps to <unk>; with ``one_per_char`` (a static prompt
    width that counts one token per character), unless each literal decodes back to itself in at most
    as many tokens as characters."""
    unk = tokenizer.single_token_id("<unk>")
    name = type(tokenizer).__name__
    out = []
    for kind, x in template_parts(template, fields):
        if kind == "text":
            ids = tuple(tokenizer.encode(x, allow_special=True))
            if one_per_char and tokenizer.decode(ids) != x:
                raise ValueError(f"template {template!r}: {name} cannot spell {x!r} "
                                 f"(characters outside its vocabulary)")
            if one_per_char and len(ids) > len(x):
                raise ValueError(f"template {template!r}: {x!r} is {len(ids)} tokens of {name}, more than its "
                                 f"{len(x)} characters (the prompt width counts one per character)")
            if not one_per_char and unk is not None and unk in ids:
                raise ValueError(f"template {template!r}: {x!r} has characters outside the vocabulary")
            kind, x = "lit", ids
        out.append((kind, x))
    return tuple(out)


def prompt_len(parts: tuple, width: dict[str, int]) -> int:
    """<bos> + literals + each field at its full width."""
    return 1 + sum(len(x) if kind == "lit" else width[x] for kind, x in parts)


def render(template: str, fields: tuple[str, ...], values: dict[str, list[int]], tokenizer: Tokenizer,
           one_per_char: bool = False) -> list[int]:
    """Host-side prompt: <bos> + template with each field replaced by its token ids (``parse_template``)."""
    return render_parts(parse_template(template, fields, tokenizer, one_per_char), values, tokenizer.bos_id)


def render_parts(parts: tuple, values: dict[str, list[int]], bos_id: int) -> list[int]:
    """``render`` from a parsed template (``parse_template``)."""
    out = [bos_id]
    for kind, x in parts:
        out.extend(x if kind == "lit" else values[x])
    return out


def pack(segments: list[tuple[jax.Array, jax.Array]], width: int, pad_id: int) -> tuple[jax.Array, jax.Array]:
    """Concatenate right-padded segments [(tokens [B, Ls], lens [B]), ...] -> (tokens [B, width], lens [B])."""
    b = segments[0][0].shape[0]
    out = jnp.full((b, width), pad_id, jnp.int32)
    offset = jnp.zeros((b,), jnp.int32)
    rows = jnp.arange(b)[:, None]
    for toks, lens in segments:
        pos = jnp.arange(toks.shape[1])[None]
        idx = jnp.where(pos < lens[:, None], offset[:, None] + pos, width)  # out of range -> dropped
        out = out.at[rows, idx].set(toks.astype(jnp.int32), mode="drop")
        offset = offset + lens
    return out, offset


def build_prompt(template: str, fields: tuple[str, ...], values: dict, width: int, tokenizer: Tokenizer):
    """values: {field: (tokens [B, L], lens [B])} -> prompt (tokens [B, width], lens [B]), <bos> first."""
    return prompt_from_parts(parse_template(template, fields, tokenizer), values, width,
                             bos_id=tokenizer.bos_id, pad_id=tokenizer.pad_id)


def prompt_from_parts(parts: tuple, values: dict, width: int, *, bos_id: int, pad_id: int):
    """``build_prompt`` from a parsed template and static ids (what jitted code holds)."""
    b = next(iter(values.values()))[0].shape[0]

    def const(ids):
        return jnp.broadcast_to(jnp.asarray(ids, jnp.int32), (b, len(ids))), jnp.full((b,), len(ids), jnp.int32)

    segs = [const((bos_id,))]
    for kind, x in parts:
        segs.append(const(x) if kind == "lit" else values[x])
    return pack(segs, width, pad_id)


__all__ = ["build_prompt", "pack", "parse_template", "prompt_from_parts", "prompt_len", "render", "render_parts",
           "template_parts"]
