"""models.lm.prompts: id-level templates, rendered on the host and packed in jit alike."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason.models.lm.prompts import (
    parse_template, prompt_from_parts, prompt_len, render, render_parts, template_parts)
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer

TOK = CharTokenizer()
FIELDS = ("question", "memory")


def test_template_parts_need_each_field_once():
    assert template_parts("Q{question}:{memory}>", FIELDS) == (
        ("text", "Q"), ("field", "question"), ("text", ":"), ("field", "memory"), ("text", ">"))
    for bad in ("{question}", "{question}{memory}{memory}", "{question}{memory}{oops}"):
        with pytest.raises(ValueError, match="template"):
            template_parts(bad, FIELDS)


def test_parse_template_checks_the_literals():
    assert parse_template("<think>{question}{memory}", FIELDS, TOK)[0] == ("lit", (TOK.token_to_id("<think>"),))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        parse_template("\u00e9{question}{memory}", FIELDS, TOK)  # <unk> in a CharTokenizer
    byte = ByteTokenizer()
    parts = parse_template("ab{question}{memory}", FIELDS, byte, one_per_char=True)
    assert parts[0] == ("lit", tuple(byte.encode("ab")))
    with pytest.raises(ValueError, match="more than its"):  # one character, two byte tokens
        parse_template("\u00e9{question}{memory}", FIELDS, byte, one_per_char=True)


def test_render_and_jitted_prompt_agree():
    parts = parse_template("Q{question}:{memory}>", FIELDS, TOK)
    width = prompt_len(parts, {"question": 4, "memory": 3})
    assert width == 1 + 1 + 4 + 1 + 3 + 1
    rows = [("ab", "xyz"), ("c", "")]
    q = jnp.array([TOK.encode(a) + [TOK.pad_id] * (4 - len(a)) for a, _ in rows])
    m = jnp.array([TOK.encode(b) + [TOK.pad_id] * (3 - len(b)) for _, b in rows])
    lens = lambda i: jnp.array([len(r[i]) for r in rows])
    build = jax.jit(lambda q, ql, m, ml: prompt_from_parts(parts, {"question": (q, ql), "memory": (m, ml)}, width,
                                                           bos_id=TOK.bos_id, pad_id=TOK.pad_id))
    got, got_lens = build(q, lens(0), m, lens(1))
    for i, (a, b) in enumerate(rows):
        want = render("Q{question}:{memory}>", FIELDS, {"question": TOK.encode(a), "memory": TOK.encode(b)}, TOK)
        assert want == render_parts(parts, {"question": TOK.encode(a), "memory": TOK.encode(b)}, TOK.bos_id)
        assert np.asarray(got[i, : int(got_lens[i])]).tolist() == want
        assert (np.asarray(got[i, int(got_lens[i]):]) == TOK.pad_id).all()
