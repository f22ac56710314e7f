"""Agents on one interface, batched play, records of our own games, cross-play matrix.

An ``Agent`` occupies one seat. Every turn it sees its seat's observation and
legal mask (and, for rule-based bots, the game state, of which a bot reads only
what its seat may know) and returns ``(carry, action)``; the action counts only
when the seat is to move. Recurrent agents update their carry every turn.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.agents.hanabi.bots import BotParams, bot_action
from jaxrl_reason.envs.hanabi import Hanabi
from jaxrl_reason.models.policies import masked_logits


@dataclasses.dataclass(frozen=True, eq=False)
class Agent:
    """One seat's player: ``init(params, batch) -> carry``; ``act(params, carry, obs [B,F], legal [B,A], state,
    reset [B], key) -> (carry, action [B])``; ``params`` (a pytree, or None) is an argument of the compiled game, so
    agents that share ``init`` and ``act`` (e.g. two policies of one network) share one compiled game per seating."""

    name: str
    init: Callable[[Any, int], Any]
    act: Callable[..., tuple[Any, jax.Array]]
    params: Any = None


def _no_carry(params, batch):
    return jnp.zeros((batch, 0))


@functools.lru_cache(maxsize=64)
def _bot_act(env: Hanabi, bot: BotParams) -> Callable:
    def act(params, carry, obs, legal, state, reset, key):
        return carry, jax.vmap(lambda s: bot_action(env.config, bot, s))(state)

    return act


def bot_agent(env: Hanabi, params: BotParams) -> Agent:
    """A rule-based bot (``bots.BotParams``: its rules are code, one compiled game per bot)."""
    return Agent(params.name, _no_carry, _bot_act(env, params))


@functools.lru_cache(maxsize=64)
def _policy_fns(graphdef, greedy: bool) -> tuple[Callable, Callable]:
    """(init, act) of every policy of the network ``graphdef`` (its weights: the agent's ``params``)."""

    def init(params, batch):
        return nnx.merge(graphdef, params).initial_carry((batch,))

    def act(params, carry, obs, legal, state, reset, key):
        policy = nnx.merge(graphdef, params)
        carry, logits, _ = policy(carry, obs.astype(jnp.float32), reset)
        logits = masked_logits(logits, legal)
        a = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
        return carry, a.astype(jnp.int32)

    return init, act


def policy_agent(name: str, graphdef, params, greedy: bool = True) -> Agent:
    """A flax NNX policy (signature ``carry, logits, value = policy(carry, obs, reset)``)."""
    return Agent(name, *_policy_fns(graphdef, greedy), params)


def _random_act(params, carry, obs, legal, state, reset, key):
    return carry, jax.random.categorical(key, jnp.where(legal, 0.0, -1e9)).astype(jnp.int32)


def random_agent() -> Agent:
    return Agent("random", _no_carry, _random_act)


@functools.lru_cache(maxsize=64)
def _game_runner(env: Hanabi, programs: tuple[tuple[Callable, Callable], ...], g: int):
    """Jitted batched play ``run(key, params) -> (final state, actions [G, T])`` for one seating of programs
    (each seat's ``(init, act)``; cached: cross-play reuses each seating, whatever the agents' parameters)."""
    cfg = env.config

    @jax.jit
    def run(key, params):
        k0, key = jax.random.split(key)
        state, ts = jax.vmap(env.reset)(jax.random.split(k0, g))
        carries = [init(p, g) for (init, _), p in zip(programs, params)]

        def body(carry, k):
            state, ts, carries, first = carry
            ks = jax.random.split(k, len(programs) + 1)
            acts, new = [], []
            for i, (_, act) in enumerate(programs):
                c, a = act(params[i], carries[i], ts.obs[:, i], ts.legal_action_mask[:, i], state, first, ks[i])
                new.append(c)
                acts.append(a)
            acts = jnp.stack(acts, 1)
            action = jnp.take_along_axis(acts, ts.current_player[:, None], 1)[:, 0]
            done = state.terminal
            nstate, nts = jax.vmap(env.step)(jax.random.split(ks[-1], g), state, action)
            return (nstate, nts, new, jnp.zeros_like(first)), jnp.where(done, -1, action)

        init = (state, ts, carries, jnp.ones((g,), bool))
        (state, _, _, _), actions = jax.lax.scan(body, init, jax.random.split(key, cfg.max_turns))
        return state, actions.T

    return run


def play_games(env: Hanabi, seats: list[Agent], key: jax.Array, num_games: int):
    """Play ``num_games`` games, ``seats[i]`` in seat i. Returns a dict of numpy arrays:
    ``scores`` ``[G]``, ``actions`` ``[G, max_turns]`` (-1 after the end) and
    ``decks`` ``[G, D]`` (complete, consistent deck orders for records)."""
    if len(seats) != env.num_agents:
        raise ValueError(f"{len(seats)} agents for a {env.num_agents}-player game")
    run = _game_runner(env, tuple((a.init, a.act) for a in seats), num_games)
    state, actions = run(key, tuple(a.params for a in seats))
    decks = np.asarray(state.deck, np.int32)  # drawn cards in draw order, then the undrawn rest
    return {"scores": np.asarray(state.score), "actions": np.asarray(actions), "decks": decks}


def cross_play(env: Hanabi, agents: list[Agent], key: jax.Array, num_games: int = 1000,
               partners: list[Agent] | None = None) -> dict:
    """Mean score and standard error of every row agent paired with every partner (column).

    Each pairing plays ``num_games`` games (rounded up to a multiple of the seat count),
    rotating which seat the row agent takes; the partner fills the other seats.
    ``partners`` defaults to ``agents`` (a square matrix). Returns ``{"names",
    "partners", "mean" [M, P], "sem" [M, P], "games"}``.
    """
    partners = agents if partners is None else partners
    n, m, q = env.num_agents, len(agents), len(partners)
    mean, sem = np.zeros((m, q)), np.zeros((m, q))
    per_seat = math.ceil(num_games / n)
    for i, a in enumerate(agents):
        for j, b in enumerate(partners):
            scores = []
            for seat in range(n):
                seats = [a if s == seat else b for s in range(n)]
                key, k = jax.random.split(key)
                scores.append(play_games(env, seats, k, per_seat)["scores"])
            s = np.concatenate(scores).astype(np.float64)
            mean[i, j], sem[i, j] = s.mean(), s.std(ddof=1) / np.sqrt(len(s))
    return {"names": [a.name for a in agents], "partners": [b.name for b in partners],
            "mean": mean, "sem": sem, "games": per_seat * n}


def plot_matrix(result: dict, path, title: str = "cross-play mean score"):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names, cols, mean, sem = result["names"], result["partners"], result["mean"], result["sem"]
    fig, ax = plt.subplots(figsize=(1.4 * len(cols) + 3, 0.9 * len(names) + 2))
    im = ax.imshow(mean, cmap="viridis", vmin=0, vmax=25)
    ax.set_xticks(range(len(cols)), cols, rotation=45, ha="right")
    ax.set_yticks(range(len(names)), names)
    ax.set_xlabel("partner")
    for i in range(len(names)):
        for j in range(len(cols)):
            ax.text(j, i, f"{mean[i, j]:.1f}\n±{sem[i, j]:.2f}", ha="center", va="center", fontsize=8,
                    color="white" if mean[i, j] < 15 else "black")
    ax.set_title(f"{title} ({result['games']} games per pair)")
    fig.colorbar(im, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
