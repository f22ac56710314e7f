"""search/lm_mcts.py: ASTRO's step-level LM search on mctx and its best-of-N baseline (procedure cloning:
test_procedure_cloning.py; the experiment itself: tests/experiments/test_astro.py)."""

import jax
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import ByteTokenizer, CharTokenizer
from jaxrl_reason.search.lm_mcts import StepSearchConfig, best_of_n, make_step_search, step_ids
from jaxrl_reason.tasks.base import make_batch
from jaxrl_reason.tasks.random_calculation import RandomCalculation

CFG = StepSearchConfig(num_simulations=4, branching=2, max_depth=2, step_tokens=6, rollout_tokens=10)
PROMPT_LEN = 16
TOK = CharTokenizer()


def _encode(text):
    """Model-written text: the R1 tags in it are the control tokens (as the model emits them)."""
    return TOK.encode(text, allow_special=True)


def _decode(ids):
    return TOK.decode(np.asarray(ids).tolist())


def test_configs_reject_bad_values():
    with pytest.raises(ValueError, match="branching"):
        StepSearchConfig(branching=0)
    with pytest.raises(ValueError, match="temperature"):
        StepSearchConfig(temperature=0.0)


@pytest.fixture(scope="module")
def searched():
    lm = LMConfig(vocab_size=TOK.vocab_size, d_model=32, n_layers=1, n_heads=2, n_kv_heads=2, d_ff=64,
                  max_seq_len=CFG.context_len(PROMPT_LEN))
    graphdef, params = nnx.split(Transformer(lm, rngs=nnx.Rngs(0)))
    batch = make_batch(RandomCalculation(max_difficulty=2), np.random.default_rng(0), 2, PROMPT_LEN, 8, tokenizer=TOK)
    search = make_step_search(graphdef, CFG, tokenizer=TOK)
    args = (batch.prompts, batch.prompt_lens, batch.answers, batch.answer_lens)
    return graphdef, params, batch, search(params, jax.random.key(0), *args), search(params, jax.random.key(0), *args)


def test_search_tree_is_consistent_and_deterministic(searched):
    _, _, batch, res, again = searched
    jax.tree.map(np.testing.assert_array_equal, res.solved, again.solved)
    np.testing.assert_array_equal(res.tree.embeddings.response, again.tree.embeddings.response)
    tree, emb = res.tree, res.tree.embeddings
    visits, parents = np.asarray(tree.node_visits), np.asarray(tree.parents)
    assert visits[:, 0].tolist() == [CFG.num_simulations + 1] * 2
    for b in range(2):
        for n in np.flatnonzero(visits[b] > 0)[1:]:
            p, a = parents[b, n], int(tree.action_from_parent[b, n])
            if emb.terminal[b, p]:
                continue
            plen, clen = int(emb.response_len[b, p]), int(emb.candidate_lens[b, p, a])
            child = np.asarray(emb.response[b, n, : int(emb.response_len[b, n])])
            want = np.concatenate([emb.response[b, p, :plen], emb.candidates[b, p, a, :clen]])[: CFG.response_len]
            np.testing.assert_array_equal(child, want)  # child = parent + the chosen candidate step
            # the verifier flag agrees with a host-side check of response + rollout
            text = _decode(np.concatenate([child, emb.rollout[b, n, : int(emb.rollout_len[b, n])]]))
            answer = text.split("<answer>")[-1].split("</answer>")[0] if "</answer>" in text else None
            assert bool(emb.correct[b, n]) == (answer == batch.problems[b].answer)
    solved = ((visits > 0) & np.asarray(emb.correct)).any(-1)
    np.testing.assert_array_equal(np.asarray(res.solved), solved)
    assert (np.asarray(res.tokens) > 0).all()


def test_best_of_n_counts_tokens(searched):
    graphdef, params, batch, _, _ = searched
    ok, tokens = best_of_n(graphdef, params, jax.random.key(1), batch.prompts, batch.prompt_lens, batch.answers,
                           batch.answer_lens, num_samples=3, max_new_tokens=8, temperature=1.0, tokenizer=TOK)
    assert ok.shape == (2,) and ok.dtype == bool
    assert ((np.asarray(tokens) >= 3) & (np.asarray(tokens) <= 24)).all()


def test_step_check_agrees_with_host_check_and_prunes_the_search(searched):
    from jaxrl_reason.tasks.calc_steps import step_checker, step_is_valid

    step_is_wrong = step_checker(TOK)

    steps = ["3+4=7", "7*2=15", "-7/2*2=-7", "3/0=1", "6/4=3/2", "6/4=6/4", "2*3=06", "6/4/2=3/4", "3--5=8",
             "-3-5=-8", "0-0=-0", "5/1=5", "14", "1+2==3", "9*9=81", "9*9=18"]
    toks = np.full((len(steps) + 2, 12), TOK.pad_id, np.int32)
    lens = np.zeros(len(steps) + 2, np.int32)
    for i, s in enumerate(steps + ["7*2=15"]):  # each ends with ','
        ids = TOK.encode(s + ",")
        toks[i, : len(ids)], lens[i] = ids, len(ids)
    ids = TOK.encode("7*2=15")  # the last row: no delimiter (cut step), so it is not judged
    toks[-1, : len(ids)], lens[-1] = ids, len(ids)
    wrong = np.asarray(jax.jit(step_is_wrong)(toks, lens))
    assert wrong[: len(steps)].tolist() == [not step_is_valid(s) for s in steps]
    assert wrong[len(steps)] and not wrong[-1]
    assert [s for s in steps if step_is_valid(s)] == ["3+4=7", "-7/2*2=-7", "6/4=3/2", "6/4/2=3/4", "3--5=8", "-3-5=-8", "5/1=5",
                                                      "9*9=81"]
    # the search with the check never counts a rejected step's node as solved or spends tokens on it
    graphdef, params, batch, _, _ = searched
    res = make_step_search(graphdef, CFG, step_is_wrong, tokenizer=TOK)(params, jax.random.key(0), batch.prompts, batch.prompt_lens,
                                                         batch.answers, batch.answer_lens)
    tree, emb = res.tree, res.tree.embeddings
    rejected = np.asarray(jax.jit(step_is_wrong)(emb.candidates, emb.candidate_lens))  # [B, nodes, K]
    for b in range(2):
        for n in np.flatnonzero(np.asarray(tree.node_visits[b]) > 0)[1:]:
            p, a = int(tree.parents[b, n]), int(tree.action_from_parent[b, n])
            if not emb.terminal[b, p] and rejected[b, p, a]:
                assert not emb.correct[b, n] and int(emb.tokens[b, n]) == 0 and emb.terminal[b, n]


def test_graded_process_value_counts_steps_before_the_first_false_one(searched):
    from jaxrl_reason.search.lm_mcts import steps_before_first_wrong
    from jaxrl_reason.tasks.calc_steps import step_checker

    step_is_wrong = step_checker(TOK)

    bodies = ["3+4=7,7*2=15,15-1=14</think>", "3+4=7,7*2=14</think>", "3+4=8,8*2=16</think>", "", "3+4=7,7*2=1",
              "123*45=5535,1+1=3,"]  # the last: a first step longer than a window (not judged), then a false one
    rows = [_encode("<think>" + b) for b in bodies]
    toks = np.full((len(rows), 40), TOK.pad_id, np.int32)
    for i, r in enumerate(rows):
        toks[i, : len(r)] = r
    lens = np.array([len(r) for r in rows])
    graded = jax.jit(lambda t, n: steps_before_first_wrong(t, n, step_is_wrong, 10, tokenizer=TOK))
    got = np.asarray(graded(toks, lens))
    np.testing.assert_allclose(got, [1 / 3, 1.0, 0.0, 0.0, 1.0, 0.5])
    one = graded(toks[0], lens[0])  # a single response: a scalar
    assert one.shape == () and float(one) == pytest.approx(1 / 3)
    # in the search: guide = value + process_weight x the unverified rollouts' mean graded fraction
    graphdef, params, batch, plain, _ = searched
    res = make_step_search(graphdef, CFG, value_check=step_is_wrong, tokenizer=TOK)(
        params, jax.random.key(0), batch.prompts, batch.prompt_lens, batch.answers, batch.answer_lens)
    emb, visited = res.tree.embeddings, np.asarray(res.tree.node_visits) > 0
    value, guide = np.asarray(emb.value)[visited], np.asarray(emb.guide)[visited]
    assert (guide >= value - 1e-6).all() and (guide <= value + CFG.process_weight * (1 - value) + 1e-6).all()
    np.testing.assert_array_equal(np.asarray(plain.tree.embeddings.guide), np.asarray(plain.tree.embeddings.value))
    with pytest.raises(ValueError, match="process_weight"):
        StepSearchConfig(process_weight=1.0)


def test_countdown_verifier_runs_the_task_check_inside_jit_and_the_search(searched):
    """A task with many valid answers: the search and best-of-N verify with ``task.check`` (host callback)."""
    from jaxrl_reason.tasks.countdown import Countdown
    from jaxrl_reason.tasks.verify import answer_verifier, verify_exact

    task = Countdown(max_difficulty=2)
    assert answer_verifier(RandomCalculation(), TOK) is answer_verifier(RandomCalculation(), TOK)
    assert answer_verifier(task, TOK) is answer_verifier(task, TOK)
    batch = make_batch(task, np.random.default_rng(0), 2, PROMPT_LEN, 8, tokenizer=TOK)
    assert (batch.problems[0].prompt, batch.problems[0].answer) == ("count 1 3 to 4", "3+1")
    bodies = ["<think></think><answer>1+3</answer>", "<think></think><answer>3+1</answer>",
              "<think></think><answer>1+1+3</answer>", "<think>1+3</answer>", ""]
    want = [True, True, False, False, False]
    rows = [_encode(t) for t in bodies]
    toks = np.full((len(rows), 24), TOK.pad_id, np.int32)
    for i, r in enumerate(rows):
        toks[i, : len(r)] = r
    first = batch.take([0] * len(rows))
    got = jax.jit(answer_verifier(task, TOK))(toks, np.array([len(r) for r in rows]), first.prompts, first.prompt_lens,
                                         first.answers, first.answer_lens)
    assert np.asarray(got).tolist() == want
    exact = verify_exact(toks, np.array([len(r) for r in rows]), first.prompts, first.prompt_lens, first.answers,
                         first.answer_lens, tags=TOK.tag_ids())
    assert np.asarray(exact).tolist() == [False, True, False, False, False]  # exact match misses "1+3"
    # in the search, a node's verifier flag is task.check of its response + rollout
    graphdef, params, _, _, _ = searched
    res = make_step_search(graphdef, CFG, verify=answer_verifier(task, TOK), tokenizer=TOK)(
        params, jax.random.key(0), batch.prompts, batch.prompt_lens, batch.answers, batch.answer_lens)
    emb, visits = res.tree.embeddings, np.asarray(res.tree.node_visits)
    for i in range(2):
        for n in np.flatnonzero(visits[i] > 0):
            text = _decode(np.concatenate([emb.response[i, n, : int(emb.response_len[i, n])],
                                           emb.rollout[i, n, : int(emb.rollout_len[i, n])]]))
            answer = text.split("<answer>")[-1].split("</answer>")[0] if text.endswith("</answer>") else None
            assert bool(emb.correct[i, n]) == (answer is not None and task.check(answer, batch.problems[i]))
    ok, _ = best_of_n(graphdef, params, jax.random.key(1), batch.prompts, batch.prompt_lens, batch.answers,
                      batch.answer_lens, num_samples=2, max_new_tokens=8, temperature=1.0, verify=answer_verifier(task, TOK),
                      tokenizer=TOK)
    assert ok.shape == (2,)



def test_step_check_and_search_ids_come_from_the_tokenizer():
    """The in-jit step check and the search read the ids of the tokenizer they are given (no global vocabulary)."""
    from jaxrl_reason.tasks.calc_steps import step_checker, step_is_valid

    steps = ["3+4=7,", "7*2=15,", "6/4=3/2,", "2*3=06,", "9*9=81</think>", "9*9=18</think>", "7*2=15"]
    want = [not step_is_valid(s.removesuffix("</think>")) for s in steps[:-1]] + [False]  # no delimiter: not judged
    for tok in (TOK, ByteTokenizer()):
        check = step_checker(tok)
        assert check is step_checker(tok)  # cached: one function object per tokenizer
        ids, lens = tok.pad_batch([tok.encode(s, allow_special=True) for s in steps], 16)
        assert np.asarray(jax.jit(check)(ids, lens)).tolist() == want
    assert step_ids(TOK) == (0, 3, 4, 6, (TOK.encode(",")[0], 4))  # the character vocabulary's ids
    byte = ByteTokenizer()
    assert step_ids(byte).delimiters == (byte.encode(",")[0], byte.token_to_id("</think>"))

    class Splitting(CharTokenizer):  # "9" written as two tokens
        def _encode_text(self, text):
            return [i for c in text for i in CharTokenizer._encode_text(self, "99" if c == "9" else c)]

    with pytest.raises(ValueError, match="'9' as a single token"):
        step_checker(Splitting())


# ---- checkpoints: a byte-level BPE tokenizer, spelled one token per character; --model and --arch ----
