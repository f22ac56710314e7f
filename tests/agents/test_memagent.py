"""MemAgent: long-context task, agent transform (shapes, bad input, overflow, flat memory), Multi-Conv
RL's rollout (rewards broadcast to every conversation) and a learner step, full-context reader truncation, the tokenizer seam (ids from the
tokenizer handed in; the presets' CharTokenizer keeps the old character ids; a checkpoint's byte-level
BPE spells text one token per character), the experiment from a tiny HF checkpoint and its gpu
preset's Qwen2.5-0.5B architecture (abstractly)."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.memagent.agent import (
    AgentOutput, MemAgent, MemAgentConfig, build_prompt, decode_rows, num_chunks, parse_template, render, run_agent)
from jaxrl_reason.agents.memagent.data import conversation_arrays, doc_batch, oracle_conversations
from jaxrl_reason.agents.memagent.reader import Reader, ReaderConfig, fits, reader_conversations, run_reader
from jaxrl_reason.agents.memagent.trainer import (
    MultiConvAgent, MultiConvConfig, SFTConfig, agent_memory, conversations, evaluate_agent, multiconv_learner,
    sft_warm_start)
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.agents.memagent import agent as agent_module
from jaxrl_reason.agents.memagent import study
from jaxrl_reason.agents.memagent.agent import MemoryEnv
from jaxrl_reason.rl.lm.multiturn import TextEnv, Turns
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer, HFTokenizer
from jaxrl_reason.tasks.longcontext import LongContextTask, byte_table, encode_plain, exact_match, exact_match_text

import testutil

TASK = LongContextTask(num_facts=4, facts_per_chunk=1)  # 7-character facts, one per chunk
TOK = CharTokenizer()
AGENT = MemAgent(MemAgentConfig(chunk_tokens=TASK.chunk_chars, memory_tokens=4, question_tokens=6, answer_tokens=4), TOK)
LM = LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=32)


def constant_model(token: int):
    return testutil.constant_model(LM, token)


@pytest.fixture(scope="module")
def models():
    return {"eos": constant_model(TOK.eos_id), "x": constant_model(TOK.encode("7")[0])}


# ------------------------------------------------------------------------------------- task
def test_needle_position_answer_and_oracle():
    t = LongContextTask(num_facts=12, facts_per_chunk=3, answer_position=1.0)
    p = t.generate(np.random.default_rng(0))
    assert len(p.document) == t.doc_chars == 12 * t.slot_chars and p.evidence == (11,)
    key = p.question[: t.key_len]
    assert p.document[11 * t.slot_chars:].startswith(f"{key}={p.answer};")
    assert p.document.count(f"{key}=") == 1
    mems = t.oracle_memories(p)
    assert mems == ["none"] * 3 + [p.answer]
    assert t.oracle_answer(p.question, mems[-1]) == p.answer
    first = t.with_length(12).generate(np.random.default_rng(1))
    assert t.num_chunks == 4 and first.kind == "needle"


def test_multihop_bridge_order_trap_and_oracle():
    t = LongContextTask(kind="multihop", num_facts=16, facts_per_chunk=4)
    for seed in range(5):
        p = t.generate(np.random.default_rng(seed))
        link, pos = p.evidence
        assert link < pos
        key = p.question[: t.key_len]
        fact = p.document[link * t.slot_chars:(link + 1) * t.slot_chars]
        assert fact.startswith(f"{key}>")
        bridge = fact[t.key_len + 1: 2 * t.key_len + 1]
        assert p.document[pos * t.slot_chars:].startswith(f"{bridge}={p.answer};")
        trap = [v for v in p.document.replace(" ", "").split(";") if v.startswith(f"{key}=")]
        assert len(trap) == 1 and trap[0] != f"{key}={p.answer}"  # the one-hop trap is wrong
        mems = t.oracle_memories(p)
        assert mems[-1] == p.answer and bridge in mems or mems.index(p.answer) == link // 4


def test_noise_haystack_has_only_the_needle():
    t = LongContextTask(haystack="noise", num_facts=8, facts_per_chunk=2)
    p = t.generate(np.random.default_rng(0))
    assert sum(ch.isdigit() for ch in p.document) == t.value_len and p.answer in p.document
    assert LongContextTask(haystack="noise", kind="multihop", num_facts=8).generate(np.random.default_rng(0)).answer.isdigit()
    with pytest.raises(ValueError):
        LongContextTask(haystack="essay")


def test_no_answer_and_empty_document_define_expected_answer():
    t = LongContextTask(num_facts=8, p_no_answer=1.0)
    p = t.generate(np.random.default_rng(0))
    assert p.answer == "none" and p.evidence == () and p.document.count(p.question[:2] + "=") == 0
    assert t.oracle_memories(p)[-1] == "none"
    e = LongContextTask(num_facts=0).generate(np.random.default_rng(0))
    assert e.document == "" and e.answer == "none"
    assert LongContextTask(kind="multihop", num_facts=8, p_no_answer=1.0).generate(np.random.default_rng(0)).answer == "none"


def test_long_documents_and_bad_configs():
    t = LongContextTask(num_facts=4 * 1024)
    assert t.num_chunks == 1024 and len(t.generate(np.random.default_rng(0)).document) == 1024 * t.chunk_chars
    for bad in (dict(kind="x"), dict(num_facts=-1), dict(answer_position=1.5), dict(p_no_answer=2.0),
                dict(kind="multihop", num_facts=1), dict(facts_per_chunk=0), dict(no_answer="n0")):
        with pytest.raises(ValueError):
            LongContextTask(**bad)


def test_exact_match_and_encoding():
    pred, pl = encode_plain(["417", "41", "none", ""], 5, tokenizer=TOK)
    tgt, tl = encode_plain(["417", "417", "none", ""], 4, tokenizer=TOK)
    assert exact_match(jnp.asarray(pred), jnp.asarray(pl), jnp.asarray(tgt), jnp.asarray(tl)).tolist() == [1, 0, 1, 1]
    assert encode_plain(["K=1;"], tokenizer=TOK)[0][0].tolist() == TOK.encode("K=1;")
    with pytest.raises(ValueError):
        encode_plain(["toolong"], 3, tokenizer=TOK)


def test_encoding_follows_the_tokenizer():
    """encode_plain is the tokenizer's plain-text encoding (tags in data stay characters), padded with
    its pad id; the character ids are the presets' (pad 0, digits from 8)."""
    text = "KQ=417; <think>ab@"
    for tok in (TOK, ByteTokenizer()):
        ids, lens = encode_plain([text, ""], 24, tokenizer=tok)
        assert ids[0, : len(text)].tolist() == tok.encode(text) and lens.tolist() == [len(text), 0]
        assert (ids[0, len(text):] == tok.pad_id).all() and (ids[1] == tok.pad_id).all()
    assert TOK.pad_id == 0 and TOK.encode("0123") == [8, 9, 10, 11]
    assert encode_plain(["ab\u00e9"], tokenizer=TOK)[0][0, 2] == TOK.encode("?")[0]  # non-ASCII -> '?'
    assert ByteTokenizer().encode("K")[0] != TOK.encode("K")[0]  # ids come from the tokenizer handed in


def test_agent_ids_come_from_the_tokenizer():
    cfg = MemAgentConfig(update_template="<think>{question}:{chunk}:{memory}>", chunk_tokens=7)
    char, byte = MemAgent(cfg, TOK), MemAgent(cfg, ByteTokenizer())
    assert char == MemAgent(cfg, CharTokenizer()) and hash(char) == hash(MemAgent(cfg, CharTokenizer()))
    assert char != byte  # a different vocabulary: a different jit static argument
    for agent in (char, byte):
        tok = agent.tokenizer
        assert (agent.pad_id, agent.bos_id, agent.eos_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
        assert agent.update_parts[0] == ("lit", (tok.tag_ids().think,))  # template tags are control tokens
        assert agent.initial_ids == tuple(tok.encode("none"))
    assert char.update_prompt_len == byte.update_prompt_len == 1 + 1 + 8 + 1 + 7 + 1 + 8 + 1
    with pytest.raises(ValueError, match="outside the vocabulary"):
        MemAgent(MemAgentConfig(final_template="{question}\u00e9{memory}"), TOK)  # <unk> in a template


# ------------------------------------------------------------------------------------- agent
def test_templates_pack_like_host_render():
    cfg = MemAgent(MemAgentConfig(update_template="<think>Q:{question} C:{chunk} M:{memory}</think>",
                                  chunk_tokens=7), TOK)
    q, ql = encode_plain(["AB=?", "Z=?"], 6, tokenizer=TOK)
    c, cl = encode_plain(["AB=123;", "x"], 7, tokenizer=TOK)
    m, ml = encode_plain(["none", ""], 8, tokenizer=TOK)
    fields = ("question", "chunk", "memory")
    template = cfg.config.update_template
    got, lens = build_prompt(template, fields, {"question": (q, ql), "chunk": (c, cl), "memory": (m, ml)},
                             cfg.update_prompt_len, TOK)
    for i, (qq, cc, mm) in enumerate([("AB=?", "AB=123;", "none"), ("Z=?", "x", "")]):
        want = render(template, fields, {"question": TOK.encode(qq), "chunk": TOK.encode(cc),
                                         "memory": TOK.encode(mm)}, TOK)
        assert np.asarray(got[i, : int(lens[i])]).tolist() == want
    assert cfg.update_prompt_len == 1 + 1 + 2 + 8 + 3 + 7 + 3 + 8 + 1  # bos <think> Q: q C: c M: m </think>
    for bad in (dict(update_template="{question}{chunk}"), dict(update_template="{question}|{chunk}{memory}"), dict(final_template="{question}{memory}{memory}"),
                dict(update_template="{question}{chunk}{memory}{oops}"), dict(memory_tokens=2), dict(chunk_tokens=0)):
        with pytest.raises(ValueError):
            MemAgent(MemAgentConfig(**bad), TOK)
    with pytest.raises(ValueError, match="window"):
        AGENT.check_model(LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_heads=2, n_kv_heads=2, max_seq_len=16))
    assert parse_template("a{question}", ("question",), TOK)[0] == ("lit", tuple(TOK.encode("a")))


def test_agent_bad_input_empty_short_and_overflow(models):
    probs = TASK.generate_batch(np.random.default_rng(0), 3)
    full = doc_batch(probs, AGENT)
    short = doc_batch(probs, AGENT, doc_width=full.doc.shape[1])
    short = short.replace(doc_lens=jnp.asarray([0, 3, TASK.doc_chars], jnp.int32))  # empty, < one chunk, full
    key = jax.random.key(0)
    gd, st = models["x"]  # always emits '7': never stops -> every active update overflows, truncated to M
    out = run_agent(gd, st, short, key, agent=AGENT)
    assert out.overflow.tolist() == [0, 1, 4]
    assert out.memory_lens.tolist() == [len("none"), 4, 4]
    assert decode_rows(out.memory, out.memory_lens, TOK) == ["none", "7777", "7777"]
    assert out.answer_overflow.all() and out.answer_lens.tolist() == [4, 4, 4]
    gd, st = models["eos"]  # stops at once: empty memory, no overflow
    out = run_agent(gd, st, short, key, agent=AGENT)
    assert out.overflow.tolist() == [0, 0, 0] and out.memory_lens.tolist() == [4, 0, 0]
    # a batch whose document array is empty (width 0) and one shorter than one chunk
    empty = doc_batch(LongContextTask(num_facts=0).generate_batch(np.random.default_rng(0), 2), AGENT)
    assert empty.doc.shape[1] == 0 and num_chunks(0, AGENT) == 1
    out = run_agent(*models["x"], empty, key, agent=AGENT)
    assert decode_rows(out.memory, out.memory_lens, TOK) == ["none", "none"] and out.overflow.tolist() == [0, 0]
    with pytest.raises(ValueError, match="question"):
        run_agent(gd, st, full.replace(question=jnp.zeros((3, 9), jnp.int32)), key, agent=AGENT)


def test_chunk_turns_run_on_the_multiturn_protocol_with_the_loss_on_the_model_tokens(models, monkeypatch):
    """run_agent is MemoryEnv in rl.lm.multiturn.make_turn_rollout: one turn per chunk + the final answer, each
    prompt the env's observation (question, chunk, the memory the model last wrote), each turn within its own token
    limit (M + 1 = 7 for updates, A + 1 = 5 for the answer: TextStep.max_new), and the Rollout's loss on the tokens the
    model wrote only (none of a chunk past the document's end)."""
    agent = MemAgent(MemAgentConfig(chunk_tokens=TASK.chunk_chars, memory_tokens=6, question_tokens=6, answer_tokens=4),
                     TOK)
    calls = []
    real = agent_module.make_turn_rollout
    monkeypatch.setattr(agent_module, "make_turn_rollout", lambda env, *a, **k: calls.append(env) or real(env, *a, **k))
    batch = doc_batch(TASK.generate_batch(np.random.default_rng(0), 3), agent)
    batch = batch.replace(doc_lens=jnp.asarray([0, 3, TASK.doc_chars], jnp.int32))  # empty, < one chunk, full
    gd, st = models["x"]  # always '7', never <eos>: every turn runs to its limit
    out = run_agent(gd, st, batch, jax.random.key(0), agent=agent, temperature=1.0, record=True)
    assert len(calls) == 1 and isinstance(calls[0], MemoryEnv) and isinstance(calls[0], TextEnv)
    n = TASK.num_chunks
    turns = out.turns
    assert isinstance(turns, Turns) and turns.tokens.shape == (n + 1, 3, 7)  # N = max(M, A) + 1
    assert turns.lengths[:n].tolist() == [[7] * 3] * n and turns.lengths[n].tolist() == [5] * 3  # per-turn limits
    prompts = [[TOK.decode(p[:k].tolist()) for p, k in zip(turns.prompts[t], turns.prompt_lens[t])] for t in range(n + 1)]
    assert all(p.endswith(":none>") for p in prompts[0])  # the initial memory
    assert [p.endswith(":777777>") for p in prompts[1]] == [False, True, True]  # what the model wrote (row 0: no chunk)
    q = TOK.decode(batch.question[2, : int(batch.question_lens[2])].tolist())
    assert prompts[n][2] == "<bos>" + q + ":777777>"  # the final turn: question and memory alone
    assert turns.info["active"].tolist() == [[False, True, True]] + [[False, False, True]] * (n - 1) + [[True] * 3]
    rollout = conversations(out, 3, pad_id=TOK.pad_id)
    want = (jnp.arange(7)[None, None] < turns.lengths[..., None]) & turns.info["active"][..., None]
    np.testing.assert_array_equal(np.asarray(rollout.token_mask), np.asarray(want.reshape(-1, 7), np.float32))
    resp = np.asarray(rollout.seqs)[np.arange(rollout.seqs.shape[0])[:, None],
                                    np.asarray(rollout.prompt_lens)[:, None] + np.arange(7)]
    np.testing.assert_array_equal(np.where(np.asarray(rollout.token_mask) > 0, resp, -1),
                                  np.where(np.asarray(want.reshape(-1, 7)), TOK.encode("7")[0], -1))


def test_oracle_sft_data_matches_agent_prompts():
    probs = TASK.generate_batch(np.random.default_rng(3), 2)
    convs = oracle_conversations(TASK, probs, AGENT)
    assert len(convs) == 2 * (TASK.num_chunks + 1)
    data = conversation_arrays(convs, AGENT.seq_len, tokenizer=TOK)
    assert data["tokens"].shape == (len(convs), AGENT.seq_len)
    assert data["loss_mask"].sum() == sum(len(r) for _, r in convs)
    final_prompt, final_resp = convs[TASK.num_chunks]
    assert TOK.decode(final_resp) == probs[0].answer + "<eos>"
    with pytest.raises(ValueError, match="initial_memory"):
        oracle_conversations(TASK, probs, MemAgent(MemAgentConfig(chunk_tokens=7, initial_memory="empty"), TOK))


def test_working_memory_flat_in_document_length(models):
    gd, st = models["x"]
    mem = {}
    for n in (4, 1024):  # 1 vs 256 chunks of 4 facts
        b = doc_batch(TASK.with_length(n).generate_batch(np.random.default_rng(0), 2), AGENT)
        mem[n] = agent_memory(gd, st, b, AGENT)
    assert mem[1024]["document"] == 256 * mem[4]["document"]
    assert mem[1024]["temp"] <= mem[4]["temp"] * 1.05 + 1024


# ------------------------------------------------------------------------------------- RL
def test_multiconv_rewards_broadcast_and_step():
    """conversations: one row per conversation (turn-major), the final answer's reward per rollout, grouped by
    question, each row's rollout in ``sample`` (the learner broadcasts the rollout's advantage to every one of its
    conversations); one learner step, the same on a data=8 mesh; the checks before compiling."""
    model = Transformer(LM, rngs=nnx.Rngs(1))
    probs = TASK.generate_batch(np.random.default_rng(0), 2)
    batch = doc_batch(probs, AGENT)
    n, r = TASK.num_chunks, 4  # a recorded rollout's layout (Turns): n chunk turns, then the final answer, x r rollouts
    z = lambda *shape: jnp.zeros(shape, jnp.int32)
    lens = jnp.concatenate([jnp.arange(n * r).reshape(n, r) % 6, jnp.full((1, r), 2)])
    active = jnp.concatenate([jnp.broadcast_to((jnp.arange(n) < n - 1)[:, None], (n, r)), jnp.ones((1, r), bool)])
    final = jnp.zeros((n + 1, r)).at[n].set(jnp.asarray([1.0, 0.0, 1.0, 1.0]))  # the final answers' exact match
    turns = Turns(prompts=z(n + 1, r, 20), prompt_lens=z(n + 1, r) + 9, tokens=z(n + 1, r, 5),
                  logprobs=jnp.zeros((n + 1, r, 5)), lengths=lens, live=active | True, reward=final,
                  done=jnp.zeros((n + 1, r), bool), info={"active": active})
    out = AgentOutput(answer=z(r, 4), answer_lens=z(r), answer_overflow=z(r) > 0, memory=z(r, 4), memory_lens=z(r),
                      overflow=z(r), turns=turns)
    conv = conversations(out, 2, pad_id=TOK.pad_id)  # 2 questions x G = 2
    assert conv.seqs.shape == ((n + 1) * r, 25) and conv.mask.shape == ((n + 1) * r, 5)
    assert conv.advantages is None and conv.rewards.tolist() == [1.0, 0.0, 1.0, 1.0]
    assert conv.groups.tolist() == [0, 0, 1, 1] and conv.num_groups == 2
    assert conv.sample.tolist() == [0, 1, 2, 3] * (n + 1)  # every conversation of rollout r: its reward's advantage
    mask = np.asarray(conv.mask)
    assert mask[: (n - 1) * r].sum(1).tolist() == np.minimum(np.asarray(lens[: n - 1]).reshape(-1), 5).tolist()
    assert mask[(n - 1) * r: n * r].sum() == 0 and mask[n * r:].sum(1).tolist() == [2] * r  # inactive chunks masked
    learner, rl = multiconv_learner(MultiConvConfig(group_size=4, lr=1e-2), AGENT, model, lambda s: batch)
    assert isinstance(rl, MultiConvAgent) and rl == multiconv_learner(MultiConvConfig(group_size=4, lr=1e-2), AGENT,
                                                                      model)[1]  # equal agents share programs
    state = learner.init(jax.random.key(1), rl)
    before = jax.tree.map(jnp.copy, state.params)
    state, m = learner.step_fn(rl)(state)
    assert int(state.step) == 1 and np.isfinite(float(m["policy_loss"]))
    assert float(m["conversations"]) == (n + 1) * 8  # 2 questions x G=4
    if float(m["zero_variance_groups"]) < 1.0:
        assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)))
    ev = learner.evaluate(state, rl, batch)  # the agent's evaluate: evaluate_agent (greedy, decoded text)
    assert ev == evaluate_agent(rl.graphdef, learner.policy(state), batch, AGENT)

    # mesh="data=8": every device runs its slice of the Q x G rollouts (the multi-process path: a data axis over
    # every process's devices); the step equals the one-device step up to float rounding
    split, rl8 = multiconv_learner(MultiConvConfig(group_size=4, lr=1e-2, mesh="data=8"), AGENT, model)
    state8, m8 = split.step(split.init(jax.random.key(1), rl8), rl8, batch)
    m, m8 = jax.device_get((m, m8))
    assert sorted(m) == sorted(m8)
    for k in m:
        np.testing.assert_allclose(m8[k], m[k], rtol=1e-4, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), state8.params, state.params)
    out = run_agent(rl8.graphdef, split.policy(state8), batch.repeat(4), jax.random.key(2), agent=AGENT,
                    mesh=split.mesh)
    assert out.memory.sharding.shard_shape(out.memory.shape) == (1, out.memory.shape[1])  # 8 rollouts: 1 per device
    with pytest.raises(ValueError, match=r"rollouts per step \(questions x group_size\) = 4 is not divisible by the 8"):
        bad, rl2 = multiconv_learner(MultiConvConfig(group_size=2, mesh="data=8"), AGENT, model)
        bad.step(bad.init(jax.random.key(1), rl2), rl2, batch)
    with pytest.raises(ValueError, match="minibatches"):
        bad, rl7 = multiconv_learner(MultiConvConfig(group_size=4, minibatches=7), AGENT, model)
        bad.step(bad.init(jax.random.key(1), rl7), rl7, batch)
    with pytest.raises(ValueError, match="questions"):
        rl7.batch(0)
    with pytest.raises(ValueError, match="'data' axis"):
        multiconv_learner(MultiConvConfig(mesh="fsdp=8"), AGENT, model)
    for bad in (dict(group_size=1), dict(temperature=0.0), dict(advantage="x")):
        with pytest.raises(ValueError):
            MultiConvConfig(**bad)


# ------------------------------------------------------------------------------------- reader
def test_reader_window_and_truncation(models):
    rcfg = Reader(ReaderConfig(window=48, question_tokens=6, answer_tokens=4), TOK)
    assert rcfg.doc_budget == 48 - 1 - 2 - 6 - 4 - 1
    short = doc_batch(TASK.generate_batch(np.random.default_rng(0), 2), AGENT)
    long = doc_batch(TASK.with_length(16).generate_batch(np.random.default_rng(0), 2), AGENT)
    assert fits(short, rcfg) and not fits(long, rcfg)
    ans, lens = run_reader(*models["x"], long, jax.random.key(0), reader=rcfg)
    assert ans.shape == (2, 4) and lens.tolist() == [4, 4]
    with pytest.raises(ValueError, match="budget"):
        reader_conversations(TASK.with_length(16).generate_batch(np.random.default_rng(0), 1), rcfg)
    with pytest.raises(ValueError):
        Reader(ReaderConfig(window=10), TOK)


# ------------------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_oracle_sft_agent_beats_untrained_on_heldout_docs():
    """A short fixed-seed oracle SFT makes the agent answer held-out documents (half of them with no
    answer in the text) far better than the untrained one, which overflows its memory and scores 0."""
    task = LongContextTask(haystack="noise", num_facts=4, facts_per_chunk=2, p_no_answer=0.5)
    agent = MemAgent(MemAgentConfig(chunk_tokens=task.chunk_chars, memory_tokens=4, question_tokens=4,
                                    answer_tokens=4), TOK)
    model = build_model(TinyLM(d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32), 0, TOK)
    held = doc_batch(task.generate_batch(np.random.default_rng(7), 32), agent)
    before = evaluate_agent(*nnx.split(model), held, agent)
    losses = sft_warm_start(model, task, agent, SFTConfig(problems=128, steps=80, batch_size=32, lr=5e-3))
    after = evaluate_agent(*nnx.split(model), held, agent)
    assert losses[-10:].mean() < 0.5 * losses[:5].mean()
    assert after["accuracy"] >= before["accuracy"] + 0.4, (before, after)
    assert after["overflow_rate"] < before["overflow_rate"]


# ------------------------------------------------------------------------------------- checkpoints
CKPT_SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # Qwen-like named tokens


def _bpe(vocab_size=400):
    """A byte-level BPE trained on the task's text (it merges "none", digits), Qwen-like specials."""
    t = LongContextTask(num_facts=8, facts_per_chunk=2, p_no_answer=0.3)
    texts = [x for p in t.generate_batch(np.random.default_rng(0), 200) for x in (p.document, p.question, p.answer)]
    return HFTokenizer.train_bpe(texts, vocab_size, special_tokens=CKPT_SPECIAL, eos="<|im_end|>",
                                 pad="<|endoftext|>", bos="<|im_start|>")


def test_checkpoint_tokenizer_spells_text_one_token_per_character():
    """A byte-level BPE: plain text is spelled one single-character token per character (valid, decodes
    back, not the canonical merged encoding); templates keep its own tokens; a multi-character answer
    token fails the in-jit id match but passes the decoded-text match. Tokenizers without single-character
    tokens are refused, naming the character."""
    tok = _bpe()
    text = "KQ=417; none ab <|im_end|>"
    ids, lens = encode_plain([text], tokenizer=tok)
    spelled = ids[0].tolist()
    assert len(spelled) == len(text) == lens[0] and tok.decode(spelled) == text
    assert spelled == [tok.encode(c)[0] for c in text]
    assert tok.encode(text) != spelled and len(tok.encode("none")) == 1  # merges exist: non-canonical spelling
    assert tok.eos_id not in spelled  # a control-token string in data stays characters
    agent = MemAgent(MemAgentConfig(chunk_tokens=7, memory_tokens=4, question_tokens=6, answer_tokens=4), tok)
    assert agent.initial_ids == tuple(tok.encode(c)[0] for c in "none")
    assert (agent.pad_id, agent.bos_id, agent.eos_id) == (tok.pad_id, tok.bos_id, tok.eos_id)
    assert agent.update_parts[1] == ("lit", tuple(tok.encode(":", allow_special=True)))
    # scoring: "none" as one token vs the spelled target
    tgt, tl = encode_plain(["none", "417"], 4, tokenizer=tok)
    pred, pl = tok.pad_batch([tok.encode("none"), tok.encode("418")], 4)  # canonical: merged tokens
    assert pl[0] == 1
    assert exact_match(jnp.asarray(pred), jnp.asarray(pl), jnp.asarray(tgt), jnp.asarray(tl)).tolist() == [0, 0]
    assert exact_match_text(pred, pl, tgt, tl, tok).tolist() == [1, 0]
    assert exact_match_text(np.asarray([[tok.vocab_size]]), np.asarray([1]), tgt[:1], tl[:1], tok).tolist() == [0]
    assert decode_rows(pred, pl, tok)[0] == "none"
    # our own tokenizers stay strict and keep their ids; a tokenizer without single-character tokens is refused
    for own in (TOK, ByteTokenizer()):
        assert byte_table(own)[ord("K")] == own.encode("K")[0]
    from tokenizers import Tokenizer as Tk, models, trainers

    raw = Tk(models.BPE())
    raw.train_from_iterator(["abc"] * 4, trainers.BpeTrainer(vocab_size=20, special_tokens=list(CKPT_SPECIAL)))
    with pytest.raises(ValueError, match=r"HFTokenizer.*' '.*not a single token"):
        encode_plain(["a"], tokenizer=HFTokenizer(raw, eos="<|im_end|>"))

    class Merging(CharTokenizer):  # one of ours that merges "ab": not character-level
        def encode(self, text, allow_special=False):
            return [i for i in super().encode(text.replace("ab", "a"), allow_special)]

    with pytest.raises(ValueError, match="character-level"):
        byte_table(Merging())


def _tiny_checkpoint(path):
    """A byte-level BPE + a random tiny Qwen3ForCausalLM, saved as a HF checkpoint directory."""
    from testutil import tiny_hf_checkpoint

    return tiny_hf_checkpoint(path, _bpe())


@pytest.fixture(scope="module")
def experiment():
    from jaxrl_reason.cli import load_experiment

    return load_experiment("memagent")


def test_experiment_runs_from_a_checkpoint(experiment, tmp_path):
    """--model: the checkpoint's weights and tokenizer; oracle SFT, one Multi-Conv RL step, the reader and the
    length sweep run on it (smallest sizes) with a finite summary; --model wins over the preset's arch."""
    from jaxrl_reason.utils.experiment import RunDir

    ckpt = str(_tiny_checkpoint(tmp_path / "ckpt"))
    task = LongContextTask(haystack="noise", num_facts=2, facts_per_chunk=1, p_no_answer=0.5)
    sft = SFTConfig(problems=8, steps=2, batch_size=4, lr=1e-3)
    cfg = experiment.Config(
        model=ckpt, arch="qwen2.5-0.5b", task=task,
        agent=MemAgentConfig(chunk_tokens=task.chunk_chars, memory_tokens=4, question_tokens=4, answer_tokens=4),
        sft=sft, reader_sft=sft, rl=MultiConvConfig(group_size=2, lr=1e-4, temperature=0.5), questions_per_step=2,
        rl_steps=1, eval_every=1, multipliers=(1,), eval_docs=2, eval_docs_long=2, heldout_docs=2, timing_docs=2)
    tok = study.load_tokenizer(cfg)
    assert isinstance(tok, HFTokenizer) and tok.eos == "<|im_end|>"
    assert study.build_lm(cfg, tok, 40).cfg.vocab_size == tok.vocab_size  # the checkpoint, not the arch
    summary = experiment.run(cfg, RunDir.create("memagent", cfg, root=tmp_path / "runs"))
    nums = {k: v for k, v in summary.items() if k != "run_dir"}
    assert nums and all(math.isfinite(v) for v in nums.values()), summary
    assert 0.0 <= summary["rl_acc_1x"] <= 1.0 and 0.0 <= summary["reader_acc_1x"] <= 1.0


def test_gpu_preset_builds_qwen25_05b_abstractly(experiment):
    """The gpu preset's arch: Qwen2.5-0.5B's shapes (never materialised) with the character tokenizer;
    its window holds the agent's conversations and the reader's; the cpu preset keeps the tiny LM."""
    gpu, tok = experiment.PRESETS["gpu"], CharTokenizer()
    assert gpu.arch == "qwen2.5-0.5b" and gpu.model is None and experiment.PRESETS["cpu"].arch is None
    agent = MemAgent(gpu.agent, tok)
    model = nnx.eval_shape(lambda: study.build_lm(gpu, tok, agent.seq_len))
    c = model.cfg
    assert (c.vocab_size, c.d_model, c.n_layers, c.n_heads, c.n_kv_heads, c.max_seq_len) == (151936, 896, 24, 14, 2,
                                                                                             agent.seq_len)
    agent.check_model(c)
    params = sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert 4.5e8 < params < 5.5e8, params
    window = gpu.reader(tok).config.window
    assert nnx.eval_shape(lambda: study.build_lm(gpu, tok, window)).cfg.max_seq_len == window
    with pytest.raises(ValueError, match="arch"):
        dataclasses.replace(gpu, arch="qwen9")
