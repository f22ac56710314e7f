"""Catch (bsuite-style): the small single-agent task that proves the protocol.

A ball starts in a random column of the top row and falls one row per step; the
agent moves a paddle on the bottom row (0 = left, 1 = stay, 2 = right, clamped at
the walls). When the ball reaches the bottom row the episode terminates with
reward +1 if the paddle is under it, else -1. Every action is always legal;
out-of-range action ids are clipped to [0, 2] (illegal_action_rule = "none").
Observation: ``[1, rows * cols]`` float32 with 1 at the ball and at the paddle.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jaxrl_reason.envs.core import Observation, SplitEnvironment, Transition


@struct.dataclass
class CatchState:
    ball_row: jax.Array
    ball_col: jax.Array
    paddle_col: jax.Array


class Catch(SplitEnvironment):
    turn_based = True  # one agent: it is always player 0's turn
    illegal_action_rule = "none"

    def __init__(self, rows: int = 10, columns: int = 5):
        if rows < 2 or columns < 1:
            raise ValueError(f"Catch needs rows >= 2 and columns >= 1, got rows={rows}, columns={columns}")
        self.rows, self.columns = rows, columns
        self.num_agents = 1
        self.num_actions = 3
        self.obs_shape = (rows * columns,)
        self.max_episode_steps = rows - 1

    def reset_state(self, key) -> CatchState:
        return CatchState(
            ball_row=jnp.int32(0),
            ball_col=jax.random.randint(key, (), 0, self.columns, jnp.int32),
            paddle_col=jnp.int32(self.columns // 2),
        )

    def transition(self, key, state: CatchState, action) -> Transition:
        move = jnp.clip(jnp.asarray(action, jnp.int32), 0, 2) - 1
        s = CatchState(
            ball_row=state.ball_row + 1,
            ball_col=state.ball_col,
            paddle_col=jnp.clip(state.paddle_col + move, 0, self.columns - 1),
        )
        terminated = s.ball_row == self.rows - 1
        reward = jnp.where(terminated, jnp.where(s.paddle_col == s.ball_col, 1.0, -1.0), 0.0)
        return Transition(s, jnp.full((1,), reward, jnp.float32), terminated, jnp.bool_(False), {})

    def observe(self, s: CatchState) -> Observation:
        board = jnp.zeros((self.rows, self.columns), jnp.float32)
        board = board.at[s.ball_row, s.ball_col].set(1.0)
        board = board.at[self.rows - 1, s.paddle_col].set(1.0)
        return Observation(board.reshape(1, -1), jnp.ones((1, 3), bool), jnp.int32(0))
