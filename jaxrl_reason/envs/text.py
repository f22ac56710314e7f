"""The text-environment protocol: episodes an LM plays turn by turn (the ``envs.core`` conventions, in text: key
first, a pure ``step``, the episode's state a pytree). The rollouts that drive it are ``rl.lm.multiturn``'s.

    class MyEnv(TextEnv):                        # pure JAX: runs inside the jitted rollout
        max_turns, prompt_tokens, obs_tokens = 4, 32, 8
        def reset(self, key, data) -> (state, TextStep)              # obs [B, prompt_tokens]: the prompt
        def step(self, key, state, turn, turn_len) -> (state, TextStep)   # turn [B, N]: the model's ids
    class MyTool(HostTextEnv):                   # Python (a tool, a checker): runs on host threads
        def reset(self, row) -> (episode, prompt_ids)
        def step(self, episode, turn_ids) -> (episode, obs_ids, reward, done)

``TextStep``: obs [B, O] int32 right-padded with obs_len [B], reward [B] float32, done [B] bool, info {name: [B, ...]},
max_new [B] int32 or None: the token limit of the model's next turn (stop token included; None: the responder's N).
An env that sets ``max_new`` sets it at reset and at every step; the rollouts hand it to the responder, which samples
at most min(max_new, N) tokens for the row: turns of one episode may have different budgets in one compiled scan.

Static attributes: T = ``max_turns`` (the model's turns at most), P = ``prompt_tokens`` (the first observation's
width), O = ``obs_tokens`` (every later observation's width); ``chain_keys`` and ``split_key``: how a ``TextEnv``'s
turn keys are made (``rl.lm.multiturn``'s docstring).

``FixedTextEnv(prompts, prompt_lens, obs, max_turns)``: a ``TextEnv`` for benchmarks: given prompts, the same
observation after every turn, never ends early, reward 0 (every episode does the same work).
"""

from __future__ import annotations

import abc
from typing import Any

import flax
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class TextStep:
    """What the model sees after ``reset`` / ``step`` of a batched ``TextEnv``."""

    obs: jax.Array  # [B, O] int32 token ids, right-padded
    obs_len: jax.Array  # [B] int32
    reward: jax.Array  # [B] float32 (of the turn just taken; 0 at reset)
    done: jax.Array  # [B] bool: the episode ended
    info: dict = flax.struct.field(default_factory=dict)  # {name: [B, ...]} the env's own per-turn records
    max_new: jax.Array | None = None  # [B] int32: the next turn's token limit (stop included); None: the responder's N


class TextEnv(abc.ABC):
    """A batched pure-JAX text environment (see the module docstring). Static attributes: ``max_turns`` (T, the
    model's turns at most), ``prompt_tokens`` (P, the first observation's width), ``obs_tokens`` (O, every later
    observation's width). ``reset``'s ``data`` is the episodes' per-row input ([B, ...] pytree: problems' arrays,
    or ``jnp.arange(B)`` for an env that draws its own)."""

    max_turns: int
    prompt_tokens: int
    obs_tokens: int
    chain_keys: bool = False  # True: turn keys chained through the turns (no [T] key array; rl.lm.multiturn)

    def split_key(self, key: jax.Array) -> tuple[jax.Array, Any]:
        """A turn's key -> (the sampler's key, the key ``step`` gets). Default: ``jax.random.split(key)``."""
        k_sample, k_env = jax.random.split(key)
        return k_sample, k_env

    @abc.abstractmethod
    def reset(self, key: jax.Array, data) -> tuple[Any, TextStep]:
        """Start B episodes: (state, TextStep with obs [B, P] = the prompts, reward 0)."""

    @abc.abstractmethod
    def step(self, key, state, turn: jax.Array, turn_len: jax.Array) -> tuple[Any, TextStep]:
        """The model's turn (ids [B, N], lengths [B], stop token included) -> (state, TextStep with obs [B, O])."""


class HostTextEnv(abc.ABC):
    """A text environment stepped in Python, one episode at a time (a tool, a checker); the same static
    attributes as ``TextEnv``. Methods must be thread-safe across episodes (the host rollout runs them on a pool)."""

    max_turns: int
    prompt_tokens: int
    obs_tokens: int

    @abc.abstractmethod
    def reset(self, row) -> tuple[Any, list[int]]:
        """One episode from a data row -> (episode, the prompt's ids, at most ``prompt_tokens``)."""

    @abc.abstractmethod
    def step(self, episode, turn: list[int]) -> tuple[Any, list[int], float, bool]:
        """The model's turn ids -> (episode, the next observation's ids (at most ``obs_tokens``), reward, done)."""


class FixedTextEnv(TextEnv):
    """Episodes of a fixed shape, for benchmarks: episode b's prompt is ``prompts[data[b]]`` ([R, P] int ids,
    right-padded; ``prompt_lens`` [R]), every turn is answered with the same observation ``obs`` [O] (all O tokens),
    no episode ends before ``max_turns`` (T), every reward is 0. State: the turns taken [B] int32."""

    def __init__(self, prompts, prompt_lens, obs, max_turns: int):
        self.prompts, self.prompt_lens = np.asarray(prompts, np.int32), np.asarray(prompt_lens, np.int32)
        self.obs = np.asarray(obs, np.int32)
        if self.prompts.ndim != 2 or self.prompt_lens.shape != self.prompts.shape[:1] or self.obs.ndim != 1:
            raise ValueError(f"FixedTextEnv: need prompts [R, P], prompt_lens [R], obs [O]; got "
                             f"{self.prompts.shape}, {self.prompt_lens.shape}, {self.obs.shape}")
        if not np.all((self.prompt_lens >= 1) & (self.prompt_lens <= self.prompts.shape[1])):
            raise ValueError(f"FixedTextEnv: prompt_lens must be in [1, {self.prompts.shape[1]}]")
        self.max_turns, self.prompt_tokens, self.obs_tokens = int(max_turns), self.prompts.shape[1], self.obs.shape[0]

    def reset(self, key, data):
        b = data.shape[0]
        step = TextStep(jnp.asarray(self.prompts)[data], jnp.asarray(self.prompt_lens)[data], jnp.zeros((b,)),
                        jnp.zeros((b,), bool))
        return jnp.zeros((b,), jnp.int32), step

    def step(self, key, state, turn, turn_len):
        b = turn.shape[0]
        obs = jnp.broadcast_to(jnp.asarray(self.obs), (b, self.obs_tokens))
        return state + 1, TextStep(obs, jnp.full((b,), self.obs_tokens, jnp.int32), jnp.zeros((b,)),
                                   jnp.zeros((b,), bool))
