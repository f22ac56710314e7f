"""JoyAgents-R1: assistant benchmark (tool, checkers, splits), the jitted multi-agent system (prompts
match the scripted traces, malformed output -> reward 0, node-wise resampling keeps the prefix),
top-K selection, memory write / evict / retrieve, bad configs, the character-vocabulary ids the presets'
figures were made with (pinned), the system on a byte-level tokenizer and on a byte-level BPE with scattered
digit ids (text spelled one token per character), the experiment from a tiny HF checkpoint, the gpu preset's
Qwen3-0.6B (abstractly), and a fixed-seed learning test."""

import dataclasses
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.joyagents import study
from jaxrl_reason.agents.joyagents.data import CONFUSION, TraceNoise, scripted_conversations
from jaxrl_reason.agents.joyagents.memory import init_memory, retrieve, write
from jaxrl_reason.agents.joyagents.system import (
    NUM_NODES, NodeRecord, SystemConfig, SystemIds, requests_from_arrays, run_system)
from jaxrl_reason.agents.joyagents.trainer import (
    JoyAgent, JoyConfig, build_models, evaluate, joy_learner, select_top_k, sft_warm_start)
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.sft import SFTConfig
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer, HFTokenizer
from jaxrl_reason.rl.grpo.recipes import TinyLM
from jaxrl_reason.tasks.assistant import (
    ROUTES, TEXT_CHARS, AssistantIds, AssistantRequest, AssistantTask, check_answers, encode_int, execute_call,
    request_arrays, spell, tool_value)

import testutil

TOK = CharTokenizer()
IDS = SystemIds.from_tokenizer(TOK)
TASK = AssistantTask()
SYS = SystemConfig(request_tokens=TASK.request_chars, step_tokens=TASK.call_chars, answer_tokens=TASK.answer_chars)
LM = LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=SYS.seq_len)
NOHINT = TOK.encode("?")[0]


CKPT_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen-like named tokens


def scattered_bpe(drop: str = ""):
    """A byte-level BPE whose byte alphabet has shuffled ids (the digits are not consecutive) and merges
    "13" and "do" (so its canonical encoding of the task's text is not one token per character); the
    characters of ``drop`` are left out of the vocabulary."""
    from tokenizers import Tokenizer as Tk, decoders, models, pre_tokenizers

    alpha = [c for c in sorted(pre_tokenizers.ByteLevel.alphabet()) if c not in drop]
    alpha = [alpha[i] for i in np.random.default_rng(0).permutation(len(alpha))]
    vocab = {t: i for i, t in enumerate([*CKPT_SPECIAL, *alpha, "13", "do"])}
    tk = Tk(models.BPE(vocab, [("1", "3"), ("d", "o")]))
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens(list(CKPT_SPECIAL))
    return HFTokenizer(tk, pad="<|endoftext|>", bos="<|im_start|>", eos="<|im_end|>")


def reqs(requests, tok=TOK):
    return requests_from_arrays(request_arrays(requests, SYS.request_tokens, SYS.answer_tokens, tok))


def constant_model(token: int, lm=LM):
    return testutil.constant_model(lm, token)


def plain(texts, length, tok=TOK):
    return tok.pad_batch([tok.encode(t) for t in texts], length)


def decode(ids) -> str:
    """Ids -> text, stopping at the first pad (padded rows)."""
    ids = np.asarray(ids).tolist()
    return TOK.decode(ids[: ids.index(TOK.pad_id)] if TOK.pad_id in ids else ids)


# ------------------------------------------------------------------------------------- task
def test_requests_answers_and_split_are_exact():
    rng = np.random.default_rng(0)
    for d in (1, 2):
        t = AssistantTask(difficulty=d)
        rs = t.generate_batch(rng, 400, balanced=True)
        assert [r.kind for r in rs[:8]] == [0, 1, 2, 3, 0, 1, 2, 3]
        assert max(len(r.text) for r in rs) <= t.request_chars and max(len(r.answer) for r in rs) <= t.answer_chars
        for r in rs:
            assert r.route == ROUTES[r.kind] and t.check(r.answer, r) and not t.check(r.answer + "0", r)
            assert zlib.crc32(r.text.encode()) % t.heldout_mod != 0
            if r.kind == 0:
                assert str(eval(r.text)) == r.answer  # "a+b" / "a-b"
            if r.kind == 2:
                _, name, a, b = r.text.split()
                assert r.steps == (f"{name}({a},{b})",) and r.answer == str(tool_value(name, int(a), int(b)))
            if r.kind in (1, 3):
                table = dict(kv.split("=") for kv in r.text.split()[0].split(","))
                key = r.text.split()[1][0]
                assert r.steps[0] == table[key]
                if r.kind == 3:
                    assert r.answer == str(eval(table[key] + r.text.split()[1][1:]))
        ops = [int(x) for r in rs if r.kind == 0 for x in r.text.replace("-", "+").split("+")]
        assert max(ops) == t.operand_range - 1
    held = TASK.generate_batch(rng, 200, "heldout")
    train = {r.text for r in TASK.generate_batch(rng, 2000)}
    assert not train & {r.text for r in held}
    assert TASK.check("", held[0]) is False and TASK.check(None, held[0]) is False
    for bad in (dict(difficulty=0), dict(weights=(1, 1)), dict(weights=(0, 0, 0, 0)), dict(heldout_mod=1)):
        with pytest.raises(ValueError):
            AssistantTask(**bad)
    with pytest.raises(ValueError):
        TASK.generate(rng, split="test")


def test_tool_executes_calls_and_rejects_malformed():
    calls = ["f(3,4)", "g(12,5)", "h(1,2)", "f(0,0)", "f(3,4", "x(1,2)", "f(1,,2)", "f(,2)", "f(1234,1)", "f(3,4))",
             "f(a,2)", "", "f3,4)"]
    ids = AssistantIds.from_tokenizer(TOK)
    tok, lens = plain(calls, 10)
    value, valid = execute_call(jnp.asarray(tok), jnp.asarray(lens), ids)
    assert valid.tolist() == [True] * 4 + [False] * 9
    assert value[:4].tolist() == [12, 149, 5, 0] == [tool_value(c[0], *map(int, c[2:-1].split(","))) for c in calls[:4]]
    t, n = encode_int(jnp.array([0, 7, 12, 399, 12345]), 3, ids)
    dec = [TOK.decode(np.asarray(t[i, : int(n[i])])) for i in range(5)]
    assert dec == ["0", "7", "12", "399", "999"]
    assert ids.spell("g(12,5)") == TOK.encode("g(12,5)")


def test_checker_exact_and_malformed_is_zero():
    pred, pl = plain(["12", "1", "12", "?", ""], 3)
    gold, gl = plain(["12", "12", "21", "12", "12"], 2)
    r = check_answers(jnp.asarray(pred), jnp.asarray(pl), jnp.asarray(gold), jnp.asarray(gl))
    assert r.tolist() == [1, 0, 0, 0, 0]


# ------------------------------------------------------------------------------------- system
def _scripted_record(requests, noise=TraceNoise(hint_rate=0.0, wrong_hint_rate=0.0), tok=TOK):
    """The scripted responses as a NodeRecord (nodes 0-2) + the scripted prompts of every node."""
    convs = scripted_conversations(requests, SYS, noise, np.random.default_rng(0), tokenizer=tok)
    t, b = SYS.response_len, len(requests)
    toks = np.full((NUM_NODES, b, t), tok.pad_id, np.int32)
    lens = np.zeros((NUM_NODES, b), np.int32)
    prompts = {}
    i = 0
    for row, r in enumerate(requests):
        n_steps = 2 if r.kind == 3 else 1
        nodes = [0, 1, 2, 3] if n_steps == 2 else [0, 1, 3]
        for node in nodes:
            p, resp, _ = convs[i]
            i += 1
            toks[node, row, : len(resp)] = resp
            lens[node, row] = len(resp)
            prompts[(node, row)] = p
    z = jnp.zeros((NUM_NODES, b), jnp.int32)
    rec = NodeRecord(prompts=jnp.zeros((NUM_NODES, b, SYS.prompt_len), jnp.int32), prompt_lens=z, tokens=jnp.asarray(toks),
                     lengths=jnp.asarray(lens), active=z.astype(bool), agent=z)
    return rec, prompts


@pytest.mark.parametrize("tok", [TOK, ByteTokenizer(), scattered_bpe()], ids=["char", "byte", "bpe"])
def test_system_prompts_match_scripted_traces_and_tool_result_flows(tok):
    """Every id comes from the tokenizer handed in: the same holds on a byte-level vocabulary (263 ids) and on
    a byte-level BPE with scattered digit ids and merges (text spelled one token per character)."""
    requests = TASK.generate_batch(np.random.default_rng(1), 8, balanced=True)
    rec, prompts = _scripted_record(requests, tok=tok)
    lm = dataclasses.replace(LM, vocab_size=tok.vocab_size)
    gd, st = constant_model(tok.eos_id, lm)
    req = reqs(requests, tok)
    out = run_system(gd, (st,), req, jnp.full((8,), tok.encode("?")[0]), jax.random.key(0), config=SYS, tokenizer=tok,
                     temperature=1.0, start=3, fixed=rec)
    assert out.route.tolist() == [r.kind for r in requests]
    assert out.call_valid.tolist() == [r.kind == 2 for r in requests]
    r = out.record
    for (node, row), want in prompts.items():
        got = np.asarray(r.prompts[node, row, : int(r.prompt_lens[node, row])]).tolist()
        assert got == want, (node, row, tok.decode(got), tok.decode(want))  # incl. the tool's value at node 3
    assert r.active[2].tolist() == [r_.kind == 3 for r_ in requests]
    assert out.reward.tolist() == [0.0] * 8  # this model answers "" (only <eos>)


def test_character_ids_are_pinned():
    """The ids the presets' figures were made with (the retired global character vocabulary), for a call
    request and a two-step request: request arrays, every node's prompt and scripted response."""
    cfg = SYS
    r = [AssistantRequest("do g 3 4", "13", 2, "f", ("g(3,4)",), ("13",)),
         AssistantRequest("k=3,b=2 b+4", "6", 3, "t", ("2", "6"), ("2", "6"))]
    got = scripted_conversations(r, cfg, TraceNoise(hint_rate=1.0, wrong_hint_rate=0.0), np.random.default_rng(0),
                                 tokenizer=TOK)
    assert got == [([1, 77, 39, 29, 37, 48, 33, 40, 33, 11, 33, 12, 26], [39, 2], 0),
                   ([1, 62, 37, 48, 33, 40, 33, 11, 33, 12, 30, 26], [40, 23, 11, 27, 12, 24, 2], 3),
                   ([1, 65, 37, 48, 33, 40, 33, 11, 33, 12, 30, 9, 11, 26], [9, 11, 2], 0),
                   ([1, 77, 53, 29, 44, 22, 11, 27, 35, 22, 10, 33, 35, 18, 12, 26], [53, 2], 0),
                   ([1, 76, 44, 22, 11, 27, 35, 22, 10, 33, 35, 18, 12, 30, 26], [10, 2], 2),
                   ([1, 72, 44, 22, 11, 27, 35, 22, 10, 33, 35, 18, 12, 30, 10, 26], [14, 2], 1),
                   ([1, 65, 44, 22, 11, 27, 35, 22, 10, 33, 35, 18, 12, 30, 14, 26], [14, 2], 0)]
    arrays = {k: v.tolist() for k, v in request_arrays(r, cfg.request_tokens, cfg.answer_tokens, TOK).items()}
    assert arrays == {"text": [[37, 48, 33, 40, 33, 11, 33, 12, 0, 0, 0], [44, 22, 11, 27, 35, 22, 10, 33, 35, 18, 12]],
                      "text_lens": [8, 11], "answer": [[9, 11], [14, 0]], "answer_lens": [2, 1], "kind": [2, 3]}
    assert (cfg.prompt_len, cfg.seq_len) == (21, 28)
    assert IDS.routes == (46, 50, 39, 53) and IDS.roles == (77, 72, 76, 62) and IDS.no_hint == NOHINT == 31
    assert (IDS.pad, IDS.bos, IDS.eos, IDS.error) == (0, 1, 2, 31)


def test_tokenizer_requirements():
    """Characters the jitted system needs as single tokens, and template text the tokenizer cannot spell."""
    from tokenizers import Tokenizer as Tk, models, pre_tokenizers

    vocab = {"<pad>": 0, "<eos>": 1, "ab": 2, "a": 3, "b": 4}  # no digits, no route characters
    tk = Tk(models.WordLevel(vocab, unk_token="<pad>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    hf = HFTokenizer(tk, pad="<pad>", bos="<eos>", eos="<eos>")
    with pytest.raises(ValueError, match="single tokens"):
        SystemIds.from_tokenizer(hf)
    with pytest.raises(ValueError, match="single tokens"):
        AssistantIds.from_tokenizer(hf)
    bad = SystemConfig(final_template="F{request}|{prev}")  # "|" is not a CharTokenizer character
    with pytest.raises(ValueError, match="cannot spell"):
        bad.check_model(LM, TOK)
    bad.check_model(dataclasses.replace(LM, vocab_size=263), ByteTokenizer())  # bytes spell it
    with pytest.raises(ValueError, match="vocab_size"):
        SYS.check_model(dataclasses.replace(LM, vocab_size=95), TOK)


def test_byte_level_bpe_spells_text_and_reads_digits_by_table():
    """A checkpoint-style byte-level BPE: digits with scattered ids are read and written through a 10-entry
    table; requests, answers and steps are spelled one single-character token per character (valid, decode
    back, not the canonical merged encoding); a merged multi-character token does not parse. A tokenizer
    without one of the task's characters is refused, naming it."""
    tok = scattered_bpe()
    ids = AssistantIds.from_tokenizer(tok)
    assert np.any(np.diff(ids.digits) != 1)  # not consecutive: digit0 + d would be wrong
    assert ids.digits == tuple(tok.encode(str(d))[0] for d in range(10))
    # the tool on spelled calls; a call with the merged "13" token is malformed
    calls = ["g(13,4)", "h(2,13)", "f(10,3)"]
    t, n = tok.pad_batch([spell(tok, c) for c in calls] + [tok.encode("g(13,4)")], 8)
    value, valid = execute_call(jnp.asarray(t), jnp.asarray(n), ids)
    assert valid.tolist() == [True, True, True, False] and value[:3].tolist() == [173, 41, 30]
    d, dn = encode_int(jnp.array([0, 13, 173, 999]), 3, ids)
    assert [tok.decode(np.asarray(d[i, : int(dn[i])]).tolist()) for i in range(4)] == ["0", "13", "173", "999"]
    assert ids.spell("g(13,4)") == spell(tok, "g(13,4)")
    # requests and answers: spelled, not the canonical encoding
    r = [AssistantRequest("do g 3 13", "22", 2, "f", ("g(3,13)",), ("22",)),
         AssistantRequest("1+12", "13", 0, "m", ("13",), ("13",))]
    arrays = request_arrays(r, SYS.request_tokens, SYS.answer_tokens, tok)
    assert arrays["text_lens"].tolist() == [9, 4] and arrays["answer_lens"].tolist() == [2, 2]
    assert arrays["text"][0, :9].tolist() == [tok.encode(c)[0] for c in "do g 3 13"] != tok.encode("do g 3 13")
    assert tok.decode(arrays["text"][0, :9].tolist()) == "do g 3 13" and len(tok.encode("13")) == 1
    pred, pl = tok.pad_batch([tok.encode("13"), spell(tok, "13")], 2)  # merged vs spelled answer
    gold = jnp.asarray(np.repeat(arrays["answer"][1:], 2, 0)), jnp.asarray(np.repeat(arrays["answer_lens"][1:], 2))
    assert check_answers(jnp.asarray(pred), jnp.asarray(pl), *gold).tolist() == [0, 1]
    SYS.check_model(dataclasses.replace(LM, vocab_size=tok.vocab_size), tok)
    # our own tokenizers: spelling is their encoding (the pinned ids); a missing character is named
    for own in (TOK, ByteTokenizer()):
        assert spell(own, TEXT_CHARS) == own.encode(TEXT_CHARS)
    with pytest.raises(ValueError, match=r"HFTokenizer \(vocab_size \d+\) does not encode '7' as a single token"):
        SystemIds.from_tokenizer(scattered_bpe(drop="7"))
    with pytest.raises(ValueError, match=r"CharTokenizer.*'\|'"):
        spell(TOK, "a|b")


def test_malformed_outputs_get_reward_zero():
    requests = TASK.generate_batch(np.random.default_rng(2), 8, balanced=True)
    req = reqs(requests)
    hints = jnp.full((8,), NOHINT)
    for token in (TOK.eos_id, TOK.encode("7")[0], TOK.tag_ids().answer):  # empty route / overlong garbage / a tag
        gd, st = constant_model(token)
        out = run_system(gd, (st,), req, hints, jax.random.key(0), config=SYS, tokenizer=TOK,
                         temperature=1.0)  # peaked: ~greedy
        assert out.route.tolist() == [-1] * 8 and out.reward.tolist() == [0.0] * 8
        assert not bool(out.record.active[1:3].any())
    # a correct route but a malformed call -> the tool returns "?" and the answer is wrong
    rec, _ = _scripted_record(requests)
    bad = rec.tokens.at[1].set(jnp.where(rec.tokens[1] == TOK.encode(",")[0], TOK.encode(";")[0], rec.tokens[1]))
    gd, st = constant_model(TOK.eos_id)
    out = run_system(gd, (st,), req, hints, jax.random.key(0), config=SYS, tokenizer=TOK, temperature=1.0, start=3,
                     fixed=dataclasses.replace(rec, tokens=bad))
    call_rows = [i for i, r in enumerate(requests) if r.kind == 2]
    assert not bool(out.call_valid[jnp.asarray(call_rows)].any())
    final_prompt = decode(out.record.prompts[3, call_rows[0]])
    assert final_prompt.split(";")[-1].startswith("?>")


@pytest.fixture(scope="module")
def random_system():
    model = Transformer(LM, rngs=nnx.Rngs(3))
    gd, st = nnx.split(model)
    requests = TASK.generate_batch(np.random.default_rng(3), 8, balanced=True)
    rec, _ = _scripted_record(requests)
    return gd, st, reqs(requests), rec


@pytest.mark.parametrize("start", [1, 2, 3])
def test_nodewise_resampling_keeps_the_prefix_fixed(random_system, start):
    gd, st, req, rec = random_system
    hints = jnp.full((len(req),), NOHINT)
    # fixed = the scripted solution (valid routes, so later nodes are active); resample from ``start``
    outs = [run_system(gd, (st,), req, hints, jax.random.key(k), config=SYS, tokenizer=TOK, temperature=1.0, start=start, fixed=rec)
            for k in (0, 1)]
    for out in outs:
        r = out.record
        for n in range(start):
            np.testing.assert_array_equal(r.tokens[n], rec.tokens[n])
            np.testing.assert_array_equal(r.lengths[n], rec.lengths[n])
        assert out.route.tolist() == [int(x) for x in np.asarray(req.kind)]
    a, b = outs[0].record, outs[1].record
    np.testing.assert_array_equal(a.prompts[:start + 1], b.prompts[:start + 1])  # prompts up to node ``start`` too
    later = [n for n in range(start, NUM_NODES) if bool(a.active[n].any())]
    assert any(not np.array_equal(a.tokens[n], b.tokens[n]) for n in later)  # the resampled nodes do vary


def test_greedy_continuation_decodes_the_later_nodes_greedily(random_system):
    gd, st, req, rec = random_system
    hints = jnp.full((len(req),), NOHINT)
    outs = [run_system(gd, (st,), req, hints, jax.random.key(k), config=SYS, tokenizer=TOK, temperature=1.0, start=1, fixed=rec,
                       continuation_temperature=0.0) for k in (0, 1)]
    assert not np.array_equal(outs[0].record.tokens[1], outs[1].record.tokens[1])  # node 1 is still sampled
    for out in outs:  # nodes 2-3 are what greedy decoding writes after that node-1 output
        greedy = run_system(gd, (st,), req, hints, jax.random.key(5), config=SYS, tokenizer=TOK, temperature=0.0, start=2,
                            fixed=out.record)
        np.testing.assert_array_equal(out.record.tokens[2:], greedy.record.tokens[2:])
        np.testing.assert_array_equal(out.reward, greedy.reward)
    sampled = run_system(gd, (st,), req, hints, jax.random.key(0), config=SYS, tokenizer=TOK, temperature=1.0, start=1, fixed=rec)
    np.testing.assert_array_equal(sampled.record.tokens[1], outs[0].record.tokens[1])  # same key, same node 1
    assert not np.array_equal(sampled.record.tokens[3], outs[0].record.tokens[3])  # ... sampled after it
    with pytest.raises(ValueError, match="continuation"):
        JoyConfig(continuation="beam")


def test_separate_models_and_config_errors(random_system):
    gd, st, req, _ = random_system
    hints = jnp.full((len(req),), NOHINT)
    sep = dataclasses.replace(SYS, shared=False)
    out = run_system(gd, (st,) * 4, req, hints, jax.random.key(0), config=sep, tokenizer=TOK, temperature=1.0)
    same = run_system(gd, (st,), req, hints, jax.random.key(0), config=SYS, tokenizer=TOK, temperature=1.0)
    assert out.answer.shape == same.answer.shape
    with pytest.raises(ValueError, match="model state"):
        run_system(gd, (st,), req, hints, jax.random.key(0), config=sep, tokenizer=TOK)
    with pytest.raises(ValueError, match="fixed prefix"):
        run_system(gd, (st,), req, hints, jax.random.key(0), config=SYS, tokenizer=TOK, start=2)
    for bad in (dict(step_tokens=1, answer_tokens=2), dict(request_tokens=0), dict(route_template="R:{request}>"),
                dict(final_template="F{request}>{request};{prev}>"), dict(step_template="{role}{request};{prev}{x}>")):
        with pytest.raises(ValueError):
            SystemConfig(**bad)
    for bad in (dict(mode="tree"), dict(group_size=1), dict(top_k=0), dict(top_k=5), dict(memory_slots=0),
                dict(temperature=0.0), dict(advantage="ppo")):
        with pytest.raises(ValueError):
            JoyConfig(**bad)
    with pytest.raises(ValueError):
        TraceNoise(route_noise=(0.5,))
    with pytest.raises(ValueError, match="max_seq_len"):
        SYS.check_model(dataclasses.replace(LM, max_seq_len=SYS.seq_len - 1), TOK)


def test_scripted_trace_noise_and_hints():
    requests = TASK.generate_batch(np.random.default_rng(4), 400, balanced=True)
    convs = scripted_conversations(requests, SYS, TraceNoise(route_noise=(0, 0, 1, 0.5), hint_rate=0.0,
                                                             wrong_hint_rate=0.0), np.random.default_rng(0), tokenizer=TOK)
    routes = [(TOK.decode(p), TOK.decode(r)[0]) for p, r, a in convs if TOK.decode(p).startswith("<bos>R")]
    kinds = [r.kind for r in requests]
    got = {k: [rt for (_, rt), kk in zip(routes, kinds) if kk == k] for k in range(4)}
    assert set(got[0]) == {"m"} and set(got[2]) == {CONFUSION[2]}
    assert 0.35 < np.mean([x == "t" for x in got[3]]) < 0.65
    hinted = scripted_conversations(requests, SYS, TraceNoise(route_noise=(1, 1, 1, 1), hint_rate=1.0,
                                                              wrong_hint_rate=0.0), np.random.default_rng(0), tokenizer=TOK)
    for p, r, _ in hinted:
        s = TOK.decode(p)
        if s.startswith("<bos>R"):
            assert s[6] == TOK.decode(r)[0] != "?"  # hint = target = the correct route


# ------------------------------------------------------------------------------------- selection, memory
def test_top_k_selection_picks_the_highest_variance_active_nodes():
    var = jnp.array([[0.25, 0.0, 0.1, 0.2], [0.0, 0.0, 0.0, 0.0], [0.1, 0.2, 0.24, 0.05]])
    active = jnp.array([[True, True, False, True], [True, True, False, True], [True, True, True, True]])
    assert select_top_k(var, active, 2).tolist() == [[True, False, False, True], [True, True, False, False],
                                                     [False, True, True, False]]
    assert select_top_k(var, active, 4).sum(1).tolist() == [3, 3, 4]  # never an inactive node


def test_rollouts_hand_the_learner_rewards_groups_and_the_trained_rows():
    """joint: rewards [Q G] grouped by request, every node row pointing at its trajectory (``sample``), the active
    nodes trained; node-wise: rewards [4 Q G] grouped by (node, request), only the rows of each request's top-K
    nodes trained (the mask). The memory is the agent's carry; agents with equal ids are equal (shared programs);
    separate models: one learner step trains each row under its agent's model."""
    q, g = 2, 2
    req = reqs(TASK.generate_batch(np.random.default_rng(3), q))
    models = [Transformer(LM, rngs=nnx.Rngs(3))]
    for mode in ("joint", "nodewise"):
        cfg = JoyConfig(mode=mode, group_size=g, top_k=1)
        learner, joy = joy_learner(cfg, SYS, models, tokenizer=TOK)
        assert isinstance(joy, JoyAgent) and joy == joy_learner(cfg, SYS, models, tokenizer=CharTokenizer())[1]
        state = learner.init(jax.random.key(0), joy)
        assert isinstance(state.params, tuple) and len(state.params) == 1 and state.agent_carry.slots == cfg.memory_slots
        rollout, m, memory = jax.jit(joy.rollout)(learner.policy(state), jax.random.key(1), req, state.agent_carry)
        assert len(rollout) == NUM_NODES * q * g and rollout.advantages is None
        assert rollout.extra["model"].tolist() == [0] * len(rollout)  # shared weights: one model
        trained = np.asarray(rollout.mask).sum(1) > 0
        assert float(m["trained_rows"]) >= trained.sum() and memory.kind.shape == state.agent_carry.kind.shape
        if mode == "joint":
            assert rollout.rewards.shape == (q * g,) and rollout.num_groups == q
            assert rollout.groups.tolist() == [0, 0, 1, 1] and rollout.sample.tolist() == list(range(q * g)) * NUM_NODES
        else:
            assert rollout.rewards.shape == (NUM_NODES * q * g,) and rollout.num_groups == NUM_NODES * q
            assert rollout.sample is None and rollout.groups.tolist() == (np.arange(NUM_NODES * q * g) // g).tolist()
            per_node = trained.reshape(NUM_NODES, q, g).any(2)  # [4, Q]: the nodes trained for each request
            assert (per_node.sum(0) <= cfg.top_k).all() and float(m["selected_nodes"]) <= cfg.top_k
    sep = dataclasses.replace(SYS, shared=False)
    learner, joy = joy_learner(JoyConfig(group_size=g), sep, [Transformer(LM, rngs=nnx.Rngs(i)) for i in range(4)],
                               tokenizer=TOK)
    state, m = learner.step(learner.init(jax.random.key(0), joy), joy, req)
    assert len(state.params) == 4 and np.isfinite(float(m["loss"])) and int(state.step) == 1
    with pytest.raises(ValueError, match="model"):
        joy_learner(JoyConfig(), sep, models, tokenizer=TOK)


def test_memory_write_evict_retrieve():
    mem = init_memory(2)
    kinds = jnp.array([0, 1, 2])
    assert retrieve(mem, kinds, tokenizer=TOK).tolist() == [NOHINT] * 3
    # type 0: route m (0), used by half the group, wins 1.0 vs route f (2) 0.0 -> score 0.5 * 1.0;
    # type 1: nothing right -> no entry
    mem = write(mem, jnp.array([0, 1]), jnp.array([[0, 0, 2, 2], [1, 1, 1, -1]]),
                jnp.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]))
    assert mem.entries() == [(0, "m", 0.5)]
    assert retrieve(mem, kinds, tokenizer=TOK).tolist() == [IDS.routes[0], NOHINT, NOHINT]
    # type 2: route f at 0.5 x 0.5 fills the free slot; then type 3: route t at 0.75 evicts the lowest (0.25)
    mem = write(mem, jnp.array([2]), jnp.array([[2, 2, 0, 0]]), jnp.array([[1.0, 0.0, 0.0, 0.0]]))
    assert sorted(mem.entries()) == [(0, "m", 0.5), (2, "f", 0.25)]
    mem = write(mem, jnp.array([3]), jnp.array([[3, 3, 3, 3]]), jnp.array([[1.0, 1.0, 1.0, 0.0]]))
    assert sorted(mem.entries()) == [(0, "m", 0.5), (3, "t", 0.75)]
    # a worse candidate (0.25) does not evict; a failing stored strategy decays (rate 0.5)
    mem = write(mem, jnp.array([1]), jnp.array([[1, 1, 1, 1]]), jnp.array([[1.0, 0.0, 0.0, 0.0]]))
    assert sorted(mem.entries()) == [(0, "m", 0.5), (3, "t", 0.75)]
    mem = write(mem, jnp.array([0]), jnp.array([[0, 0, 0, 0]]), jnp.zeros((1, 4)))
    assert sorted(mem.entries()) == [(0, "m", 0.25), (3, "t", 0.75)]
    mem = write(mem, jnp.array([0]), jnp.array([[0, 0, 0, 0]]), jnp.zeros((1, 4)), rate=1.0)
    assert retrieve(mem, kinds, tokenizer=TOK).tolist() == [NOHINT, NOHINT, NOHINT]  # score 0: not retrieved
    assert jax.jit(write)(mem, kinds, jnp.zeros((3, 2), jnp.int32), jnp.ones((3, 2))).kind.shape == (2,)
    with pytest.raises(ValueError):
        write(mem, kinds, jnp.zeros((3, 2), jnp.int32), jnp.ones((3, 3)))
    with pytest.raises(ValueError):
        init_memory(0)


# ------------------------------------------------------------------------------------- learning
LEARN_LM = TinyLM(d_model=32, n_layers=1, n_heads=2, d_ff=64, max_seq_len=SYS.seq_len)
LEARN_TASK = AssistantTask(weights=(1.0, 1.0, 1.0, 0.0))  # math / lookup / call: single-step routes


@pytest.mark.slow
def test_nodewise_grpo_with_memory_improves_heldout_accuracy():
    """Fixed seed: a partial, noised SFT start (call requests mostly routed to the math agent), then
    node-wise GRPO + top-K + memory; held-out greedy accuracy must rise clearly above the start."""
    models = build_models(LEARN_LM, SYS, 0, tokenizer=TOK)
    noise = TraceNoise(route_noise=(0.0, 0.0, 0.7, 0.0), hint_rate=0.3, wrong_hint_rate=0.0)
    sft_warm_start(models, LEARN_TASK.generate_batch(np.random.default_rng(1), 1024), SYS, noise,
                   SFTConfig(problems=1024, steps=150, batch_size=64, lr=1e-2), tokenizer=TOK)
    held = reqs(LEARN_TASK.generate_batch(np.random.default_rng(5), 96, "heldout", balanced=False))
    learner, joy = joy_learner(JoyConfig(mode="nodewise", group_size=4, top_k=2, memory=True, lr=1e-3), SYS, models,
                               tokenizer=TOK,
                               requests=lambda s: reqs(LEARN_TASK.generate_batch(np.random.default_rng([2, s]), 8)))
    state = learner.init(jax.random.key(0), joy)
    start = evaluate(joy, state, held)
    step = learner.step_fn(joy)
    for _ in range(6):
        state, m = step(state)
    end = evaluate(joy, state, held)
    assert int(state.step) == 6 and float(m["selected_nodes"]) <= 2
    # measured (init key 0): 0.240 -> 0.312 overall; init keys 0-3: +0.072, +0.083, +0.062, +0.041 on these 96
    # requests (greedy, the same for start and end); call requests routed right 0.00 -> 1.00 with each key
    assert end["accuracy"] >= start["accuracy"] + 0.03, (start, end)
    assert end["route_accuracy/call"] >= start["route_accuracy/call"] + 0.5, (start, end)
    assert any(k == 2 and s == "f" for k, s, _ in state.agent_carry.entries())  # the memory: the agent's carry


@pytest.mark.slow
def test_trajectories_split_over_the_data_mesh_take_the_same_step():
    """mesh="data=8": every device runs its slice of the requests x group trajectories (the multi-process path: a
    data axis over every process's devices); the node-wise step equals the one-device step up to float rounding."""
    models = build_models(LEARN_LM, SYS, 0, tokenizer=TOK)
    req = reqs(LEARN_TASK.generate_batch(np.random.default_rng(2), 2))
    runs = {}
    for mesh in (None, "data=8"):
        learner, joy = joy_learner(JoyConfig(group_size=4, top_k=2, mesh=mesh), SYS, models, tokenizer=TOK)
        state, metrics = learner.step(learner.init(jax.random.key(0), joy), joy, req)
        runs[mesh] = jax.device_get(metrics), jax.tree.map(np.asarray, state.params)
    (m1, p1), (m8, p8) = runs[None], runs["data=8"]
    assert sorted(m1) == sorted(m8)
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), p8, p1)
    out = run_system(joy.graphdef, learner.policy(state), req.repeat(4), jnp.full((8,), NOHINT), jax.random.key(1),
                     config=SYS, tokenizer=TOK, temperature=1.0, mesh=learner.mesh)
    assert out.reward.sharding.shard_shape(out.reward.shape) == (1,)  # 8 trajectories: one per device
    with pytest.raises(ValueError, match=r"requests x group_size\) = 4 is not divisible by the 8 devices"):
        bad, joy2 = joy_learner(JoyConfig(group_size=2, mesh="data=8"), SYS, models, tokenizer=TOK)
        bad.step(bad.init(jax.random.key(0), joy2), joy2, req)


# ------------------------------------------------------------------------------------- checkpoints
def _tiny_checkpoint(path):
    """A byte-level BPE trained on the task's text (Qwen-like named tokens) + a random tiny Qwen3ForCausalLM,
    saved as a HF checkpoint directory."""
    from testutil import tiny_hf_checkpoint

    texts = [x for r in TASK.generate_batch(np.random.default_rng(0), 200) for x in (r.text, r.answer, *r.steps)]
    tok = HFTokenizer.train_bpe(texts, 300, special_tokens=CKPT_SPECIAL, eos="<|im_end|>", pad="<|endoftext|>",
                                bos="<|im_start|>")
    return tiny_hf_checkpoint(path, tok, max_positions=64)


@pytest.fixture(scope="module")
def experiment():
    from jaxrl_reason.cli import load_experiment

    return load_experiment("joyagents")


def test_experiment_runs_from_a_checkpoint(experiment, tmp_path):
    """--model: every agent starts from the checkpoint (its weights and byte-level BPE tokenizer); the SFT warm
    start, one RL step of node-wise + memory and the evaluations run on it (smallest sizes) with a finite
    summary; --model wins over an arch; separate agents are copies of the checkpoint."""
    from jaxrl_reason.utils.experiment import RunDir

    ckpt = str(_tiny_checkpoint(tmp_path / "ckpt"))
    cfg = experiment.Config(model=ckpt, arch="qwen3-0.6b", sft=SFTConfig(problems=8, steps=2, batch_size=4, lr=1e-3),
                            rl=JoyConfig(group_size=2, top_k=2, lr=1e-4), arms=("nodewise+memory",),
                            requests_per_step=2, rl_steps=1, eval_every=1, heldout=4)
    tok = study.load_tokenizer(cfg)
    assert isinstance(tok, HFTokenizer) and tok.eos == "<|im_end|>" and len(tok.encode("13")) == 1  # merges
    sep = dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, shared=False))
    models = study.initial_models(sep, tok)
    assert len(models) == 4 and len({id(m) for m in models}) == 4
    c = models[0].cfg
    assert (c.vocab_size, c.d_model, c.max_seq_len) == (tok.vocab_size, 32, cfg.system.seq_len)  # not the arch
    a, b = (nnx.state(m, nnx.Param) for m in models[:2])
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
    summary = experiment.run(cfg, RunDir.create("joyagents", cfg, root=tmp_path / "runs"))
    nums = {k: v for k, v in summary.items() if k not in ("run_dir", "memories")}
    assert {"nodewise+memory/final_acc", "nodewise+memory/final_acc_memory_off"} <= set(nums)
    assert all(math.isfinite(v) for v in nums.values()), summary
    assert all(0.0 <= summary[f"{a}/final_acc"] <= 1.0 for a in cfg.arms)


def test_gpu_preset_builds_qwen3_06b_abstractly(experiment):
    """The gpu preset's arch: Qwen3-0.6B's shapes (never materialised) with the character tokenizer, its window
    a node's length; its RL rows split into its minibatches; the cpu preset keeps the tiny LM."""
    gpu, cpu = experiment.PRESETS["gpu"], experiment.PRESETS["cpu"]
    assert gpu.arch == "qwen3-0.6b" and gpu.model is None and cpu.arch is None and cpu.model is None
    tok = study.load_tokenizer(gpu)
    assert isinstance(tok, CharTokenizer)
    model = nnx.eval_shape(lambda: study.initial_models(gpu, tok)[0])
    c = model.cfg
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.head_dim, c.max_seq_len) == (
        151936, 1024, 28, 16, 8, 128, gpu.system.seq_len)
    gpu.system.check_model(c, tok)
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert 5.5e8 < params < 6.5e8, params  # 0.6B, tied embeddings
    for arm, (_, _, mult) in study.ARMS.items():  # joint_4g included
        assert NUM_NODES * gpu.requests_per_step * gpu.rl.group_size * mult % gpu.rl.minibatches == 0, arm
    with pytest.raises(ValueError, match="arch"):
        dataclasses.replace(gpu, arch="qwen9")
