"""Kuhn Poker's Nash player (the warm-start expert and the ``nash`` opponent) and exact evaluation.

A policy is a ``[3 cards, 4 decision histories]`` table of the probability of the aggressive action
(bet at ``""``/``"p"``, call at ``"b"``/``"pb"``); histories fix the player. ``value`` is player 0's
expected payoff, ``best_response_values`` the values of exact best responses (enumerating the 6 deals),
``exploitability = (BR_0 + BR_1) / 2`` (NashConv / 2; 0 exactly at a Nash equilibrium),
``nash_policy(alpha)`` the known Nash family (game value -1/18). ``average_*`` keep the time-averaged
(sequence-form) policy of a run of self-play iterates. All are jnp functions, so they run inside
training loops. ``policy_action(pi)`` plays a table; ``nash_action`` plays Nash alpha = ``TEACHER_ALPHA``.

The 12 information sets (card-major: J/Q/K x histories ``"", p, b, pb``): ``infosets(env)`` as states
(for players that read states, e.g. an LM's prompts), ``infoset_obs()`` as observations (for networks);
``table_from_probs`` turns action probabilities there into a table, ``policy_table(policy_fn)`` reads an
observation-level policy's table, ``policy_metrics(policy_fn)`` its exact exploitability (the game's
``GameSpec.policy_metrics``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.envs.games.kuhn_poker.rules import _HIST_OBS, BET, CALL, KuhnPoker

TEACHER_ALPHA = 1.0 / 6.0  # the Nash member SPIRAL's teacher and "nash" opponent play


def _sign(a, b):
    return jnp.sign(a - b).astype(jnp.float32)


def _pairs():
    """Card of the player in question ``[3, 1]`` and opponent card ``[3, 3]`` with weights."""
    c = jnp.arange(3)
    w = (c[:, None] != c[None, :]) * 0.5  # P(opponent card | own card)
    return c, w


def best_response_values(pi: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Exact best-response values: ``(value of a BR player 0 vs pi, value of a BR player 1 vs pi)``.

    ``pi``: ``[3, 4]`` probability of bet/call per (card, decision history)."""
    pi = jnp.asarray(pi, jnp.float32)
    c, w = _pairs()
    s = _sign(c[:, None], c[None, :])  # [own, opp] showdown sign for the first index
    # player 0 (rows: c0, cols: c1); player 1 acts with pi[c1, 1] after a check, pi[c1, 2] after a bet
    bet1_after_check, call1 = pi[:, 1][None, :], pi[:, 2][None, :]
    call_pb = (w * bet1_after_check * 2 * s).sum(1)
    fold_pb = (w * bet1_after_check * -1.0).sum(1)
    check = (w * (1 - bet1_after_check) * s).sum(1) + jnp.maximum(call_pb, fold_pb)
    bet = (w * ((1 - call1) * 1.0 + call1 * 2 * s)).sum(1)
    br0 = jnp.maximum(check, bet).mean()
    # player 1 (rows: c1, cols: c0)
    bet0, call0_pb = pi[:, 0][None, :], pi[:, 3][None, :]
    call_b = (w * bet0 * 2 * s).sum(1)
    fold_b = (w * bet0 * -1.0).sum(1)
    check_p = (w * (1 - bet0) * s).sum(1)
    bet_p = (w * (1 - bet0) * (call0_pb * 2 * s + (1 - call0_pb) * 1.0)).sum(1)
    br1 = (jnp.maximum(call_b, fold_b) + jnp.maximum(check_p, bet_p)).mean()
    return br0, br1


def value(pi0: jax.Array, pi1: jax.Array | None = None) -> jax.Array:
    """Player 0's expected payoff when player 0 uses ``pi0`` and player 1 ``pi1`` (default ``pi0``)."""
    pi0 = jnp.asarray(pi0, jnp.float32)
    pi1 = pi0 if pi1 is None else jnp.asarray(pi1, jnp.float32)
    c, w = _pairs()
    s = _sign(c[:, None], c[None, :])
    b0, call0 = pi0[:, 0][:, None], pi0[:, 3][:, None]
    b1, call1 = pi1[:, 1][None, :], pi1[:, 2][None, :]
    v_check = (1 - b1) * s + b1 * (call0 * 2 * s - (1 - call0))
    v_bet = (1 - call1) + call1 * 2 * s
    return (w * (b0 * v_bet + (1 - b0) * v_check)).sum(1).mean()


def exploitability(pi: jax.Array) -> jax.Array:
    """``(BR_0(pi) + BR_1(pi)) / 2`` in chips per game; 0 at a Nash equilibrium."""
    br0, br1 = best_response_values(pi)
    return 0.5 * (br0 + br1)


def nash_policy(alpha: float = 0.0) -> jax.Array:
    """Kuhn's Nash family, ``alpha`` in ``[0, 1/3]``: ``[3, 4]`` bet/call probabilities."""
    if not 0.0 <= alpha <= 1.0 / 3.0:
        raise ValueError(f"alpha must be in [0, 1/3], got {alpha}")
    return jnp.asarray(
        [
            # "",       "p" (P1),  "b" (P1),  "pb" (P0)
            [alpha, 1.0 / 3.0, 0.0, 0.0],  # J
            [0.0, 0.0, 1.0 / 3.0, alpha + 1.0 / 3.0],  # Q
            [3 * alpha, 1.0, 1.0, 1.0],  # K
        ],
        jnp.float32,
    )


def policy_action(pi: jax.Array):
    """A Kuhn Poker player ``act(key, state, ts)`` from a ``[3, 4]`` bet/call table."""

    def act(key, state, ts):
        h = jnp.minimum(state.hist, 3)
        card = jnp.where(state.current_player == 0, state.cards[0], state.cards[1])
        aggressive = jax.random.uniform(key) < pi[card, h]
        facing = h >= 2
        return jnp.where(facing, jnp.where(aggressive, 2, 3), jnp.where(aggressive, 1, 0)).astype(jnp.int32)

    return act


def nash_action(env=None):
    """The Nash player (alpha = ``TEACHER_ALPHA``) as ``act(key, state, ts)`` (``env`` unused)."""
    del env
    return policy_action(nash_policy(TEACHER_ALPHA))


def own_reach(pi: jax.Array) -> jax.Array:
    """``[3, 4]`` probability that the acting player's *own* earlier actions lead to each
    information set under ``pi`` (1 everywhere except player 0 at ``"pb"``: ``1 - P(bet)``)."""
    pi = jnp.asarray(pi, jnp.float32)
    return jnp.ones_like(pi).at[:, 3].set(1.0 - pi[:, 0])


def average_init() -> tuple[jax.Array, jax.Array]:
    """Empty accumulator ``(numerator [3, 4], denominator [3, 4])`` of ``average_update``."""
    return jnp.zeros((3, 4), jnp.float32), jnp.zeros((3, 4), jnp.float32)


def average_update(acc, pi: jax.Array, weight=1.0):
    """Add policy ``pi`` (weight ``weight``) to the time-averaged policy.

    The average of mixed strategies is taken in sequence form: at each information set the
    behaviour probabilities are weighted by the player's own reach probability, so the
    resulting behaviour policy plays exactly the average of the iterates' strategies
    (the quantity fictitious play and no-regret self-play converge in)."""
    num, den = acc
    w = weight * own_reach(pi)
    return num + w * jnp.asarray(pi, jnp.float32), den + w


def average_policy(acc) -> jax.Array:
    """``[3, 4]`` time-averaged policy of an accumulator (0.5 where nothing was added)."""
    num, den = acc
    return jnp.where(den > 0, num / jnp.maximum(den, 1e-30), 0.5)


def average_exploitability_curve(tables: jax.Array) -> jax.Array:
    """``[U]`` exploitability of the running time-averaged policy of ``tables`` ``[U, 3, 4]``
    (entry ``u`` averages iterates ``0..u``)."""

    def body(acc, pi):
        acc = average_update(acc, pi)
        return acc, exploitability(average_policy(acc))

    return jax.lax.scan(body, average_init(), jnp.asarray(tables, jnp.float32))[1]


def uniform_policy() -> jax.Array:
    return jnp.full((3, 4), 0.5, jnp.float32)


def value_vs_uniform(pi: jax.Array) -> jax.Array:
    """Expected payoff of ``pi`` against a uniformly random player, both seats equally often
    (chips per game; a Nash policy gets 5/36: +1/9 as player 0, +1/6 as player 1)."""
    u = uniform_policy()
    return (value(pi, u) - value(u, pi)) / 2


def value_vs_nash_p0(pi: jax.Array) -> jax.Array:
    """Player 0's expected payoff with ``pi`` against the Nash player (alpha = ``TEACHER_ALPHA``)."""
    return value(pi, nash_policy(TEACHER_ALPHA))


# ----------------------------------------------------------------------------- information sets
def infosets(env: KuhnPoker):
    """The 12 information sets (card-major: J/Q/K x histories ``"", p, b, pb``), one state each (the
    opponent's card, never shown to the mover, is the next one): ``(states [12], player to act [12],
    legal [12, 4])``."""
    cards, hists = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    cards, hists = cards.reshape(-1), hists.reshape(-1)
    mover = ((hists == 1) | (hists == 2)).astype(np.int32)
    other = (cards + 1) % 3  # never shown to the mover
    deal = np.where(mover[:, None] == 0, np.stack([cards, other], 1), np.stack([other, cards], 1))
    states = jax.vmap(env.init_state)(jnp.asarray(deal))
    states = states.replace(hist=jnp.asarray(hists, jnp.int32))
    facing = hists >= 2
    legal = np.where(facing[:, None], [False, False, True, True], [True, True, False, False])
    return states, jnp.asarray(mover), jnp.asarray(legal)


def infoset_obs() -> tuple[jax.Array, jax.Array]:
    """Observation and legal mask of the acting player at each information set:
    ``([3, 4, 4] obs, [3, 4, 4] mask)`` indexed ``[card, history, ...]``."""
    card = (jnp.arange(3, dtype=jnp.float32) - 1)[:, None, None] * jnp.ones((3, 4, 1))
    hist = jnp.broadcast_to(jnp.asarray(_HIST_OBS[:4]), (3, 4, 3))
    facing = jnp.asarray([False, False, True, True])[None, :, None]
    mask = jnp.where(facing, jnp.asarray([False, False, True, True]), jnp.asarray([True, True, False, False]))
    return jnp.concatenate([card, hist], -1), jnp.broadcast_to(mask, (3, 4, 4))


def table_from_probs(probs: jax.Array) -> jax.Array:
    """Action probabilities at the information sets (``[12, 4]`` in ``infosets`` order, or ``[3, 4, 4]``)
    -> ``[3, 4]`` policy table."""
    probs = jnp.asarray(probs).reshape(3, 4, -1)
    return jnp.concatenate([probs[:, :2, BET], probs[:, 2:, CALL]], axis=1)


def policy_table(policy_fn) -> jax.Array:
    """``[3, 4]`` bet/call probabilities of ``policy_fn(obs, mask) -> probs`` at the 12 infosets."""
    obs, mask = infoset_obs()
    probs = policy_fn(obs.reshape(12, -1), mask.reshape(12, -1)).reshape(3, 4, -1)
    return table_from_probs(probs)


def policy_metrics(policy_fn) -> dict:
    """Exact exploitability of an observation-level policy ``policy_fn(obs, mask) -> probs`` and its
    ``[3, 4]`` table (``policy_table``; feed the stacked tables to ``average_exploitability_curve`` for
    the time-averaged policy). Self-play's ``metrics_fn`` (``GameSpec.policy_metrics``)."""
    table = policy_table(policy_fn)
    return {"exploitability": exploitability(table), "policy_table": table}


def _at_infosets(fn):
    def evaluate(probs):
        return fn(table_from_probs(probs))

    evaluate.__doc__ = f"``{fn.__name__}`` of the table of action probabilities ``[12, 4]`` at ``infosets``."
    return evaluate


#: exact evaluations of action probabilities ``[12, 4]`` at ``infosets`` (``GameSpec.evaluations``)
EVALUATIONS = {"exploitability": _at_infosets(exploitability), "value_vs_random": _at_infosets(value_vs_uniform),
               "value_vs_nash_p0": _at_infosets(value_vs_nash_p0)}
