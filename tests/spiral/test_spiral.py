"""SPIRAL: vocab adapter, advantages, host/device parse twins, scripted-player rollouts (device
loop == Python-driven loop, forfeits), Kuhn infoset prompts, config errors, one LM train step."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxrl_reason.agents.spiral import vocab as V
from jaxrl_reason.agents.spiral.advantages import episode_advantages, turn_advantages
from jaxrl_reason.agents.spiral.evaluation import kuhn_infoset_prompts
from jaxrl_reason.agents.spiral.rollout import (GameSpec, canned_answers, canned_responder, host_text, make_rollout, parse_text,
                                                python_rollout)
from jaxrl_reason.agents.spiral.trainer import SpiralConfig, SpiralTrainer
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, sft_examples
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.tasks.vocab import VOCAB

SAMPLER = SamplerConfig(max_new_tokens=16)
KUHN_ANSWERS = ("\\boxed{check}", "I bet. \\boxed{ BET }", "\\boxed{call}", "\\boxed{fold}", "no idea")


@pytest.fixture(scope="module")
def kuhn():
    return GameSpec.make("kuhn_poker")


@pytest.fixture(scope="module")
def scripted_selfplay(kuhn):
    """One compiled scripted self-play rollout (the answer table is its ``params``)."""
    return jax.jit(make_rollout(None, kuhn, 32, SAMPLER, responder=canned_responder))


def test_vocab_roundtrip():
    ids = np.asarray(VOCAB.encode("<think>3+4=7</think><answer>7</answer>"))
    lm = V.to_lm(ids)
    assert V.decode(lm) == "<think>3+4=7</think><answer>7</answer>"
    np.testing.assert_array_equal(V.from_lm(lm), ids)
    assert int(V.from_lm(V.encode("{"))[0]) == VOCAB.unk  # bytes the tasks lack -> <unk>
    assert V.VOCAB_SIZE == 264 and V.decode(V.encode("\\boxed{4}")) == "\\boxed{4}"


def _sequential_rae(b, returns, games, alpha=0.05):
    b, adv = np.array(b, np.float64), []
    for r, g in zip(returns, games):
        adv.append(r - b[g])
        b[g] = (1 - alpha) * b[g] + alpha * r
    return np.asarray(adv), b


def test_advantages_modes():
    rng = np.random.default_rng(0)
    returns = rng.choice([-1.0, 0.0, 1.0], size=(6, 2)).astype(np.float32)
    games = np.asarray([0, 1, 0, 0, 1, 1])
    b0 = np.asarray([[0.2, -0.1], [0.0, 0.3]], np.float32)
    adv, b1 = episode_advantages("rae", jnp.asarray(b0), jnp.asarray(returns), jnp.asarray(games))
    want, want_b = _sequential_rae(b0, returns, games)
    np.testing.assert_allclose(adv, want, atol=1e-6)
    np.testing.assert_allclose(b1, want_b, atol=1e-6)
    adv_none, _ = episode_advantages("none", jnp.asarray(b0), jnp.asarray(returns), jnp.asarray(games))
    np.testing.assert_allclose(adv_none, returns)
    player = jnp.asarray([[0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0]])  # [T=2, B=6]
    per_turn = turn_advantages(adv, player)
    np.testing.assert_allclose(per_turn[0, 1], want[1, 1], atol=1e-6)
    np.testing.assert_allclose(per_turn[1, 1], want[1, 0], atol=1e-6)
    with pytest.raises(ValueError, match="advantage mode"):
        episode_advantages("critic", jnp.asarray(b0), jnp.asarray(returns), jnp.asarray(games))


@pytest.mark.parametrize("name", ["tictactoe", "kuhn_poker"])
def test_host_parser_matches_device_parser(name):
    game = GameSpec.make(name)
    texts = ["\\boxed{4}", "x \\boxed{check} \\boxed{ Bet }", "\\boxed{call", "boxed{fold}", "\\boxed{}",
             "\\boxed{ 8 }", "\\boxed{fold}", "\\boxed{\n9}", "nothing"]
    n = 40
    ids = np.stack([np.pad(V.encode(t), (0, n - len(t)), constant_values=V.PAD) for t in texts])
    legal = np.zeros((len(texts), game.env.num_actions), bool)
    legal[:, ::2] = True
    dev = jax.jit(jax.vmap(game.text.parse, in_axes=(0, 0, None)), static_argnums=2)(ids, legal, V.OFFSET)
    for i in range(len(texts)):
        assert parse_text(game.text, host_text(ids[i]), legal[i]) == (int(dev[0][i]), int(dev[1][i])), texts[i]


def test_scripted_rollout_device_equals_python_loop(kuhn, scripted_selfplay):
    table = canned_answers(KUHN_ANSWERS, 24)
    ep = scripted_selfplay(table, jax.random.key(3))
    py = python_rollout(None, kuhn, 32, SAMPLER, table, jax.random.key(3), responder=canned_responder)
    np.testing.assert_allclose(ep.returns, py["returns"])
    np.testing.assert_array_equal(ep.forfeit, py["forfeit"])
    np.testing.assert_array_equal(np.where(ep.turns.active, ep.turns.status, 0), py["status"])
    # zero-sum unless someone forfeited (forfeit: offender -1, opponent 0)
    forfeited = np.asarray(ep.forfeit).any(1)
    assert forfeited.any() and (~forfeited).any()
    np.testing.assert_allclose(np.asarray(ep.returns)[~forfeited].sum(1), 0.0)
    off = np.asarray(ep.forfeit)[forfeited].argmax(1)
    np.testing.assert_allclose(np.asarray(ep.returns)[forfeited, :][np.arange(off.size), off], -1.0)
    assert bool(ep.finished.all())
    # after a game ends its later turns are inactive
    act = np.asarray(ep.turns.active)
    assert (np.diff(act.astype(int), axis=0) <= 0).all()


def test_forfeit_rules_and_fixed_opponent(kuhn, scripted_selfplay):
    ep = scripted_selfplay(canned_answers(("\\boxed{bet}",), 24, slots=len(KUHN_ANSWERS)), jax.random.key(0))
    # player 0 bets (legal), player 1 "bets" facing a bet (illegal): player 1 forfeits
    np.testing.assert_array_equal(ep.turns.status[:2], [[gtext.OK] * 32, [gtext.ILLEGAL] * 32])
    np.testing.assert_allclose(ep.returns, [[0.0, -1.0]] * 32)
    assert np.asarray(ep.forfeit)[:, 1].all() and not np.asarray(ep.forfeit)[:, 0].any()
    junk = canned_answers(("I check.",), 16)  # no \\boxed{}: the LM forfeits on its first turn
    roll = make_rollout(None, kuhn, 4, SAMPLER, opponent=O.random_action, responder=canned_responder)
    ep = jax.jit(roll)(junk, jax.random.key(1))
    np.testing.assert_array_equal(ep.lm_seat, [0, 1, 0, 1])
    r_lm = np.asarray(ep.returns)[np.arange(4), np.asarray(ep.lm_seat)]
    np.testing.assert_allclose(r_lm, -1.0)
    assert (np.asarray(ep.turns.status)[np.asarray(ep.turns.active)] == gtext.NO_ANSWER).all()
    # only LM turns are active
    assert not np.asarray(ep.turns.active)[np.asarray(ep.turns.player) != np.asarray(ep.lm_seat)[None]].any()


def test_kuhn_infoset_prompts():
    prompts, legal = kuhn_infoset_prompts()
    assert prompts.shape[0] == 12 and int(prompts[0, 0]) == V.BOS
    for i, (card, hist) in enumerate([(c, h) for c in "JQK" for h in range(4)]):
        text = V.decode(prompts[i])
        assert f"Your card: {card}." in text
        assert f"You are Player {1 if hist in (1, 2) else 0}." in text
        assert legal[i].tolist() == ([False, False, True, True] if hist >= 2 else [True, True, False, False])


def test_compact_kuhn_infoset_prompts():
    prompts, _ = kuhn_infoset_prompts("compact")
    verbose, _ = kuhn_infoset_prompts()
    assert prompts.shape[1] < verbose.shape[1] // 2
    texts = [V.decode(p) for p in prompts]
    assert len(set(texts)) == 12 and "card K." in texts[-1] and "History: P0 check, P1 bet." in texts[-1]


@pytest.mark.parametrize("labels", ["expert", "played"])
def test_sft_targets_are_the_experts_moves_at_random_teacher_positions(labels):
    """Teacher plays uniformly at random (expert_prob 0); with labels="expert" every target is the Kuhn
    Nash move where Nash is deterministic (call with K facing a bet, fold with J), with "played" the
    random move (both answers appear)."""
    cfg = WarmStartConfig(expert_prob=0.0, games_per_game=96, labels=labels)
    data = sft_examples([GameSpec.make("kuhn_poker", "compact")], cfg, jax.random.key(0))
    answers = {"K": set(), "J": set()}
    for tokens, mask in zip(data["tokens"], data["loss_mask"]):
        text = V.decode(tokens)
        start = int(np.argmax(mask)) + 1
        prompt, response = V.decode(tokens[:start]), V.decode(tokens[start:])
        if "Legal: call fold" in " ".join(prompt.split()):
            card = prompt.split("card ")[1][0]
            if card in answers:
                answers[card].add(response.split("\\boxed{")[1].split("}")[0])
        assert text.startswith(prompt)
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
    with pytest.raises(ValueError, match="advantage"):
        SpiralConfig(advantage="ppo")
    with pytest.raises(ValueError, match="unknown SPIRAL game"):
        GameSpec.make("go")


@pytest.mark.slow
def test_lm_train_step_updates_params_and_rae_baseline():
    cfg = LMConfig(vocab_size=V.VOCAB_SIZE, d_model=32, n_layers=1, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=512)
    model = Transformer(cfg, rngs=nnx.Rngs(0))
    trainer = SpiralTrainer(SpiralConfig(games=("kuhn_poker",), episodes_per_game=4, max_new_tokens=8), model)
    state = trainer.init(jax.random.key(0))
    before = jax.tree.map(np.asarray, state.params)
    state, m = trainer.step(state)
    m = jax.device_get(m)
    assert all(np.isfinite(v).all() for v in m.values())
    assert m["grad_norm"] > 0 and int(state.step) == 1
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: not np.allclose(a, b), before, jax.tree.map(np.asarray, state.params)))
    assert any(changed)
    # an untrained LM never answers in format: every game is a forfeit by player 0 (-1), so RAE's
    # baseline for role 0 moves from 0 by alpha towards -1 once per episode
    assert m["kuhn_poker/forfeit"] == 1.0 and m["kuhn_poker/format_error"] == 1.0
    np.testing.assert_allclose(state.baseline[0, 0], -(1 - 0.95**4), atol=1e-5)


def test_transfer_eval_through_the_task_vocabulary_view():
    """TaskView passes the sampler's per-layer path through (an unrolled model decodes with
    layer_states; a scanned one only passes layers=None along the same methods)."""
    from jaxrl_reason.agents.spiral.evaluation import transfer_eval

    cfg = LMConfig(vocab_size=V.VOCAB_SIZE, d_model=16, n_layers=2, n_heads=2, n_kv_heads=1, d_ff=32, max_seq_len=64,
                   scan_layers=False)
    out = transfer_eval(Transformer(cfg, rngs=nnx.Rngs(0)), num_problems=4, max_new_tokens=4)
    assert set(out) == {"calc", "count"}
    for r in out.values():
        assert 0.0 <= r["accuracy"] <= 1.0 and 0.0 <= r["format_rate"] <= 1.0
