"""The text interfaces of the games (``envs.games.text``; each game's ``GameText`` through ``game_text``, which
reads the registry): rendering in jit, round trip of every action, the forfeit rule, private information, styles."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxrl_reason import envs
from jaxrl_reason.envs.games import GAMES as REGISTERED
from jaxrl_reason.envs.games import game_text, text

GAMES = ["tictactoe", "kuhn_poker", "negotiation"]


@pytest.fixture(scope="module", params=[(g, s) for g in GAMES for s in text.STYLES], ids="-".join)
def game(request):
    name, style = request.param
    env = envs.make(name)
    gt = game_text(env, style)
    state, ts = env.reset(jax.random.key(7))
    return env, gt, state, ts


def test_render_in_jit_fixed_length_and_offset(game):
    env, gt, state, ts = game
    render = jax.jit(gt.render, static_argnums=2)
    ids = render(state, ts.current_player, 3)
    assert ids.shape == (gt.prompt_length,) and ids.dtype == jnp.int32
    assert int(ids.min()) >= 3 and int(ids.max()) < 256 + 3
    assert text.to_str(ids, 3) == gt.describe(state, ts.current_player)
    batched = jax.vmap(gt.render, (0, None))(jax.tree.map(lambda x: jnp.stack([x, x]), state), 0)
    assert batched.shape == (2, gt.prompt_length)


def test_text_round_trip_every_legal_action(game):
    env, gt, state, ts = game
    parse = jax.jit(gt.parse, static_argnums=2)
    mask = ts.legal_action_mask[ts.current_player]
    for a in range(env.num_actions):
        ids = jnp.asarray(np.concatenate([text.encode("Let me think. "), gt.answer_ids(a)]))
        action, status = parse(ids, mask, 0)
        assert int(action) == a
        assert int(status) == (text.OK if bool(mask[a]) else text.ILLEGAL)
    # offset ids parse the same
    action, status = parse(jnp.asarray(gt.answer_ids(0, offset=5)), None, 5)
    assert int(action) == 0 and int(status) == text.OK


def test_parser_forfeit_rule(game):
    env, gt, state, ts = game
    a, s = gt.parse_str("I refuse to answer")
    assert (a, s) == (text.INVALID_ACTION, "no_answer")
    assert gt.parse_str("\\boxed{nonsense}") == (text.INVALID_ACTION, "unknown")
    assert gt.parse_str("\\boxed{" + gt.action_strings[0]) == (text.INVALID_ACTION, "no_answer")
    # last boxed wins, case and spaces ignored
    assert gt.parse_str("\\boxed{zzz} no, \\boxed{ " + gt.action_strings[1].upper() + " }")[0] == 1
    # an invalid answer forfeits: -penalty for the mover, 0 for the opponent, game over
    _, out = env.step(jax.random.key(0), state, jnp.int32(text.INVALID_ACTION))
    expected = np.zeros(2)
    expected[int(ts.current_player)] = -env.illegal_action_penalty
    assert bool(out.terminated)
    np.testing.assert_array_equal(out.reward, expected)


@pytest.mark.parametrize("style", text.STYLES)
def test_prompts_hide_private_information(style):
    env = envs.make("kuhn_poker")
    gt = game_text(env, style)
    assert gt.describe(env.init_state((0, 1)), 0) == gt.describe(env.init_state((0, 2)), 0)
    assert gt.describe(env.init_state((0, 1)), 0) != gt.describe(env.init_state((1, 2)), 0)
    neg = envs.make("negotiation")
    gn = game_text(neg, style)
    a = gn.describe(neg.init_state(jnp.asarray([[1, 6], [6, 1]])), 0)
    assert a == gn.describe(neg.init_state(jnp.asarray([[1, 6], [4, 2]])), 0)
    assert "wood 1, gold 6" in a
    with pytest.raises(ValueError, match="no text interface"):
        game_text(envs.make("catch"), style)


def test_compact_style_is_shorter_and_keeps_kuhn_infosets_distinct():
    env = envs.make("kuhn_poker")
    verbose, compact = (game_text(env, s) for s in ("verbose", "compact"))
    for g in GAMES:
        e = envs.make(g)
        assert 2 * game_text(e, "compact").prompt_length < game_text(e, "verbose").prompt_length
    seen = set()
    for card in range(3):
        for hist in range(4):  # the 4 decision points: start, after check, after bet, after check-bet
            mover = int(hist in (1, 2))
            deal = (card, (card + 1) % 3) if mover == 0 else ((card + 1) % 3, card)
            state = env.init_state(deal).replace(hist=jnp.int32(hist))
            seen.add(compact.describe(state, mover))
            assert verbose.describe(state, mover) != compact.describe(state, mover)
    assert len(seen) == 12
    with pytest.raises(ValueError, match="prompt style"):
        game_text(env, "terse")


def test_game_text_reads_the_registry_and_unwraps_wrappers():
    for name, spec in REGISTERED.items():
        gt = game_text(envs.AutoReset(envs.make(name)), "compact")
        assert type(gt) is type(spec.make_text(envs.make(name), "compact")), name
        assert isinstance(gt, text.GameText) and isinstance(gt.env, spec.env)
