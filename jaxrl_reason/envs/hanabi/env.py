"""``Hanabi``: the thin Environment-protocol wrapper over ``game.py`` and ``encoding.py``.

A ``SplitEnvironment``: ``transition`` runs the rules, ``observe`` encodes the
observation, so ``AutoReset`` encodes once per step. Turn-based: ``action`` is
the current player's int32 move. The reward is shared (every player gets the
change of score). An illegal move (including the no-op by the player to move)
ends the episode with ``-illegal_action_penalty`` to the offender and leaves
the game state untouched otherwise; stepping a finished game is a no-op that
reports ``terminated`` again. ``info["score"]`` is the current score.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jaxrl_reason.envs.core import Observation, SplitEnvironment, Transition, illegal_action_outcome
from jaxrl_reason.envs.hanabi import encoding, game
from jaxrl_reason.envs.hanabi.game import GameConfig, GameState


class Hanabi(SplitEnvironment):
    turn_based = True
    illegal_action_rule = "penalty"
    conformance_variants = ({"num_players": 2}, {"num_players": 5, "obs_mode": "compact"})

    def __init__(self, num_players: int = 2, obs_mode: str = "canonical", hand_size: int | None = None,
                 num_colours: int = 5, max_info_tokens: int = 8, max_life_tokens: int = 3,
                 illegal_action_penalty: float = 1.0):
        """Defaults are the full game; e.g. ``num_colours=1, hand_size=2, max_info_tokens=3,
        max_life_tokens=1`` is HLE's "Hanabi-Very-Small" (used by the fast learning test)."""
        if obs_mode not in encoding.OBS_MODES:
            raise ValueError(f"unknown obs_mode {obs_mode!r}; choose one of {encoding.OBS_MODES}")
        self.config = GameConfig(num_players=num_players, hand_size=hand_size, num_colours=num_colours,
                                 max_info_tokens=max_info_tokens, max_life_tokens=max_life_tokens)
        self.obs_mode = obs_mode
        self.num_agents = num_players
        self.num_actions = self.config.num_actions
        self.obs_shape = (encoding.obs_size(self.config, obs_mode),)
        self.max_episode_steps = self.config.max_turns
        self.illegal_action_penalty = float(illegal_action_penalty)

    @property
    def name(self) -> str:
        return f"Hanabi{self.num_agents}p"

    # -- SplitEnvironment pieces ---------------------------------------------
    def reset_state(self, key) -> GameState:
        return game.init_random(self.config, key)

    def reset_info(self, state: GameState) -> dict:
        return {"score": state.score}

    def observe(self, state: GameState) -> Observation:
        # Materialise the (small) state before encoding: otherwise XLA fuses the
        # whole transition into every one of the ~1300 observation elements.
        state = jax.lax.optimization_barrier(state)
        return Observation(encoding.encode(self.config, state, self.obs_mode),
                           game.legal_moves(self.config, state), state.cur_player)

    def transition(self, key, state: GameState, action) -> Transition:
        action = jnp.asarray(action, jnp.int32)
        is_legal = game.is_legal(self.config, state, action)
        new, reward = game.step(self.config, state, action, key)
        frozen = state.terminal | ~is_legal
        new = jax.tree.map(lambda a, b: jnp.where(frozen, a, b), state.replace(terminal=jnp.bool_(True)), new)
        shared = jnp.full((self.num_agents,), reward, jnp.float32)
        penalty = illegal_action_outcome(self.num_agents, state.cur_player, self.illegal_action_penalty)
        reward = jnp.where(state.terminal, 0.0, jnp.where(is_legal, shared, penalty))
        return Transition(new, reward, new.terminal, jnp.bool_(False), {"score": new.score})

    def reset_from_deck(self, deck):
        """Start from a fixed deck order (``[D]`` card ids, top first)."""
        state = game.init_from_deck(self.config, deck)
        zeros = jnp.zeros((self.num_agents,), jnp.float32)
        return state, self.timestep(state, zeros, False, False, self.reset_info(state))
