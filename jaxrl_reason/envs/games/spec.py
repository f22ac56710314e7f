"""``GameSpec``: everything a two-player game offers its users, declared once by the game.

A spec names the game's environment class (the rules), its text interface for LM players, its fixed
players (``opponents``: ``name -> (env -> act(key, state, ts) -> action)`` on one unbatched game, as in
``envs.games.opponents``; ``"random"`` always), which of them is the *expert* (SPIRAL's warm-start
teacher imitates it), the teacher's short rationale sentence, and exact evaluation hooks where the
game has them:

- ``infosets(env) -> (states [N], player [N], legal [N, A])``: every information set of the game, one
  representative state each (batched; ``player`` is the one to act there), for exact evaluation of a
  policy that reads states (an LM reads their prompts: ``agents.spiral.evaluation``).
- ``evaluations``: ``name -> f(probs [N, A]) -> scalar``, exact evaluations of a policy given as its
  action probabilities at ``infosets`` (in their order); e.g. Kuhn Poker's exploitability.
- ``policy_metrics(policy_fn) -> dict``: exact metrics of an observation-level policy
  ``policy_fn(obs [n, *obs_shape], mask [n, A]) -> probs [n, A]`` (jnp, so it runs inside a training
  loop): self-play's ``metrics_fn`` (``rl.selfplay.SelfPlay``).

A game lives in one package, ``envs.games.<name>/`` (``rules``, ``text``, ``expert``, ``SPEC`` in its
``__init__``), registered by one ``register_game(<name>.SPEC)`` line in ``envs.games``. SPIRAL, self-play,
AlphaZero and the arena read the spec (``envs.games.GAMES[name]``) instead of dispatching on names.

    spec = GAMES["kuhn_poker"]
    env = spec.make_env()                       # envs.make(name) builds the same
    text = spec.make_text(env, "compact")       # envs.games.text.GameText
    act = spec.opponent("nash", env)            # act(key, state, ts) -> int32 action
    metrics = spec.policy_metrics(policy_fn)    # {"exploitability", "policy_table"}
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import jax

from jaxrl_reason.envs.core import Environment
from jaxrl_reason.envs.registry import make
from jaxrl_reason.envs.games.opponents import random_action

#: a fixed player on one unbatched game: ``act(key, state, ts) -> int32 action``
Player = Callable[[jax.Array, Any, Any], jax.Array]


def _random(env) -> Player:
    del env
    return random_action


@dataclasses.dataclass(frozen=True)
class GameSpec:
    """A registered game (``envs.games.register_game``).

    ``env``: the environment class (``(**kwargs) -> Environment``); ``text``: ``(env, style) -> GameText``;
    ``opponents``: fixed players built from the env (``"random"`` is added); ``expert``: the name of the
    warm-start teacher's expert among them; ``rationale(env, state, player, legal [A]) -> str``: the
    teacher's sentence before its boxed answer (host side, one game); ``infosets``, ``evaluations``,
    ``policy_metrics``: exact evaluation hooks (module docstring; None / empty where the game has none)."""

    name: str
    env: type
    text: Callable[..., Any]
    opponents: Mapping[str, Callable[[Environment], Player]]
    expert: str
    rationale: Callable[..., str]
    infosets: Callable[[Environment], tuple[Any, jax.Array, jax.Array]] | None = None
    evaluations: Mapping[str, Callable[[jax.Array], jax.Array]] = dataclasses.field(default_factory=dict)
    policy_metrics: Callable[[Callable], dict] | None = None

    def __post_init__(self):
        if not self.name or not isinstance(self.name, str):
            raise ValueError(f"GameSpec: name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "opponents", {"random": _random, **self.opponents})
        if self.expert not in self.opponents:
            raise ValueError(f"GameSpec {self.name!r}: expert {self.expert!r} is not among its opponents "
                             f"{tuple(self.opponents)}")
        if self.evaluations and self.infosets is None:
            raise ValueError(f"GameSpec {self.name!r}: evaluations act on probabilities at infosets; give infosets")

    def make_env(self, **kwargs) -> Environment:
        """The game's environment (the same as ``envs.make(name, **kwargs)``)."""
        return make(self.name, **kwargs)

    def make_text(self, env, style: str = "verbose"):
        """The text interface of ``env`` (this game's, wrappers allowed) in prompt ``style``."""
        while not isinstance(env, self.env) and hasattr(env, "env"):
            env = env.env
        if not isinstance(env, self.env):
            raise ValueError(f"{env!r} is not a {self.env.__name__} ({self.name})")
        return self.text(env, style)

    def opponent(self, name: str, env) -> Player:
        """The fixed player ``name`` of ``env`` (ValueError naming the available ones)."""
        if name not in self.opponents:
            raise ValueError(f"opponent {name!r} not available for {self.name}; choose from {tuple(self.opponents)}")
        return self.opponents[name](env)

    def expert_player(self, env) -> Player:
        return self.opponent(self.expert, env)
