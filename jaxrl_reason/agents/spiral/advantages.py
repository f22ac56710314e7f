"""Per-turn advantages for LM self-play episodes (SPIRAL §RAE and its two baselines).

    adv_episode, baseline = episode_advantages(mode, baseline, returns, game_ids, alpha)
    adv_turn = turn_advantages(adv_episode, player)          # [B, 2] x [T, B] -> [T, B]

Modes:
- ``"rae"``: Role-conditioned Advantage Estimation (``rl/rae.py``): per (game, role) EMA baseline,
  alpha 0.05, read before the update; every turn of a role gets its episode's advantage.
- ``"none"``: plain self-play REINFORCE, ``A = R`` (SPIRAL's "w/o RAE" ablation).
- ``"fixed"``: the fixed-opponent baseline's advantage: the LM plays one seat against a fixed
  opponent and its turns get ``A = R_seat - b[game, seat]`` (the same EMA; the opponent's turns are
  inactive, so their advantage is never used).

A caveat measured with a tiny LM (README, SPIRAL rows): when self-play settles into a forced line
(one seat always wins), the losing role's baseline converges to -1, so its advantage, and the
pressure to escape the line, vanishes under RAE; with ``"none"`` the loser keeps ``A = -1``. In
200 TicTacToe self-play steps the plain run settled into draws while the RAE run collapsed into one
forced-win line.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.rl.rae import DEFAULT_ALPHA, init_baseline, rae_advantages

MODES = ("rae", "none", "fixed")


def episode_advantages(mode: str, baseline: jax.Array, returns: jax.Array, game_ids: jax.Array,
                       alpha: float = DEFAULT_ALPHA, valid: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """returns [N, 2], game_ids [N], baseline [G, 2] -> (advantages [N, 2], new baseline [G, 2]).

    The baseline is tracked in every mode (for ``"none"`` only as a diagnostic)."""
    if mode not in MODES:
        raise ValueError(f"advantage mode must be one of {MODES}, got {mode!r}")
    adv, new_baseline = rae_advantages(baseline, returns, game_ids, valid, alpha)
    if mode == "none":
        adv = jnp.asarray(returns, jnp.float32)
        if valid is not None:
            adv = jnp.where(jnp.asarray(valid)[:, None], adv, 0.0)
    return adv, new_baseline


def turn_advantages(episode_adv: jax.Array, player: jax.Array) -> jax.Array:
    """episode_adv [B, 2], player [T, B] (seat that acted each turn) -> [T, B]."""
    return jnp.take_along_axis(episode_adv[None], player[..., None].clip(0, 1), axis=-1)[..., 0]


__all__ = ["MODES", "episode_advantages", "init_baseline", "turn_advantages"]
