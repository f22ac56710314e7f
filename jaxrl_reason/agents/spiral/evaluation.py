"""Evaluation of a SPIRAL LM: win rates vs fixed opponents, Kuhn exploitability, transfer to tasks.

    win_rates(graphdef, params, "tictactoe", "minimax", 256, sampler, key, style="verbose")
        -> {"win", "draw", "loss", "forfeit", "format_error", "mean_return", "return_se"} of the LM
           (seats alternate; ``return_se`` is the standard error of ``mean_return``)
    kuhn_lm_policy(graphdef, params, sampler, samples=64, key)  -> ([3, 4] bet/call table, valid rate)
    kuhn_lm_exploitability(...)                                   -> exploitability of that table, and its
                                                                     exact value against a uniformly random player
    transfer_eval(model, num_problems, seed, max_new_tokens)     -> tasks.evaluation.greedy_eval per task

``style`` is the prompt style the LM was trained on (``envs.games.text.STYLES``).
Opponents: ``random`` (every game), ``minimax`` (TicTacToe, perfect play), ``nash`` (Kuhn Poker,
Nash alpha = 1/6), ``heuristic`` (Negotiation). The LM's Kuhn table is estimated by sampling
``samples`` answers at each of the 12 information sets and counting the aggressive action among the
parseable, legal ones (the valid rate is returned separately; a set with no valid answer counts
as 0.5). ``TaskView`` wraps the LM so the task code (character vocabulary, ``tasks/evaluation.py``)
runs it unchanged: token ids are mapped into the LM's byte layout on the way in and the logits
restricted to the task characters on the way out.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.agents.spiral import vocab as V
from jaxrl_reason.agents.spiral.rollout import GameSpec, make_rollout
from jaxrl_reason.agents.spiral.warmstart import KUHN_TEACHER_ALPHA, kuhn_policy_action
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.envs.games.kuhn_poker import BET, CALL
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate

OPPONENTS = {"tictactoe": ("random", "minimax"), "kuhn_poker": ("random", "nash"),
             "negotiation": ("random", "heuristic")}


def opponent_fn(game: GameSpec, name: str):
    if name not in OPPONENTS[game.name]:
        raise ValueError(f"opponent {name!r} not available for {game.name}; choose from {OPPONENTS[game.name]}")
    if name == "random":
        return O.random_action
    if name == "minimax":
        return O.minimax_action
    if name == "nash":
        return kuhn_policy_action(O.kuhn_nash_policy(KUHN_TEACHER_ALPHA))
    return O.negotiation_heuristic_action(game.env)


@functools.lru_cache(maxsize=None)
def _match_fn(graphdef, game_name: str, opponent: str, num_episodes: int, sampler: SamplerConfig, style: str):
    game = GameSpec.make(game_name, style)
    roll = make_rollout(graphdef, game, num_episodes, sampler, opponent_fn(game, opponent))

    @jax.jit
    def run(params, key):
        e = roll(params, key)
        r = jnp.take_along_axis(e.returns, e.lm_seat[:, None], 1)[:, 0]
        r_opp = jnp.take_along_axis(e.returns, 1 - e.lm_seat[:, None], 1)[:, 0]
        act = e.turns.active.astype(jnp.float32)
        return {"win": (r > r_opp).mean(), "draw": (r == r_opp).mean(), "loss": (r < r_opp).mean(),
                "mean_return": r.mean(), "return_se": r.std() / jnp.sqrt(r.shape[0] - 1.0),
                "forfeit": e.forfeit.any(1).mean(),
                "format_error": ((e.turns.status != gtext.OK) * act).sum() / jnp.maximum(act.sum(), 1.0)}

    return run


def win_rates(graphdef, params, game: str, opponent: str, num_episodes: int, sampler: SamplerConfig, key,
              style: str = "verbose") -> dict:
    """LM vs ``opponent`` over ``num_episodes`` games (even: the LM takes each seat half the time)."""
    if num_episodes < 2 or num_episodes % 2:
        raise ValueError(f"num_episodes must be even and >= 2, got {num_episodes}")
    out = _match_fn(graphdef, game, opponent, num_episodes, sampler, style)(params, key)
    return {k: float(v) for k, v in jax.device_get(out).items()}


def kuhn_infoset_prompts(style: str = "verbose") -> tuple[jax.Array, jax.Array]:
    """Prompts ``[12, P]`` (card-major: J/Q/K x histories ``"", p, b, pb``) and legal masks ``[12, 4]``."""
    game = GameSpec.make("kuhn_poker", style)
    env = game.env
    cards, hists = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    cards, hists = cards.reshape(-1), hists.reshape(-1)
    mover = ((hists == 1) | (hists == 2)).astype(np.int32)
    other = (cards + 1) % 3  # never shown to the mover
    deal = np.where(mover[:, None] == 0, np.stack([cards, other], 1), np.stack([other, cards], 1))
    states = jax.vmap(env.init_state)(jnp.asarray(deal))
    states = states.replace(hist=jnp.asarray(hists, jnp.int32))
    body = jax.vmap(game.text.render, in_axes=(0, 0, None))(states, jnp.asarray(mover), V.OFFSET)
    prompts = jnp.concatenate([jnp.full((12, 1), V.BOS, jnp.int32), body], 1)
    facing = hists >= 2
    legal = np.where(facing[:, None], [False, False, True, True], [True, True, False, False])
    return prompts, jnp.asarray(legal)


@functools.lru_cache(maxsize=None)
def _kuhn_policy_fn(graphdef, sampler: SamplerConfig, samples: int, style: str):
    game = GameSpec.make("kuhn_poker", style)
    prompts, legal = kuhn_infoset_prompts(style)
    prompts, legal = jnp.repeat(prompts, samples, 0), jnp.repeat(legal, samples, 0)
    b = prompts.shape[0]

    @jax.jit
    def run(params, key):
        out = generate(graphdef, params, prompts, jnp.full((b,), prompts.shape[1], jnp.int32), key,
                       jnp.full((b, 1), V.EOS, jnp.int32), jnp.full((b,), sampler.max_new_tokens, jnp.int32),
                       config=sampler)
        action, status = jax.vmap(game.text.parse, in_axes=(0, 0, None))(out.tokens, legal, V.OFFSET)
        ok = (status == gtext.OK).reshape(12, samples)
        aggressive = ((action == BET) | (action == CALL)).reshape(12, samples) & ok
        n_ok = ok.sum(1)
        p = jnp.where(n_ok > 0, aggressive.sum(1) / jnp.maximum(n_ok, 1), 0.5)
        return p.reshape(3, 4), ok.mean()

    return run


def kuhn_lm_policy(graphdef, params, sampler: SamplerConfig, samples: int, key,
                   style: str = "verbose") -> tuple[jax.Array, float]:
    """The LM's Kuhn Poker behaviour as a ``[3, 4]`` bet/call table, and its valid-answer rate."""
    table, valid = _kuhn_policy_fn(graphdef, sampler, samples, style)(params, key)
    return table, float(valid)


def kuhn_lm_exploitability(graphdef, params, sampler: SamplerConfig, samples: int, key,
                           style: str = "verbose") -> dict:
    table, valid = kuhn_lm_policy(graphdef, params, sampler, samples, key, style)
    return {"exploitability": float(O.kuhn_exploitability(table)), "valid_rate": valid,
            "value_vs_nash_p0": float(O.kuhn_value(table, O.kuhn_nash_policy(KUHN_TEACHER_ALPHA))),
            "value_vs_random": float(O.kuhn_value_vs_uniform(table)),
            "table": np.asarray(table).round(3).tolist()}


# ----------------------------------------------------------------------------- transfer
class TaskView(nnx.Module):
    """The LM seen through the task character vocabulary (``tasks.vocab``) for ``tasks/evaluation``."""

    def __init__(self, model):
        self.inner = model
        self.cfg = model.cfg

    def layer_states(self) -> list:
        return self.inner.layer_states()

    def hidden(self, tokens, positions=None, cache=None, layers=None):
        return self.inner.hidden(V.to_lm(tokens), positions, cache, layers)

    def logits(self, h):
        return jnp.take(self.inner.logits(h), jnp.asarray(V._TO_LM), axis=-1)

    def __call__(self, tokens, positions=None, cache=None, layers=None):
        h, cache, aux = self.hidden(tokens, positions, cache, layers)
        return self.logits(h), cache, aux


def transfer_eval(model, num_problems: int = 64, seed: int = 1234, max_new_tokens: int = 32) -> dict:
    """Greedy accuracy / format rate on RandomCalculation and Countdown (``tasks.evaluation``)."""
    from jaxrl_reason.tasks.base import make_batch
    from jaxrl_reason.tasks.countdown import Countdown
    from jaxrl_reason.tasks.evaluation import greedy_eval
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    out = {}
    for task in (RandomCalculation(), Countdown()):
        batch = make_batch(task, np.random.default_rng(seed), num_problems, prompt_len=32, answer_len=24)
        r = greedy_eval(TaskView(model), [task], batch, max_new_tokens)
        out[task.name] = {"accuracy": r["accuracy"], "format_rate": r["format_rate"],
                          "response_length": r["response_length"]}
    return out
