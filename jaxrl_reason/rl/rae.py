"""Role-conditioned Advantage Estimation (SPIRAL, arXiv 2506.24119).

One exponential-moving-average baseline per (game, role): for each finished episode, in order,
the advantage of role ``r`` is read *before* the update,

    A = R_r - b[g, r],   then   b[g, r] <- (1 - alpha) b[g, r] + alpha R_r,

and every turn that role played in the episode gets that same advantage. The sequential EMA over
a batch is computed exactly with ``lax.associative_scan`` over affine maps (no Python loop), so
the result equals processing the episodes one by one. Pure functions, no state besides the
``[num_games, num_roles]`` baseline array the caller threads through.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

DEFAULT_ALPHA = 0.05


def init_baseline(num_games: int = 1, num_roles: int = 2) -> jax.Array:
    """Zero baselines ``[num_games, num_roles]`` float32."""
    return jnp.zeros((num_games, num_roles), jnp.float32)


def rae_advantages(
    baseline: jax.Array,
    returns: jax.Array,
    game_ids: jax.Array | None = None,
    valid: jax.Array | None = None,
    alpha: float = DEFAULT_ALPHA,
) -> tuple[jax.Array, jax.Array]:
    """Advantages of a batch of episodes and the updated baseline.

    Args:
      baseline: ``[G, R]`` EMA baselines per (game, role).
      returns: ``[N, R]`` episode return of each role, episodes in processing order.
      game_ids: ``[N]`` int game of each episode (default all 0).
      valid: ``[N]`` bool; invalid rows get advantage 0 and do not update the baseline.
      alpha: EMA rate (SPIRAL: 0.05).
    Returns:
      ``(advantages [N, R], new_baseline [G, R])``; ``advantages[n]`` uses the baseline
      after episodes ``0..n-1`` and before episode ``n``.
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha}")
    baseline = jnp.asarray(baseline, jnp.float32)
    returns = jnp.asarray(returns, jnp.float32)
    n, r = returns.shape
    if baseline.ndim != 2 or baseline.shape[1] != r:
        raise ValueError(f"baseline must be [num_games, {r}], got {baseline.shape}")
    g = baseline.shape[0]
    game_ids = jnp.zeros((n,), jnp.int32) if game_ids is None else jnp.asarray(game_ids, jnp.int32)
    valid = jnp.ones((n,), bool) if valid is None else jnp.asarray(valid, bool)
    hit = (jnp.arange(g)[None, :] == game_ids[:, None]) & valid[:, None]  # [N, G]
    # episode n maps b -> a_n * b + c_n elementwise on [G, R]
    a = jnp.where(hit[:, :, None], 1.0 - alpha, 1.0) * jnp.ones((n, g, r))
    c = jnp.where(hit[:, :, None], alpha * returns[:, None, :], 0.0)

    def compose(first, second):  # apply ``first`` then ``second``
        a1, c1 = first
        a2, c2 = second
        return a1 * a2, a2 * c1 + c2

    a_cum, c_cum = jax.lax.associative_scan(compose, (a, c))
    after = a_cum * baseline[None] + c_cum  # baseline after episode n, [N, G, R]
    before = jnp.concatenate([baseline[None], after[:-1]], axis=0)
    b_read = jnp.take_along_axis(before, game_ids[:, None, None], axis=1)[:, 0]  # [N, R]
    adv = jnp.where(valid[:, None], returns - b_read, 0.0)
    new_baseline = after[-1] if n else baseline
    return adv, new_baseline
