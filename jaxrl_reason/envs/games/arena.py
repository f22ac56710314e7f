"""Head-to-head matches between two batched players, fully jitted.

A player is ``fn(key, state, ts) -> action [B]`` on a batch of unbatched-env states (wrap
single-game opponents with ``opponents.batched``). ``play`` runs ``num_games`` games in parallel
with ``players[i]`` in seat ``i`` until every game ends (``env.max_episode_steps`` steps).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def mover_view(ts) -> tuple[jax.Array, jax.Array]:
    """Batched timestep -> the player to move's ``(obs [B, *obs_shape], legal mask [B, A])``.

    A chain of selects over the (few, static) agents: XLA on CPU runs a select much faster than
    a reduction over the agent axis."""
    n = ts.legal_action_mask.shape[1]
    obs, mask = ts.obs[:, 0], ts.legal_action_mask[:, 0]
    for i in range(1, n):
        pick = ts.current_player == i
        obs = jnp.where(pick.reshape((-1,) + (1,) * (obs.ndim - 1)), ts.obs[:, i], obs)
        mask = jnp.where(pick[:, None], ts.legal_action_mask[:, i], mask)
    return obs, mask


def play(env, players, key, num_games: int):
    """Returns ``(returns [num_games, 2] float32, illegal_moves int32)``: total reward per seat."""

    def run(key):
        k_reset, k_play = jax.random.split(key)
        state, ts = jax.vmap(env.reset)(jax.random.split(k_reset, num_games))

        def body(carry, key):
            state, ts, ret = carry
            k0, k1, k_step = jax.random.split(key, 3)
            a0 = players[0](k0, state, ts)
            a1 = players[1](k1, state, ts)
            action = jnp.where(ts.current_player == 0, a0, a1)
            _, mask = mover_view(ts)
            illegal = ~ts.done & ~jnp.take_along_axis(mask, jnp.clip(action, 0)[:, None], 1)[:, 0]
            state, ts = jax.vmap(env.step)(jax.random.split(k_step, num_games), state, action)
            return (state, ts, ret + ts.reward), illegal.sum()

        ret0 = jnp.zeros((num_games, env.num_agents), jnp.float32)
        steps = jax.random.split(k_play, env.max_episode_steps)
        (state, ts, ret), illegal = jax.lax.scan(body, (state, ts, ret0), steps)
        return ret, illegal.sum()

    return run(key)


def summarize(returns: jax.Array, seat: int) -> dict:
    """Win/draw/loss rates and mean return of the player in ``seat``."""
    r = returns[:, seat]
    return {
        "win": float((r > 0).mean()),
        "draw": float((r == 0).mean()),
        "loss": float((r < 0).mean()),
        "mean_return": float(r.mean()),
    }
