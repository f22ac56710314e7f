"""Liar's Dice (envs/games/liars_dice/): rules on every opening deal, the heuristic, the text interface, and
the game played by the registry's users: a SPIRAL rollout with a scripted LM and an AlphaZero iteration."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games import GAMES, game_text, text
from jaxrl_reason.envs.games.liars_dice import LiarsDice, bid_probs, heuristic_action
from jaxrl_reason.envs.games.opponents import random_action

ENV = LiarsDice(dice=1, faces=3)  # 6 bids + liar


def _play(env, dice, actions):
    s = env.init_state(jnp.asarray(dice))
    rewards = np.zeros(2, np.float32)
    for a in actions:
        out = env.transition(jax.random.key(0), s, a)
        s, rewards = out.state, rewards + np.asarray(out.reward)
    return s, rewards


def test_registered_once_through_its_spec():
    spec = GAMES["liars_dice"]
    assert spec.env is LiarsDice and isinstance(envs.make("liars_dice"), LiarsDice)
    assert tuple(spec.opponents) == ("random", "heuristic") and spec.expert == "heuristic"
    assert isinstance(game_text(envs.make("liars_dice")), type(spec.make_text(envs.make("liars_dice"))))


@pytest.mark.parametrize("d0,d1", list(itertools.product(range(3), repeat=2)))
def test_every_bid_then_liar_settles_by_the_dice(d0, d1):
    """Each deal of 1 die x 3 faces, each single bid then a call: the bidder wins iff the bid holds."""
    for bid in range(ENV.num_bids):
        q, f = bid // 3 + 1, bid % 3
        s, r = _play(ENV, [[d0], [d1]], [bid, ENV.liar])
        holds = (d0 == f) + (d1 == f) >= q
        assert bool(s.terminated) and r.tolist() == ([1.0, -1.0] if holds else [-1.0, 1.0])


def test_raises_must_increase_and_liar_needs_a_bid():
    s = ENV.init_state(jnp.asarray([[0], [1]]))
    mask = np.asarray(ENV.legal_mask(s))
    assert mask[: ENV.num_bids].all() and not mask[ENV.liar]
    s, r = _play(ENV, [[0], [1]], [2, 1])  # a lower bid is illegal: player 1 forfeits
    assert bool(s.terminated) and r.tolist() == [0.0, -1.0]
    s, r = _play(ENV, [[0], [1]], [ENV.num_bids - 1])  # the top bid leaves only liar
    assert np.asarray(ENV.legal_mask(s)).tolist() == [False] * ENV.num_bids + [True] and r.tolist() == [0.0, 0.0]
    s, _ = _play(ENV, [[0], [1]], [ENV.liar])
    assert bool(s.terminated)  # an opening liar is illegal


def test_random_games_are_zero_sum_and_end_in_time():
    env = LiarsDice(dice=2, faces=4)

    def play(key):
        state, ts = env.reset(key)

        def body(carry, k):
            state, ts, ret = carry
            a = random_action(k, state, ts)
            state, ts = env.step(k, state, a)
            return (state, ts, ret + ts.reward), None

        (state, ts, ret), _ = jax.lax.scan(body, (state, ts, jnp.zeros(2)), jax.random.split(key, env.max_episode_steps))
        return ret, ts.terminated

    ret, done = jax.jit(jax.vmap(play))(jax.random.split(jax.random.key(0), 256))
    assert bool(done.all()) and np.allclose(ret.sum(1), 0) and set(np.abs(np.asarray(ret)).ravel()) == {1.0}


def test_heuristic_probabilities_and_moves():
    env = LiarsDice(dice=1, faces=6)
    s = env.init_state(jnp.asarray([[4], [0]]))  # player 0 holds a 5
    p = np.asarray(bid_probs(env, s))
    assert p[4] == 1.0 and np.isclose(p[0], 1 / 6) and np.isclose(p[6 + 4], 1 / 6)
    act = heuristic_action(env)
    _, ts = env.reset(jax.random.key(0))
    assert int(act(None, s, ts)) == 4  # opens with its own face, a sure bid
    s2 = env.transition(None, s, 6 + 2).state  # player 0 bids 2x3 (it holds no 3): player 1 holds a 1
    assert int(act(None, s2, ts)) == env.liar


@pytest.mark.parametrize("style", text.STYLES)
def test_text_hides_the_opponents_dice_and_parses_every_action(style):
    env = LiarsDice(dice=2, faces=3)
    gt = game_text(env, style)
    a = gt.describe(env.init_state(jnp.asarray([[0, 2], [1, 1]])), 0)
    assert a == gt.describe(env.init_state(jnp.asarray([[0, 2], [0, 0]])), 0) and "1 3" in a
    s = env.transition(None, env.init_state(jnp.asarray([[0, 2], [1, 1]])), 4).state  # P0 bids 2x2
    assert "2x2 by you" in gt.describe(s, 0) and "2x2 by opponent" in gt.describe(s, 1)
    legal = env.legal_mask(s)
    for i, name in enumerate(gt.action_strings):
        action, status = gt.parse_str(f"I think \\boxed{{{name.upper()}}}", legal)
        assert action == i and status == ("ok" if legal[i] else "illegal")


def test_spiral_rollout_and_warm_start_examples_run_on_it():
    from jaxrl_reason.agents.spiral.rollout import LMGame, canned_answers, canned_responder, game_rollout
    from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer
    from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, sft_examples
    from jaxrl_reason.models.lm.sampler import SamplerConfig

    tok = spiral_tokenizer()
    game = LMGame.make("liars_dice", "compact", tokenizer=tok)
    answers = canned_answers(("\\boxed{bid 1x1}", "\\boxed{bid 2x6}", "\\boxed{liar}"), 24, tokenizer=tok)
    roll = game_rollout(None, game, 8, SamplerConfig(max_new_tokens=24), responder=canned_responder,
                        opponent=game.spec.opponent("heuristic", game.env))
    _, games = jax.jit(roll)(answers, jax.random.key(0))
    r, forfeit = np.asarray(games.returns), np.asarray(games.forfeit).any(1)
    assert bool(games.finished.all()) and ((r.sum(1) == 0) | forfeit).all()  # a call settles +-1; an illegal raise forfeits
    data = sft_examples([game], WarmStartConfig(games_per_game=4), jax.random.key(1))
    assert data["tokens"].shape[0] >= 8 and data["loss_mask"].any()


def test_alphazero_iteration_runs_on_it():
    from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig

    az = AlphaZero(AlphaZeroConfig(env="liars_dice", num_envs=16, num_steps=3, num_simulations=4, sgd_steps=2,
                                   minibatch_size=16, hidden=(16,)))
    state, metrics = az.iteration(az.init(jax.random.key(0)))
    assert all(np.isfinite(np.asarray(v)).all() for v in jax.device_get(metrics).values())
