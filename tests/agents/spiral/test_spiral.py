"""SPIRAL: tokenizer and task-id adapter, the byte <-> id tables (the byte tokenizer's are byte + 8; a byte-level
BPE renders one token per character and parses its canonical tokens), advantages (the learner's estimators over
(episode, seat) samples), host/device parse twins, scripted-player rollouts (device loop == Python-driven loop,
forfeits), infoset prompts and frequencies, config errors, one LM train step on the learner, the experiment from a
tiny HF checkpoint and the gpu preset's Qwen3-0.6B shapes (abstract)."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.spiral.advantages import spiral_estimator
from jaxrl_reason.agents.spiral.evaluation import infoset_probs, infoset_prompts
from jaxrl_reason.agents.spiral.rollout import (
    GAMES,
    LMGame,
    _game_chars,
    _parse,
    _render,
    canned_answers,
    canned_responder,
    game_rollout,
    host_text,
    parse_text,
    python_rollout,
    response_bytes,
)
from jaxrl_reason.agents.spiral.study import load_lm
from jaxrl_reason.agents.spiral.tokenizer import id_table, spiral_tokenizer
from jaxrl_reason.agents.spiral.agent import SpiralAgent, SpiralConfig, fixed_opponent, spiral_learner
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, sft_examples
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sampler import SampleOutput, SamplerConfig
from jaxrl_reason.rl.lm.advantages import ESTIMATORS, estimate
from jaxrl_reason.rl.rae import rae_advantages
from jaxrl_reason.models.tokenizer import (
    CHARS,
    ByteTokenizer,
    CharTokenizer,
    HFTokenizer,
    byte_ids,
    byte_offset,
    token_bytes,
)

TOK = spiral_tokenizer()
SAMPLER = SamplerConfig(max_new_tokens=16)
KUHN_ANSWERS = ("\\boxed{check}", "I bet. \\boxed{ BET }", "\\boxed{call}", "\\boxed{fold}", "no idea")


def text(ids) -> str:
    """LM ids -> text without padding."""
    return TOK.decode([i for i in np.asarray(ids).reshape(-1).tolist() if i != TOK.pad_id])


@pytest.fixture(scope="module")
def kuhn():
    return LMGame.make("kuhn_poker", tokenizer=TOK)


@pytest.fixture(scope="module")
def scripted_selfplay(kuhn):
    """One compiled scripted self-play rollout (the answer table is its ``params``)."""
    return jax.jit(game_rollout(None, kuhn, 32, SAMPLER, responder=canned_responder))


def test_tokenizer_layout_and_task_id_table():
    """Ids 0..7: the character tokenizer's specials; bytes at 8..263; task ids map into LM ids."""
    chars = CharTokenizer()
    assert TOK.vocab_size == 264 and byte_offset(TOK) == 8
    assert TOK.control_tokens == chars.control_tokens[:8]  # same special tokens, same ids
    assert (TOK.pad_id, TOK.bos_id, TOK.eos_id) == (0, 1, 2) and TOK.tag_ids() == chars.tag_ids()
    assert TOK.encode("\\boxed{4}") == [b + 8 for b in b"\\boxed{4}"] and TOK.decode(TOK.encode("\\boxed{4}")) == "\\boxed{4}"
    assert TOK.encode("<answer>") == [b + 8 for b in b"<answer>"]  # text from data stays text
    table = id_table(chars, TOK)
    assert table.shape == (86,)  # 8 specials + 78 characters (the 10 unused ids are left out)
    s = "<think>3+4=7</think><answer>7</answer>"
    ids = chars.encode(s, allow_special=True)
    np.testing.assert_array_equal(table[ids], TOK.encode(s, allow_special=True))
    assert TOK.decode(table[ids]) == s
    with pytest.raises(ValueError, match="no special token '<unk>'"):
        id_table(chars, ByteTokenizer())
    game = LMGame.make("kuhn_poker", tokenizer=TOK)
    first = next(c for c in _game_chars(game.text) if c not in CHARS)  # the first the character tokenizer lacks
    with pytest.raises(ValueError, match=f"CharTokenizer .*does not spell {re.escape(repr(first))} .*kuhn_poker"):
        LMGame.make("kuhn_poker", tokenizer=chars)


def _states(game, n=6, turns=3):
    """``turns * n`` reachable states (random legal play from ``n`` deals), flattened: ``(state, ts)``."""
    env = game.env

    @jax.jit
    def play(key):
        def turn(carry, k):
            state, ts = carry
            _, legal = mover_view(ts)
            a = jax.vmap(lambda k, l: jax.random.choice(k, l.shape[0], p=l / l.sum()))(
                jax.random.split(k, n), legal.astype(jnp.float32))
            return jax.vmap(env.step)(jax.random.split(jax.random.fold_in(k, 1), n), state, a), (state, ts)

        init = jax.vmap(env.reset)(jax.random.split(key, n))
        return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]),
                            jax.lax.scan(turn, init, jax.random.split(key, turns))[1])

    return play(jax.random.key(0))


@pytest.mark.parametrize("style", ["verbose", "compact"])
def test_byte_tokenizer_tables_are_byte_plus_offset(style):
    """The presets' ids are unchanged by the per-byte tables: prompts are ``text.render(..., offset=8)``, a
    response's bytes are ``id - 8`` (specials and ids past the vocabulary: -1, which matches no byte)."""
    np.testing.assert_array_equal(byte_ids(TOK), np.arange(256) + 8)
    table, lens = token_bytes(TOK)
    assert table.shape == (264, 1) and (lens == 1).all()
    for name in GAMES:
        game = LMGame.make(name, style, tokenizer=TOK)
        state, ts = _states(game)
        want, got = jax.jit(lambda s, p, game=game: (jax.vmap(game.text.render, in_axes=(0, 0, None))(s, p, 8),
                                                     _render(game, s, p)))(state, ts.current_player)
        assert (np.asarray(got[:, 0]) == TOK.bos_id).all()
        np.testing.assert_array_equal(got[:, 1:], want)
    ids = np.asarray([[0, 1, 2, 7, 8, 100, 263, 264, 5000]])
    np.testing.assert_array_equal(response_bytes(TOK, ids), [[-1, -1, -1, -1, 0, 92, 255, -1, -1]])


@pytest.fixture(scope="module")
def bpe():
    """A byte-level BPE trained on the games' text (so ``\\boxed``, ``check`` ... are single tokens), with Qwen's
    special tokens (bos falls back to ``<|im_start|>``)."""
    texts = []
    for name in GAMES:
        for style in ("verbose", "compact"):
            game = LMGame.make(name, style, tokenizer=TOK)
            state, _ = game.env.reset(jax.random.key(0))
            texts += [game.text.describe(state, 0)] + [f"I bet. \\boxed{{{a}}}" for a in game.text.action_strings]
    return HFTokenizer.train_bpe(texts * 4, 400, special_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"),
                                 eos="<|im_end|>", pad="<|endoftext|>", bos="<|im_start|>")


@pytest.mark.parametrize("name", GAMES)
def test_bpe_renders_one_token_per_character_and_parses_its_canonical_tokens(bpe, name):
    game = LMGame.make(name, "compact", tokenizer=bpe)
    state, ts = _states(game, n=2, turns=2)
    prompts = np.asarray(jax.jit(lambda s, p: _render(game, s, p))(state, ts.current_player))
    parse = jax.jit(lambda ids, legal: _parse(game, ids, legal))
    for i in range(4):  # the prompt text, one id per character (not the canonical, shorter tokenization)
        text_i = game.text.describe(jax.tree.map(lambda x, i=i: x[i], state), int(ts.current_player[i]))
        assert bpe.decode(prompts[i].tolist()) == "<|im_start|>" + text_i
        assert prompts.shape[1] == 1 + len(text_i) > len(bpe.encode(text_i))
    legal = np.ones((1, game.env.num_actions), bool)
    for a, action in enumerate(game.text.action_strings):
        answer = f"I bet. \\boxed{{{action}}}"
        canonical, spelled = bpe.encode(answer), [int(byte_ids(bpe)[ord(c)]) for c in answer]
        assert len(canonical) < len(spelled)  # multi-character tokens
        for ids in (canonical, spelled):
            padded, _ = bpe.pad_batch([ids + [bpe.eos_id]], 48)
            got = tuple(int(x[0]) for x in parse(padded, legal))
            assert got == (a, gtext.OK) == parse_text(game.text, host_text(padded[0], tokenizer=bpe), legal[0]), answer
    # a special token or a model id past the tokenizer's vocabulary inside the box: unknown content
    box = bpe.encode("\\boxed{")
    for bad in (bpe.eos_id, bpe.vocab_size + 3):
        padded, _ = bpe.pad_batch([box + [bad] + bpe.encode(game.text.action_strings[0] + "}")], 48)
        got = tuple(int(x[0]) for x in parse(padded, legal))
        assert got == (gtext.INVALID_ACTION, gtext.UNKNOWN) == parse_text(
            game.text, host_text(padded[0], tokenizer=bpe), legal[0])


def test_bpe_warm_start_examples_parse(bpe):
    """Warm-start examples with a BPE: the rendered prompt, then the canonical tokens of the expert's answer,
    which the rollout's parser reads as a legal move."""
    game = LMGame.make("kuhn_poker", "compact", tokenizer=bpe)
    data = sft_examples([game], WarmStartConfig(games_per_game=8), jax.random.key(0))
    parse = jax.jit(lambda ids: _parse(game, ids, jnp.ones((ids.shape[0], 4), bool)))
    starts = np.argmax(data["loss_mask"], axis=1) + 1
    _, status = parse(np.stack([np.pad(t[s:], (0, s), constant_values=bpe.pad_id) for t, s in zip(data["tokens"], starts)]))
    assert (np.asarray(status) == gtext.OK).all()
    for tokens, mask in zip(data["tokens"], data["loss_mask"]):
        start = int(np.argmax(mask)) + 1
        assert tokens[0] == bpe.bos_id and bpe.decode(tokens[1:start].tolist()).startswith("Kuhn Poker. You are P")
        response = tokens[start:]
        assert bpe.eos_id in response.tolist() and bpe.decode(response.tolist()).startswith("I hold ")


def _sequential_rae(b, returns, games, alpha=0.05):
    b, adv = np.array(b, np.float64), []
    for r, g in zip(returns, games):
        adv.append(r - b[g])
        b[g] = (1 - alpha) * b[g] + alpha * r
    return np.asarray(adv), b


def _flat(returns, games, num_games):
    """Episodes [N, 2] of games [N] -> the learner's (episode, seat) samples: rewards, groups (game * 2 + seat)."""
    n = len(games)
    return (jnp.asarray(returns).reshape(-1), jnp.asarray(np.repeat(games, 2) * 2 + np.tile([0, 1], n)),
            2 * num_games)


def test_advantages_are_the_learners_estimators_per_episode_and_seat():
    """SPIRAL's modes are registered estimators over (episode, seat) samples grouped by (game, seat): "rae" is the
    per-(game, role) EMA baseline read before its update (rl.rae, episode by episode), "none" is A = R with the
    baselines still tracked, "fixed" is "rae"; a turn gets its (episode, seat) sample's advantage."""
    rng = np.random.default_rng(0)
    returns = rng.choice([-1.0, 0.0, 1.0], size=(6, 2)).astype(np.float32)
    games = np.asarray([0, 1, 0, 0, 1, 1])
    b0 = np.asarray([[0.2, -0.1], [0.0, 0.3]], np.float32)
    rewards, groups, num_groups = _flat(returns, games, 2)
    want, want_b = _sequential_rae(b0, returns, games)
    assert spiral_estimator("rae") == spiral_estimator("fixed") == "rae" and spiral_estimator("none") == "none"
    adv, b1 = estimate("rae", rewards, groups, num_groups, None, jnp.asarray(b0).reshape(-1))
    np.testing.assert_allclose(adv.reshape(6, 2), want, atol=1e-6)
    np.testing.assert_allclose(b1.reshape(2, 2), want_b, atol=1e-6)
    old, _ = rae_advantages(jnp.asarray(b0), jnp.asarray(returns), jnp.asarray(games))  # [N, 2] per episode
    np.testing.assert_allclose(adv.reshape(6, 2), old, atol=1e-6)
    adv_none, b_none = estimate("none", rewards, groups, num_groups, None, jnp.asarray(b0).reshape(-1))
    np.testing.assert_allclose(adv_none.reshape(6, 2), returns)
    np.testing.assert_allclose(b_none, b1)  # the diagnostic baselines
    valid = jnp.repeat(jnp.asarray([True, True, False, True, True, True]), 2)  # episode 2 unfinished
    adv_v, _ = estimate("rae", rewards, groups, num_groups, valid, jnp.asarray(b0).reshape(-1))
    assert (np.asarray(adv_v).reshape(6, 2)[2] == 0).all()
    player = np.asarray([[0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0]])  # [T=2, B=6]
    sample = np.arange(6)[None] * 2 + player  # SpiralAgent's row -> (episode, seat)
    per_turn = np.asarray(adv)[sample]
    np.testing.assert_allclose(per_turn[0, 1], want[1, 1], atol=1e-6)
    np.testing.assert_allclose(per_turn[1, 1], want[1, 0], atol=1e-6)
    # another alpha: registered once under its own name, the same estimator at that rate
    name = spiral_estimator("rae", 0.5)
    assert name == "rae@alpha=0.5" == spiral_estimator("fixed", 0.5) and name in ESTIMATORS
    np.testing.assert_allclose(estimate(name, rewards, groups, num_groups, None, jnp.zeros(4))[1].reshape(2, 2),
                               _sequential_rae(np.zeros((2, 2)), returns, games, alpha=0.5)[1], atol=1e-6)


@pytest.mark.parametrize("name", ["tictactoe", "kuhn_poker"])
def test_host_parser_matches_device_parser(name):
    game = LMGame.make(name, tokenizer=TOK)
    texts = ["\\boxed{4}", "x \\boxed{check} \\boxed{ Bet }", "\\boxed{call", "boxed{fold}", "\\boxed{}",
             "\\boxed{ 8 }", "\\boxed{fold}", "\\boxed{\n9}", "nothing"]
    n = 40
    ids, _ = TOK.pad_batch([TOK.encode(t) for t in texts], n)
    legal = np.zeros((len(texts), game.env.num_actions), bool)
    legal[:, ::2] = True
    dev = jax.jit(jax.vmap(game.text.parse, in_axes=(0, 0, None)), static_argnums=2)(ids, legal, game.offset)
    for i in range(len(texts)):
        assert parse_text(game.text, host_text(ids[i], tokenizer=TOK), legal[i]) == (int(dev[0][i]), int(dev[1][i])), texts[i]


def test_scripted_rollout_device_equals_python_loop(kuhn, scripted_selfplay):
    table = canned_answers(KUHN_ANSWERS, 24, tokenizer=TOK)
    turns, games = scripted_selfplay(table, jax.random.key(3))
    py = python_rollout(None, kuhn, 32, SAMPLER, table, jax.random.key(3), responder=canned_responder)
    np.testing.assert_allclose(games.returns, py["returns"])
    np.testing.assert_array_equal(games.forfeit, py["forfeit"])
    np.testing.assert_array_equal(np.where(turns.info["active"], turns.info["status"], 0), py["status"])
    # zero-sum unless someone forfeited (forfeit: offender -1, opponent 0)
    forfeited = np.asarray(games.forfeit).any(1)
    assert forfeited.any() and (~forfeited).any()
    np.testing.assert_allclose(np.asarray(games.returns)[~forfeited].sum(1), 0.0)
    off = np.asarray(games.forfeit)[forfeited].argmax(1)
    np.testing.assert_allclose(np.asarray(games.returns)[forfeited, :][np.arange(off.size), off], -1.0)
    assert bool(games.finished.all())
    # after a game ends its later turns are inactive (and answer nothing)
    act = np.asarray(turns.info["active"])
    assert (np.diff(act.astype(int), axis=0) <= 0).all() and (np.asarray(turns.lengths)[~act] == 0).all()


def test_forfeit_rules_and_fixed_opponent(kuhn, scripted_selfplay):
    turns, games = scripted_selfplay(canned_answers(("\\boxed{bet}",), 24, slots=len(KUHN_ANSWERS), tokenizer=TOK),
                                     jax.random.key(0))
    # player 0 bets (legal), player 1 "bets" facing a bet (illegal): player 1 forfeits
    np.testing.assert_array_equal(turns.info["status"][:2], [[gtext.OK] * 32, [gtext.ILLEGAL] * 32])
    np.testing.assert_allclose(games.returns, [[0.0, -1.0]] * 32)
    assert np.asarray(games.forfeit)[:, 1].all() and not np.asarray(games.forfeit)[:, 0].any()
    junk = canned_answers(("I check.",), 16, tokenizer=TOK)  # no \\boxed{}: the LM forfeits on its first turn
    roll = game_rollout(None, kuhn, 4, SAMPLER, opponent=O.random_action, responder=canned_responder)
    turns, games = jax.jit(roll)(junk, jax.random.key(1))
    np.testing.assert_array_equal(games.lm_seat, [0, 1, 0, 1])
    r_lm = np.asarray(games.returns)[np.arange(4), np.asarray(games.lm_seat)]
    np.testing.assert_allclose(r_lm, -1.0)
    active = np.asarray(turns.info["active"])
    assert (np.asarray(turns.info["status"])[active] == gtext.NO_ANSWER).all()
    # only LM turns are active
    assert not active[np.asarray(turns.info["player"]) != np.asarray(games.lm_seat)[None]].any()


def test_kuhn_infoset_prompts():
    prompts, legal = infoset_prompts(LMGame.make("kuhn_poker", tokenizer=TOK))
    assert prompts.shape[0] == 12 and int(prompts[0, 0]) == TOK.bos_id
    for i, (card, hist) in enumerate([(c, h) for c in "JQK" for h in range(4)]):
        t = text(prompts[i])
        assert f"Your card: {card}." in t
        assert f"You are Player {1 if hist in (1, 2) else 0}." in t
        assert legal[i].tolist() == ([False, False, True, True] if hist >= 2 else [True, True, False, False])


def test_compact_kuhn_infoset_prompts():
    prompts, _ = infoset_prompts(LMGame.make("kuhn_poker", "compact", tokenizer=TOK))
    verbose, _ = infoset_prompts(LMGame.make("kuhn_poker", tokenizer=TOK))
    assert prompts.shape[1] < verbose.shape[1] // 2
    texts = [text(p) for p in prompts]
    assert len(set(texts)) == 12 and "card K." in texts[-1] and "History: P0 check, P1 bet." in texts[-1]


def test_infoset_probs_count_valid_answers_else_uniform_over_legal():
    """Per information set: each action's share of the OK answers; no OK answer -> uniform over the legal ones."""
    legal = jnp.asarray([[True, True, False, False], [False, False, True, True], [True, True, False, False]])
    ok, bad = gtext.OK, gtext.ILLEGAL
    action = jnp.asarray([1, 1, 0, 3, 2, 2, 3, 3, -1], jnp.int32)  # 3 samples per set, set-major
    status = jnp.asarray([ok, ok, ok, ok, bad, ok, bad, bad, gtext.NO_ANSWER], jnp.int32)
    probs = np.asarray(infoset_probs(action, status, legal, 3))
    np.testing.assert_allclose(probs, [[1 / 3, 2 / 3, 0, 0], [0, 0, 1 / 2, 1 / 2], [1 / 2, 1 / 2, 0, 0]])
    with pytest.raises(ValueError, match="information sets"):
        infoset_prompts(LMGame.make("tictactoe", tokenizer=TOK))  # no GameSpec.infosets


@pytest.mark.parametrize("labels", ["expert", "played"])
def test_sft_targets_are_the_experts_moves_at_random_teacher_positions(labels):
    """Teacher plays uniformly at random (expert_prob 0); with labels="expert" every target is the Kuhn
    Nash move where Nash is deterministic (call with K facing a bet, fold with J), with "played" the
    random move (both answers appear)."""
    cfg = WarmStartConfig(expert_prob=0.0, games_per_game=96, labels=labels)
    data = sft_examples([LMGame.make("kuhn_poker", "compact", tokenizer=TOK)], cfg, jax.random.key(0))
    answers = {"K": set(), "J": set()}
    for tokens, mask in zip(data["tokens"], data["loss_mask"]):
        full = text(tokens)
        start = int(np.argmax(mask)) + 1
        prompt, response = text(tokens[:start]), text(tokens[start:])
        if "Legal: call fold" in " ".join(prompt.split()):
            card = prompt.split("card ")[1][0]
            if card in answers:
                answers[card].add(response.split("\\boxed{")[1].split("}")[0])
        assert full.startswith(prompt) and response.endswith("}<eos>")
    if labels == "expert":
        assert answers == {"K": {"call"}, "J": {"fold"}}
    else:
        assert answers == {"K": {"call", "fold"}, "J": {"call", "fold"}}
    with pytest.raises(ValueError, match="labels"):
        WarmStartConfig(labels="teacher")


def test_config_errors():
    with pytest.raises(ValueError, match="prompt_style"):
        SpiralConfig(prompt_style="tiny")
    with pytest.raises(ValueError, match="games must be among"):
        SpiralConfig(games=("chess",))
    with pytest.raises(ValueError, match="even"):
        SpiralConfig(episodes_per_game=3)
    with pytest.raises(ValueError, match="advantage .*registered advantage estimator"):
        SpiralConfig(advantage="ppo")
    assert SpiralConfig(advantage="grpo").learner_config().advantage == "grpo"  # any registered estimator
    assert SpiralConfig(advantage="fixed").learner_config().advantage == "rae"  # the opponent is the rollout's
    with pytest.raises(ValueError, match="unknown SPIRAL game"):
        LMGame.make("go", tokenizer=TOK)
    # the fixed opponent: random, each game's expert, or a name every game's spec has
    assert [fixed_opponent("expert", g) for g in ("tictactoe", "kuhn_poker")] == ["minimax", "nash"]
    assert fixed_opponent("random", "negotiation") == "random"
    SpiralConfig(games=("tictactoe", "kuhn_poker"), advantage="fixed", opponent="expert")
    SpiralConfig(games=("kuhn_poker",), advantage="fixed", opponent="nash")
    with pytest.raises(ValueError, match=r"opponent 'nash' is not an opponent of \['tictactoe'\]"):
        SpiralConfig(games=("tictactoe", "kuhn_poker"), advantage="fixed", opponent="nash")
    small = LMConfig(vocab_size=96, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=512)
    with pytest.raises(ValueError, match="vocab_size 96 < the tokenizer's 264"):
        spiral_learner(SpiralConfig(games=("kuhn_poker",)), Transformer(small, rngs=nnx.Rngs(0)), tokenizer=TOK)


def _tiny_lm(d_model=32, d_ff=64):
    return Transformer(LMConfig(vocab_size=TOK.vocab_size, d_model=d_model, n_layers=1, n_heads=2, n_kv_heads=1,
                                d_ff=d_ff, max_seq_len=512), rngs=nnx.Rngs(0))


@pytest.mark.slow
def test_lm_train_step_updates_params_and_rae_baseline():
    learner, agent = spiral_learner(SpiralConfig(games=("kuhn_poker",), episodes_per_game=4, max_new_tokens=8),
                                    _tiny_lm(), tokenizer=TOK)
    assert agent == SpiralAgent(learner.graphdef, agent.config, TOK)  # equal agents share the learner's programs
    state = learner.init(jax.random.key(0), agent)
    before = jax.tree.map(np.asarray, state.params)
    state, m = learner.step(state, agent)
    m = jax.device_get(m)
    assert all(np.isfinite(v).all() for v in m.values())
    assert m["grad_norm"] > 0 and int(state.step) == 1
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.allclose(a, b), before, jax.tree.map(np.asarray, state.params)))
    assert any(changed)
    # an untrained LM never answers in format: every game is a forfeit by player 0 (-1), so RAE's
    # baseline for role 0 (group game * 2 + seat = 0) moves from 0 by alpha towards -1 once per episode
    assert m["kuhn_poker/forfeit"] == 1.0 and m["kuhn_poker/format_error"] == 1.0
    np.testing.assert_allclose(state.advantage_carry[0], -(1 - 0.95**4), atol=1e-5)
    np.testing.assert_allclose(m["kuhn_poker/baseline0"], state.advantage_carry[0])
    # mean |A| over the trained turns: each game's one turn (player 0's forfeit) has A = -1 - b before it
    np.testing.assert_allclose(m["mean_abs_adv"], np.mean([1 - (1 - 0.95**k) for k in range(4)]), atol=1e-5)
    assert m["active_turns"] == 4


@pytest.mark.slow
def test_update_rows_gives_the_same_update():
    """SpiralConfig.update_rows (trained turns only, in chunks) = the one pass over every turn slot."""
    out = []
    for rows in (0, 3):
        learner, agent = spiral_learner(SpiralConfig(games=("kuhn_poker", "tictactoe"), episodes_per_game=4,
                                                     max_new_tokens=8, update_rows=rows), _tiny_lm(), tokenizer=TOK)
        state, m = learner.step(learner.init(jax.random.key(0), agent), agent)
        out.append((jax.tree.map(np.asarray, state.params), jax.device_get(m)))
    (p0, m0), (p1, m1) = out
    assert 0 < m0["active_turns"] < 4 * (3 + 9) and m0["grad_norm"] > 0  # some turn slots are padding
    for k in ("loss", "grad_norm", "entropy", "active_turns"):
        np.testing.assert_allclose(m1[k], m0[k], rtol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6), p1, p0)


def test_lm_answers_only_live_turns_of_its_own(kuhn):
    """The LM samples nothing for an ended game or a fixed opponent's move (length 0), and a turn with no game to
    answer does not run the responder at all (any responder: here a scripted one)."""
    graphdef, params = nnx.split(_tiny_lm(16, 32))
    for opponent in (None, O.random_action):
        turns, _ = jax.jit(game_rollout(graphdef, kuhn, 4, SAMPLER, opponent=opponent))(params, jax.random.key(0))
        act, lens = np.asarray(turns.info["active"]), np.asarray(turns.lengths)
        assert act.any() and (~act).any() and (lens[act] > 0).all() and (lens[~act] == 0).all()
    asked = []

    def respond(params, prompts, prompt_lens, key, live):  # records the rows it is asked, answers a forfeit
        jax.debug.callback(lambda rows: asked.append(rows.tolist()), live)
        return canned_responder(params, prompts, prompt_lens, key, live)

    # the LM holds seat 0 in games 0, 2 and seat 1 in games 1, 3 (vs a fixed opponent) and forfeits its first move:
    # turn 0 asks games 0, 2 (they end), turn 1 games 1, 3 (they end), turn 2 (every game over) runs nothing
    forfeit = canned_answers(("pass",), SAMPLER.max_new_tokens, tokenizer=TOK)
    roll = jax.jit(game_rollout(None, kuhn, 4, SAMPLER, opponent=O.random_action, responder=respond))
    turns, games = roll(forfeit, jax.random.key(0))
    jax.effects_barrier()
    assert asked == [[True, False, True, False], [False, True, False, True]], asked
    assert kuhn.max_turns == 3 and np.asarray(turns.lengths)[2].tolist() == [0, 0, 0, 0]
    assert np.asarray(games.forfeit).any(axis=1).all()


def test_the_rules_prefix_is_declared_right_and_prefilled_once_exactly():
    """GameTextEnv declares bos + the rules before the template's first slot as its shared prefix: every game's prompt
    in either style starts with it, and the rollout that prefills it once (the LM responder) draws the same tokens as
    one that prefills whole prompts every turn (a plain-function responder), log-probs within float tolerance."""
    from jaxrl_reason.agents.spiral.rollout import GameTextEnv, game_responder

    for name in GAMES:
        for style in ("verbose", "compact"):
            game = LMGame.make(name, style, tokenizer=TOK)
            k = GameTextEnv(game, 1).shared_prefix

            @jax.jit
            def first_prompts(keys):  # 16 games over their first three random moves: [3 * 16, prompt_len]
                state, ts = jax.vmap(game.env.reset)(keys)
                prompts = []
                for _ in range(3):
                    prompts.append(_render(game, state, ts.current_player))
                    state, ts = jax.vmap(game.env.step)(keys, state, jax.vmap(O.random_action)(keys, state, ts))
                return jnp.concatenate(prompts)

            prompts = np.asarray(first_prompts(jax.random.split(jax.random.key(0), 16)))
            assert 1 < k < game.prompt_len and prompts[0, 0] == TOK.bos_id, (name, style, k)
            assert (prompts[:, :k] == prompts[:1, :k]).all(), (name, style)
    game = LMGame.make("kuhn_poker", "verbose", tokenizer=TOK)
    graphdef, params = nnx.split(_tiny_lm(16, 32))
    respond = game_responder(graphdef, SAMPLER, tokenizer=TOK)
    whole = lambda *a: respond(*a)  # not an LMResponder: no cache kept, every prompt prefilled whole
    for opponent in (None, O.random_action):
        shared, _ = jax.jit(game_rollout(graphdef, game, 8, SAMPLER, opponent=opponent))(params, jax.random.key(1))
        ref, _ = jax.jit(game_rollout(graphdef, game, 8, SAMPLER, opponent=opponent, responder=whole))(
            params, jax.random.key(1))
        assert (np.asarray(ref.prompt_lens) == 0).any() == (opponent is not None)  # a fixed opponent's turns: empty
        np.testing.assert_array_equal(np.asarray(shared.tokens), np.asarray(ref.tokens))
        np.testing.assert_array_equal(np.asarray(shared.lengths), np.asarray(ref.lengths))
        np.testing.assert_allclose(np.asarray(shared.logprobs), np.asarray(ref.logprobs), atol=1e-5)


def test_transfer_eval_through_the_task_vocabulary_view():
    """TaskView passes the sampler's per-layer path through (an unrolled model decodes with
    layer_states; a scanned one only passes layers=None along the same methods)."""
    from jaxrl_reason.agents.spiral.evaluation import transfer_eval

    cfg = LMConfig(vocab_size=TOK.vocab_size, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=64,
                   scan_layers=False)
    out = transfer_eval(Transformer(cfg, rngs=nnx.Rngs(0)), num_problems=4, max_new_tokens=4, tokenizer=TOK,
                        task_tokenizer=CharTokenizer())
    assert set(out) == {"calc", "count"}
    for r in out.values():
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["format_rate"] <= 1.0


@pytest.fixture(scope="module")
def experiment():
    from jaxrl_reason.cli import load_experiment

    return load_experiment("spiral")


def test_experiment_runs_from_a_checkpoint(experiment, bpe, tmp_path):
    """--model: a tiny HF checkpoint (byte-level BPE + random Qwen3ForCausalLM) is evaluated as it came, warm-started
    and trained two self-play steps, with a finite summary; --model wins over the preset's arch. A variant is a
    sub-run: resumed from its first checkpoint, it ends with the uninterrupted run's metrics and summary; the warm
    start and the rows before self-play are restored from the run, not recomputed."""
    import shutil

    from testutil import tiny_hf_checkpoint

    from jaxrl_reason.utils.experiment import RunDir, read_metrics

    ckpt = tiny_hf_checkpoint(tmp_path / "ckpt", bpe)
    cfg = experiment.Config(
        model=str(ckpt), arch="qwen3-0.6b", max_seq_len=256, variants=("rae:kuhn_poker",), steps=2, eval_every=1,
        warm=WarmStartConfig(games_per_game=8, steps=2, batch_size=4),
        spiral=SpiralConfig(episodes_per_game=2, max_new_tokens=8, prompt_style="compact"),
        eval_episodes=2, final_eval_episodes=2, infoset_samples=1, transfer_problems=2, transfer_max_new_tokens=4)
    model, tok, task_tok = load_lm(cfg)
    assert isinstance(tok, HFTokenizer) and tok.eos == "<|im_end|>" and task_tok is None
    assert model.cfg.vocab_size == bpe.vocab_size and model.cfg.max_seq_len == 256  # the checkpoint, not the arch
    run_dir = RunDir.create("spiral", cfg, root=tmp_path / "runs")
    summary = experiment.run(cfg, run_dir)
    run_dir.close()
    nums = {k: v for k, v in summary.items() if k != "results_md"}
    assert {k.split(" | ")[0] for k in nums if " | " in k} == {"checkpoint", "sft (warm start)", "rae:kuhn_poker"}
    assert nums["sft_examples"] > 0 and all(math.isfinite(v) for v in nums.values()), summary

    variant = run_dir.path / "rae_kuhn_poker"
    rows = lambda: [{k: v for k, v in r.items() if not k.startswith("time_")}
                    for r in read_metrics(variant / "metrics.jsonl")]
    done = rows()
    assert [r["step"] for r in done] == [0, 1, 1, 2, 2]  # the evaluation before training, then step + evaluation
    shutil.rmtree(variant / "checkpoints" / "2")  # as if killed between the two checkpoints
    (variant / "row_final.json").unlink()
    saved = {p.name: p.stat().st_mtime_ns for p in run_dir.path.glob("*.json")}
    assert {"warm_start.json", "row_checkpoint.json", "row_start.json"} <= set(saved)
    again = RunDir.create("spiral", cfg, root=tmp_path / "runs", resume=run_dir.path)
    assert experiment.run(cfg, again) == summary  # the warm start restored, the rows before self-play read back
    again.close()
    assert rows() == done
    assert all(p.stat().st_mtime_ns == saved[p.name] for p in run_dir.path.glob("*.json") if p.name in saved
               and p.name != "results.json")


def test_gpu_preset_builds_qwen3_06b_abstractly(experiment):
    """The gpu preset: Qwen3-0.6B's shapes (never materialised) with the byte tokenizer; every variant's learner
    fits its window and the three-game step traces; the cpu preset keeps the tiny LM."""
    from jaxrl_reason.models.lm.hf_import import config_from_hf
    from jaxrl_reason.rl.grpo.recipes import ARCHS

    for name, hf in ARCHS.items():  # every arch constructs (abstractly)
        model = nnx.eval_shape(lambda hf=hf: Transformer(config_from_hf(hf, max_seq_len=64), rngs=nnx.Rngs(0)))
        assert model.cfg.vocab_size >= TOK.vocab_size, name  # any arch holds the byte tokenizer's ids
    gpu, cpu = experiment.PRESETS["gpu"], experiment.PRESETS["cpu"]
    assert gpu.arch == "qwen3-0.6b" and gpu.model is None and cpu.arch is None and cpu.model is None
    toks = {}

    def build():
        lm, toks["lm"], toks["task"] = load_lm(gpu)
        return lm

    model = nnx.eval_shape(build)
    tok, task_tok = toks["lm"], toks["task"]
    assert (model.cfg.d_model, model.cfg.n_layers, model.cfg.max_seq_len, model.cfg.remat) == (1024, 28, gpu.max_seq_len, True)
    assert tok.vocab_size == TOK.vocab_size and isinstance(task_tok, CharTokenizer)
    for variant in gpu.variants:  # (the last: fixed, RAE against each game's random player)
        learner, agent = spiral_learner(gpu.variant_config(variant), model, tokenizer=tok)
    key = jax.random.key(0)
    state = jax.eval_shape(lambda p, r: learner.new_state(p, r, key, agent), learner._params, learner._rest)
    _, metrics = jax.eval_shape(lambda s: learner.step(s, agent), state)
    assert {"grad_norm", "negotiation/forfeit", "tictactoe/win_lm", "tictactoe/baseline1"} <= set(metrics)


@pytest.mark.slow
def test_games_split_over_the_data_mesh_play_the_same_step():
    """mesh="data=8": each device plays its slice of the games (the rollout's batch is split), and the step is
    the one-device step up to float rounding (the multi-process path: a data axis over every process's devices)."""
    model = _tiny_lm()
    runs = {}
    for mesh in (None, "data=8"):
        learner, agent = spiral_learner(SpiralConfig(games=("kuhn_poker",), episodes_per_game=8, max_new_tokens=8,
                                                     mesh=mesh), model, tokenizer=TOK)
        state, metrics = learner.step(learner.init(jax.random.key(0), agent), agent)
        runs[mesh] = jax.device_get(metrics), jax.tree.map(np.asarray, state.params)
        if mesh:
            roll = jax.jit(game_rollout(learner.graphdef, agent.games[0], 8, agent.sampler, mesh=agent.mesh))
            turns, games = roll(learner.policy(state), jax.random.key(1))
            shard = lambda x: x.sharding.shard_shape(x.shape)
            assert shard(games.returns) == (1, 2)  # [8 games, 2 seats]: one game per device
            t, _, tokens = turns.tokens.shape
            assert shard(turns.tokens) == (t, 1, tokens)
    (m1, p1), (m8, p8) = runs[None], runs["data=8"]
    assert sorted(m1) == sorted(m8)
    for k in m1:
        np.testing.assert_allclose(m8[k], m1[k], rtol=1e-4, atol=1e-5, err_msg=k)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), p8, p1)
    with pytest.raises(ValueError, match="SpiralConfig episodes_per_game = 4 is not divisible by the 8 devices"):
        spiral_learner(SpiralConfig(games=("kuhn_poker",), episodes_per_game=4, mesh="data=8"), model, tokenizer=TOK)


def test_arm_differences_and_comparison_figure(experiment, tmp_path):
    """The first variant minus each other, on the final rows: win / forfeit rates with the SE of two independent
    proportions, mean returns with their SEs combined (``--record``'s figures); the figure has a row per game and
    the gradient norm."""
    from jaxrl_reason.agents.spiral.study import arm_differences, compare_plot
    from jaxrl_reason.utils.experiment import RunDir

    start = {"variant": "sft (warm start)", "tictactoe_vs_random/win": 0.5}
    rae = {"variant": "rae", "grad_norm_std": 0.1, "tictactoe_vs_random/win": 0.6, "tictactoe_vs_random/forfeit": 0.1,
           "tictactoe_vs_random/mean_return": 0.3, "tictactoe_vs_random/return_se": 0.03,
           "tictactoe/final_response_length": 9.0}
    none = {**rae, "variant": "none", "tictactoe_vs_random/win": 0.5, "tictactoe_vs_random/mean_return": 0.1,
            "tictactoe_vs_random/return_se": 0.04}
    d = {r["metric"]: r for r in arm_differences([start, rae, none], 100)}
    assert set(d) == {"tictactoe_vs_random/win", "tictactoe_vs_random/forfeit", "tictactoe_vs_random/mean_return"}
    assert d["tictactoe_vs_random/win"]["difference"] == pytest.approx(0.1)
    assert d["tictactoe_vs_random/win"]["se"] == pytest.approx(math.sqrt((0.24 + 0.25) / 100))
    assert d["tictactoe_vs_random/forfeit"]["difference"] == 0 and d["tictactoe_vs_random/forfeit"]["se"] > 0
    assert d["tictactoe_vs_random/mean_return"]["se"] == pytest.approx(0.05)
    assert {r["comparison"] for r in d.values()} == {"rae - none"} and arm_differences([start, rae], 100) == []
    summary = {"final_eval_episodes": 100, "rae | grad_norm_std": 0.1,
               **{f"rae - none | {m}": r["difference"] for m, r in d.items()},
               **{f"rae - none | {m} se": r["se"] for m, r in d.items()}}
    figs = experiment.record(summary)
    assert sorted(f["name"] for f in figs) == sorted(f"rae - none | {m}" for m in d)
    assert all(f["n"] == 100 and f["se"] == d[f["name"].split(" | ")[1]]["se"] for f in figs)

    curve = lambda w: [{"step": 0, "tictactoe/eval_win_vs_random": w, "tictactoe/eval_win_vs_minimax": 0.0},
                       {"step": 1, "grad_norm": 1.0, "tictactoe/response_length": 9.0,
                        "tictactoe/format_error": 0.1, "tictactoe/reward_var": 0.8}]
    run_dir = RunDir.create("spiral", {}, root=tmp_path)
    compare_plot(run_dir, {"rae": curve(0.5), "none": curve(0.4)})
    assert (run_dir.path / "compare.png").stat().st_size > 1000
    run_dir.close()
