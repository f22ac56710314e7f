"""MemAgent: long-context task, agent transform (shapes, bad input, overflow, flat memory), Multi-Conv
RL advantage broadcast and step, full-context reader truncation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.memagent.agent import (
    AgentOutput, MemAgentConfig, build_prompt, decode_rows, num_chunks, parse_template, render, run_agent)
from jaxrl_reason.agents.memagent.data import conversation_arrays, doc_batch, oracle_conversations
from jaxrl_reason.agents.memagent.reader import ReaderConfig, fits, reader_conversations, run_reader
from jaxrl_reason.agents.memagent.trainer import (
    MultiConvConfig, MultiConvTrainer, SFTConfig, agent_memory, conversations, evaluate_agent, sft_warm_start)
from jaxrl_reason.rl.grpo.recipes import TinyLM, build_model
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.tasks.longcontext import LongContextTask, encode_plain, exact_match
from jaxrl_reason.tasks.vocab import VOCAB

import testutil

TASK = LongContextTask(num_facts=4, facts_per_chunk=1)  # 7-character facts, one per chunk
AGENT = MemAgentConfig(chunk_tokens=TASK.chunk_chars, memory_tokens=4, question_tokens=6, answer_tokens=4)
LM = LMConfig(vocab_size=VOCAB.size, d_model=16, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=32, max_seq_len=32)


def constant_model(token: int):
    return testutil.constant_model(LM, token)


@pytest.fixture(scope="module")
def models():
    return {"eos": constant_model(VOCAB.eos), "x": constant_model(VOCAB.encode("7")[0])}


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
    pred, pl = encode_plain(["417", "41", "none", ""], 5)
    tgt, tl = encode_plain(["417", "417", "none", ""], 4)
    assert exact_match(jnp.asarray(pred), jnp.asarray(pl), jnp.asarray(tgt), jnp.asarray(tl)).tolist() == [1, 0, 1, 1]
    assert encode_plain(["K=1;"])[0][0].tolist() == VOCAB.encode("K=1;")
    with pytest.raises(ValueError):
        encode_plain(["toolong"], 3)


# ------------------------------------------------------------------------------------- agent
def test_templates_pack_like_host_render():
    cfg = MemAgentConfig(update_template="<think>Q:{question} C:{chunk} M:{memory}</think>", chunk_tokens=7)
    q, ql = encode_plain(["AB=?", "Z=?"], 6)
    c, cl = encode_plain(["AB=123;", "x"], 7)
    m, ml = encode_plain(["none", ""], 8)
    fields = ("question", "chunk", "memory")
    got, lens = build_prompt(cfg.update_template, fields, {"question": (q, ql), "chunk": (c, cl), "memory": (m, ml)},
                             cfg.update_prompt_len)
    for i, (qq, cc, mm) in enumerate([("AB=?", "AB=123;", "none"), ("Z=?", "x", "")]):
        want = render(cfg.update_template, fields, {"question": VOCAB.encode(qq), "chunk": VOCAB.encode(cc),
                                                    "memory": VOCAB.encode(mm)})
        assert np.asarray(got[i, : int(lens[i])]).tolist() == want
    assert cfg.update_prompt_len == 1 + 1 + 2 + 8 + 3 + 7 + 3 + 8 + 1  # bos <think> Q: q C: c M: m </think>
    for bad in (dict(update_template="{question}{chunk}"), dict(update_template="{question}|{chunk}{memory}"), dict(final_template="{question}{memory}{memory}"),
                dict(update_template="{question}{chunk}{memory}{oops}"), dict(memory_tokens=2), dict(chunk_tokens=0)):
        with pytest.raises(ValueError):
            MemAgentConfig(**bad)
    with pytest.raises(ValueError, match="window"):
        AGENT.check_model(LMConfig(vocab_size=VOCAB.size, d_model=16, n_heads=2, n_kv_heads=2, max_seq_len=16))
    assert parse_template("a{question}", ("question",))[0] == ("lit", tuple(VOCAB.encode("a")))


def test_agent_bad_input_empty_short_and_overflow(models):
    probs = TASK.generate_batch(np.random.default_rng(0), 3)
    full = doc_batch(probs, AGENT)
    short = doc_batch(probs, AGENT, doc_width=full.doc.shape[1])
    short = short.replace(doc_lens=jnp.asarray([0, 3, TASK.doc_chars], jnp.int32))  # empty, < one chunk, full
    key = jax.random.key(0)
    gd, st = models["x"]  # always emits '7': never stops -> every active update overflows, truncated to M
    out = run_agent(gd, st, short, key, config=AGENT)
    assert out.overflow.tolist() == [0, 1, 4]
    assert out.memory_lens.tolist() == [len("none"), 4, 4]
    assert decode_rows(out.memory, out.memory_lens) == ["none", "7777", "7777"]
    assert out.answer_overflow.all() and out.answer_lens.tolist() == [4, 4, 4]
    gd, st = models["eos"]  # stops at once: empty memory, no overflow
    out = run_agent(gd, st, short, key, config=AGENT)
    assert out.overflow.tolist() == [0, 0, 0] and out.memory_lens.tolist() == [4, 0, 0]
    # a batch whose document array is empty (width 0) and one shorter than one chunk
    empty = doc_batch(LongContextTask(num_facts=0).generate_batch(np.random.default_rng(0), 2), AGENT)
    assert empty.doc.shape[1] == 0 and num_chunks(0, AGENT) == 1
    out = run_agent(*models["x"], empty, key, config=AGENT)
    assert decode_rows(out.memory, out.memory_lens) == ["none", "none"] and out.overflow.tolist() == [0, 0]
    with pytest.raises(ValueError, match="question"):
        run_agent(gd, st, full.replace(question=jnp.zeros((3, 9), jnp.int32)), key, config=AGENT)


def test_oracle_sft_data_matches_agent_prompts():
    probs = TASK.generate_batch(np.random.default_rng(3), 2)
    convs = oracle_conversations(TASK, probs, AGENT)
    assert len(convs) == 2 * (TASK.num_chunks + 1)
    data = conversation_arrays(convs, AGENT.seq_len)
    assert data["tokens"].shape == (len(convs), AGENT.seq_len)
    assert data["loss_mask"].sum() == sum(len(r) for _, r in convs)
    final_prompt, final_resp = convs[TASK.num_chunks]
    assert VOCAB.decode(final_resp) == probs[0].answer + "<eos>"
    with pytest.raises(ValueError, match="initial_memory"):
        oracle_conversations(TASK, probs, MemAgentConfig(chunk_tokens=7, initial_memory="empty"))


def test_working_memory_flat_in_document_length(models):
    gd, st = models["x"]
    mem = {}
    for n in (4, 1024):  # 1 vs 256 chunks of 4 facts
        b = doc_batch(TASK.with_length(n).generate_batch(np.random.default_rng(0), 2), AGENT)
        mem[n] = agent_memory(gd, st, b, AGENT)
    assert mem[1024]["document"] == 256 * mem[4]["document"]
    assert mem[1024]["temp"] <= mem[4]["temp"] * 1.05 + 1024


# ------------------------------------------------------------------------------------- RL
def test_multiconv_advantage_broadcast_and_step():
    model = Transformer(LM, rngs=nnx.Rngs(1))
    probs = TASK.generate_batch(np.random.default_rng(0), 2)
    batch = doc_batch(probs, AGENT)
    n, r = TASK.num_chunks, 4  # a recorded rollout's layout: n chunks x r rollouts, then r final answers
    z = lambda *shape: jnp.zeros(shape, jnp.int32)
    lens = jnp.arange(n * r).reshape(n, r) % 6
    out = AgentOutput(answer=z(r, 4), answer_lens=z(r), answer_overflow=z(r) > 0, memory=z(r, 4), memory_lens=z(r),
                      overflow=z(r), final=dict(prompts=z(r, 12), prompt_lens=z(r) + 3, tokens=z(r, 5), lengths=z(r) + 2),
                      updates=dict(prompts=z(n, r, 20), prompt_lens=z(n, r) + 9, tokens=z(n, r, 5), lengths=lens,
                                   active=(jnp.arange(n) < n - 1)[:, None] | (lens < 0)))
    conv = conversations(out, jnp.asarray([1.0, -1.0, 0.5, -0.5]))
    assert conv["prompts"].shape == ((n + 1) * r, 20) and conv["tokens"].shape == ((n + 1) * r, 5)
    assert conv["adv"].tolist() == [1.0, -1.0, 0.5, -0.5] * (n + 1)  # every conversation of rollout r: adv[r]
    assert conv["index"].tolist() == list(range(r)) * (n + 1)
    mask = np.asarray(conv["mask"])
    assert mask[: (n - 1) * r].sum(1).tolist() == np.minimum(np.asarray(lens[: n - 1]).reshape(-1), 5).tolist()
    assert mask[(n - 1) * r: n * r].sum() == 0 and mask[n * r:].sum(1).tolist() == [2] * r  # inactive chunks masked
    trainer = MultiConvTrainer(MultiConvConfig(group_size=4, lr=1e-2), AGENT, model)
    state = trainer.init()
    before = jax.tree.map(jnp.copy, state.params)
    state, m = trainer.step(state, batch, jax.random.key(1))
    assert int(state.step) == 1 and np.isfinite(float(m["policy_loss"]))
    assert float(m["conversations"]) == (n + 1) * 8  # 2 questions x G=4
    if float(m["zero_variance_groups"]) < 1.0:
        assert any(float(jnp.abs(a - b).max()) > 0 for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)))
    with pytest.raises(ValueError, match="minibatches"):
        MultiConvTrainer(MultiConvConfig(group_size=4, minibatches=7), AGENT, model).step(state, batch, jax.random.key(1))
    for bad in (dict(group_size=1), dict(temperature=0.0), dict(advantage="x")):
        with pytest.raises(ValueError):
            MultiConvConfig(**bad)


# ------------------------------------------------------------------------------------- reader
def test_reader_window_and_truncation(models):
    rcfg = ReaderConfig(window=48, question_tokens=6, answer_tokens=4)
    assert rcfg.doc_budget == 48 - 1 - 2 - 6 - 4 - 1
    short = doc_batch(TASK.generate_batch(np.random.default_rng(0), 2), AGENT)
    long = doc_batch(TASK.with_length(16).generate_batch(np.random.default_rng(0), 2), AGENT)
    assert fits(short, rcfg) and not fits(long, rcfg)
    ans, lens = run_reader(*models["x"], long, jax.random.key(0), config=rcfg)
    assert ans.shape == (2, 4) and lens.tolist() == [4, 4]
    with pytest.raises(ValueError, match="budget"):
        reader_conversations(TASK.with_length(16).generate_batch(np.random.default_rng(0), 1), rcfg)
    with pytest.raises(ValueError):
        ReaderConfig(window=10)


# ------------------------------------------------------------------------------------- learning
@pytest.mark.slow
def test_oracle_sft_agent_beats_untrained_on_heldout_docs():
    """A short fixed-seed oracle SFT makes the agent answer held-out documents (half of them with no
    answer in the text) far better than the untrained one, which overflows its memory and scores 0."""
    task = LongContextTask(haystack="noise", num_facts=4, facts_per_chunk=2, p_no_answer=0.5)
    agent = MemAgentConfig(chunk_tokens=task.chunk_chars, memory_tokens=4, question_tokens=4, answer_tokens=4)
    model = build_model(TinyLM(d_model=32, n_layers=2, n_heads=4, d_ff=128, max_seq_len=32), 0)
    held = doc_batch(task.generate_batch(np.random.default_rng(7), 32), agent)
    before = evaluate_agent(*nnx.split(model), held, agent)
    losses = sft_warm_start(model, task, agent, SFTConfig(problems=128, steps=80, batch_size=32, lr=5e-3))
    after = evaluate_agent(*nnx.split(model), held, agent)
    assert losses[-10:].mean() < 0.5 * losses[:5].mean()
    assert after["accuracy"] >= before["accuracy"] + 0.4, (before, after)
    assert after["overflow_rate"] < before["overflow_rate"]
