"""PPO self-play for two-player turn-based games: one shared policy plays both seats.

A configuration of ``rl.onpolicy`` (every seat observes every step, only the player to move acts
and enters the loss) whose ``targets`` hook sets the advantages (``advantage``):

- ``"rae"``: Role-conditioned Advantage Estimation (``rl/rae.py``): ``A = R_role - b[role]`` with a
  per-role EMA baseline (alpha 0.05) read before the update, threaded through updates as the hook's
  state; every turn of a role gets its episode's advantage (SPIRAL).
- ``"none"``: plain self-play, ``A = R_role`` (no baseline, SPIRAL's ablation).
- ``"critic"``: ``A = R - V(obs)`` with the learned value head (Monte Carlo, lambda = 1).

Advantages are not standardised (``adv_norm="none"``, SPIRAL's choice: the baseline is the
normaliser). Steps of episodes that do not finish inside the rollout are masked out. Rewards are
assumed to come at the end of the episode (true for the games here), so ``R`` is the episode return.
``SelfPlay(config)`` has ``init(key)``, jitted ``update(state) -> (state, metrics)`` (one update,
scalar metrics) and ``train(key)`` (all updates in one ``lax.scan``; vmappable over seeds).
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason import envs
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.models.policies import make_policy, masked_logits
from jaxrl_reason.rl.onpolicy import Hooks, OnPolicyConfig, Targets, Transition, make_trainer
from jaxrl_reason.rl.rae import init_baseline, rae_advantages

ADVANTAGES = ("rae", "none", "critic")


@dataclasses.dataclass(frozen=True)
class SelfPlayConfig(OnPolicyConfig):
    """``OnPolicyConfig`` (defaults: 256 environments, 16 steps, lr 3e-3, no advantage normalisation)
    plus the game, the budget in updates, the advantage estimator and the MLP's widths."""

    env: str = "kuhn_poker"
    num_envs: int = 256
    num_updates: int = 200
    advantage: str = "rae"
    hidden: tuple[int, ...] = (64, 64)
    adv_norm: str = "none"
    rae_alpha: float = 0.05
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.advantage not in ADVANTAGES:
            raise ValueError(f"advantage must be one of {ADVANTAGES}, got {self.advantage!r}")
        if self.num_updates < 1:
            raise ValueError(f"SelfPlayConfig.num_updates must be >= 1, got {self.num_updates}")
        if not 0.0 < self.rae_alpha <= 1.0:
            raise ValueError(f"rae_alpha must be in (0, 1], got {self.rae_alpha}")


def episode_targets(config: SelfPlayConfig):
    """``targets`` hook: each role's episode return, minus its RAE baseline / nothing / its value."""

    def targets(traj: Transition, last_value, baseline):
        done, ep_ret = traj.returned, traj.episode_return  # [T, E], [T, E, A] (the return at its last step)
        rows = ep_ret.reshape(-1, ep_ret.shape[-1])  # episodes in (t, e) order
        adv_rows, new_baseline = rae_advantages(baseline, rows, valid=done.reshape(-1), alpha=config.rae_alpha)
        b_read = (rows - adv_rows).reshape(ep_ret.shape)

        def backward(carry, x):  # spread each episode's (return, baseline) back over its steps
            ret, base, seen = carry
            d, r, b = x
            ret, base = jnp.where(d[:, None], r, ret), jnp.where(d[:, None], b, base)
            seen = d | seen
            return (ret, base, seen), (ret, base, seen)

        init = (jnp.zeros_like(ep_ret[0]), jnp.zeros_like(ep_ret[0]), jnp.zeros_like(done[0]))
        _, (ret, base, valid) = jax.lax.scan(backward, init, (done, ep_ret, b_read), reverse=True)
        adv = {"rae": ret - base, "none": ret, "critic": ret - traj.value}[config.advantage]
        mask = traj.acted & valid[..., None]
        return Targets(adv, ret, mask, mask), (new_baseline if config.advantage == "rae" else baseline)

    return targets


class SelfPlay:
    def __init__(self, config: SelfPlayConfig, env=None, metrics_fn: Callable | None = None):
        """``metrics_fn(policy_fn) -> dict`` adds metrics each update; ``policy_fn(obs, mask)``
        returns action probabilities (e.g. a game's ``GameSpec.policy_metrics``: Kuhn Poker's exact
        exploitability, ``envs.games.GAMES["kuhn_poker"].policy_metrics``)."""
        self.config = c = config
        self.env = env if env is not None else envs.make(c.env)
        if self.env.num_agents != 2 or not self.env.turn_based:
            raise ValueError("self-play needs a two-player turn-based environment")
        self.obs_dim = int(self.env.obs_shape[0])
        self.metrics_fn = metrics_fn
        build = lambda key: make_policy("mlp", self.obs_dim, self.env.num_actions, rngs=nnx.Rngs(key), hidden=c.hidden)
        hooks = Hooks(targets=episode_targets(c), targets_state=init_baseline(1, 2), metrics=self._metrics)
        self.trainer = make_trainer(c, self.env, build, hooks)
        self.graphdef = self.trainer.graphdef
        self.init = self.trainer.init
        self.update = jax.jit(self._update)

    def _metrics(self, s) -> dict:
        baseline = s.targets_state
        m = {"baseline_p0": baseline[0, 0], "baseline_p1": baseline[0, 1]}
        if self.metrics_fn is not None:
            m.update(self.metrics_fn(lambda obs, mask: self.probs(s.params, obs, mask)))
        return m

    def _update(self, s):
        s, m = self.trainer.update(s)
        m = {k: v[0] for k, v in m.items()}
        return s, {**m, "return_p0": m["episode_return_agent0"]}

    def apply(self, params, obs, mask):
        """``(masked logits, value)`` of the shared policy."""
        _, logits, value = nnx.merge(self.graphdef, params)(None, obs, None)
        return masked_logits(logits, mask), value

    def probs(self, params, obs, mask):
        return jax.nn.softmax(self.apply(params, obs, mask)[0], -1)

    def policy_player(self, params, greedy: bool = False):
        """Batched player for ``arena.play``."""

        def act(key, state, ts):
            obs, mask = mover_view(ts)
            logits, _ = self.apply(params, obs, mask)
            a = jnp.argmax(logits, -1) if greedy else jax.random.categorical(key, logits)
            return a.astype(jnp.int32)

        return act

    def train(self, key):
        """All ``num_updates`` updates in one scan: ``(final state, metrics [num_updates])``."""
        return jax.lax.scan(lambda s, _: self._update(s), self.init(key), None, self.config.num_updates)

