"""Evaluation of a SPIRAL LM: win rates vs fixed opponents, the games' exact evaluations (Kuhn exploitability), transfer.

    tok, task_tok = spiral_tokenizer(), CharTokenizer()   # the LM's and the reasoning tasks' tokenizers
    win_rates(graphdef, params, "tictactoe", "minimax", 256, sampler, key, style="verbose", tokenizer=tok)
        -> {"win", "draw", "loss", "forfeit", "format_error", "mean_return", "return_se"} of the LM
           (seats alternate; ``return_se`` is the standard error of ``mean_return``)
    lm_infoset_policy(graphdef, params, "kuhn_poker", sampler, samples=64, key, tokenizer=tok)
                                                       -> ([N, A] action probabilities at the game's
                                                           information sets, valid rate)
    lm_policy_evaluations(..., tokenizer=tok)          -> the game's exact evaluations of that policy
                                                          (GameSpec.evaluations: Kuhn's exploitability,
                                                          value vs random, ...), valid rate, probs
    transfer_eval(model, num_problems, seed, max_new_tokens, tokenizer=tok, task_tokenizer=task_tok)
                                                       -> rewards.evaluation.greedy_eval per task
                                                          (task_tokenizer=None: a checkpoint's tokenizer)

``style`` is the prompt style the LM was trained on (``envs.games.text.STYLES``); ``tokenizer`` the
LM's (the games render and parse in its ids: ``agents.spiral.tokenizer``).
Opponents: each game's ``GameSpec.opponents`` (``envs.games``): ``random`` (every game), ``minimax``
(TicTacToe, perfect play), ``nash`` (Kuhn Poker, Nash alpha = 1/6), ``heuristic`` (Negotiation, Liar's Dice).
A game with exact evaluations (``GameSpec.infosets`` and ``evaluations``: Kuhn Poker) has the LM's policy
estimated by sampling ``samples`` answers at each information set and counting each action among the
parseable, legal ones (the valid rate is returned separately; a set with no valid answer counts as uniform
over its legal actions). ``TaskView`` wraps the LM so the task code (``rewards/evaluation.py``, with the tasks'
tokenizer, the character tokenizer for the presets) runs it unchanged: task token ids are mapped into
the LM's ids on the way in (``agents.spiral.tokenizer.id_table``) and the logits restricted to the
task tokens on the way out. A checkpoint's LM is evaluated on the tasks encoded with its own tokenizer.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jaxrl_reason.agents.spiral.rollout import LMGame, _parse, _render, game_rollout
from jaxrl_reason.agents.spiral.tokenizer import id_table
from jaxrl_reason.envs.games import GAMES as GAME_SPECS
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.models.lm.sampler import SamplerConfig, generate
from jaxrl_reason.models.tokenizer import Tokenizer

#: game -> its fixed opponents' names (``GameSpec.opponents``), for every registered game
OPPONENTS = {name: tuple(spec.opponents) for name, spec in GAME_SPECS.items()}


def opponent_fn(game: LMGame, name: str):
    return game.spec.opponent(name, game.env)


@functools.lru_cache(maxsize=None)
def _match_fn(graphdef, game_name: str, opponent: str, num_episodes: int, sampler: SamplerConfig, style: str,
              tokenizer: Tokenizer):
    game = LMGame.make(game_name, style, tokenizer=tokenizer)
    roll = game_rollout(graphdef, game, num_episodes, sampler, opponent_fn(game, opponent))

    @jax.jit
    def run(params, key):
        turns, games = roll(params, key)
        r = jnp.take_along_axis(games.returns, games.lm_seat[:, None], 1)[:, 0]
        r_opp = jnp.take_along_axis(games.returns, 1 - games.lm_seat[:, None], 1)[:, 0]
        act = turns.info["active"].astype(jnp.float32)
        return {"win": (r > r_opp).mean(), "draw": (r == r_opp).mean(), "loss": (r < r_opp).mean(),
                "mean_return": r.mean(), "return_se": r.std() / jnp.sqrt(r.shape[0] - 1.0),
                "forfeit": games.forfeit.any(1).mean(),
                "format_error": ((turns.info["status"] != gtext.OK) * act).sum() / jnp.maximum(act.sum(), 1.0)}

    return run


def win_rates(graphdef, params, game: str, opponent: str, num_episodes: int, sampler: SamplerConfig, key,
              style: str = "verbose", *, tokenizer: Tokenizer) -> dict:
    """LM vs ``opponent`` over ``num_episodes`` games (even: the LM takes each seat half the time)."""
    if num_episodes < 2 or num_episodes % 2:
        raise ValueError(f"num_episodes must be even and >= 2, got {num_episodes}")
    out = _match_fn(graphdef, game, opponent, num_episodes, sampler, style, tokenizer)(params, key)
    return {k: float(v) for k, v in jax.device_get(out).items()}


def infoset_prompts(game: LMGame) -> tuple[jax.Array, jax.Array]:
    """Prompts ``[N, P]`` of the game's information sets (``GameSpec.infosets``, in their order: Kuhn Poker's
    12 are card-major, J/Q/K x histories ``"", p, b, pb``), each for the player to act, and legal masks ``[N, A]``."""
    if game.spec.infosets is None:
        raise ValueError(f"{game.name} has no information sets to evaluate a policy at (GameSpec.infosets)")
    states, player, legal = game.spec.infosets(game.env)
    return _render(game, states, jnp.asarray(player)), jnp.asarray(legal)


def infoset_probs(action: jax.Array, status: jax.Array, legal: jax.Array, samples: int) -> jax.Array:
    """``[N, A]`` action frequencies among the parseable, legal answers (``OK``) of ``samples`` answers per
    information set (``action``, ``status``: ``[N * samples]``, set-major); uniform over the legal actions
    where no answer was valid."""
    n, num_actions = legal.shape
    ok = (status == gtext.OK).reshape(n, samples)
    counts = (jax.nn.one_hot(action.reshape(n, samples), num_actions, dtype=jnp.int32) * ok[..., None]).sum(1)
    n_ok = ok.sum(1)
    uniform = legal / legal.sum(-1, keepdims=True)
    return jnp.where(n_ok[:, None] > 0, counts / jnp.maximum(n_ok, 1)[:, None], uniform)


@functools.lru_cache(maxsize=None)
def _infoset_policy_fn(graphdef, game_name: str, sampler: SamplerConfig, samples: int, style: str,
                       tokenizer: Tokenizer):
    game = LMGame.make(game_name, style, tokenizer=tokenizer)
    prompts, legal = infoset_prompts(game)
    n = prompts.shape[0]
    sampler = dataclasses.replace(sampler, pad_id=tokenizer.pad_id)
    prompts, legal_rep = jnp.repeat(prompts, samples, 0), jnp.repeat(legal, samples, 0)
    b = prompts.shape[0]

    @jax.jit
    def run(params, key):
        out = generate(graphdef, params, prompts, jnp.full((b,), prompts.shape[1], jnp.int32), key,
                       jnp.full((b, 1), tokenizer.eos_id, jnp.int32), jnp.full((b,), sampler.max_new_tokens, jnp.int32),
                       config=sampler)
        action, status = _parse(game, out.tokens, legal_rep)
        return infoset_probs(action, status, legal, samples), (status == gtext.OK).reshape(n, samples).mean()

    return run


def lm_infoset_policy(graphdef, params, game: str, sampler: SamplerConfig, samples: int, key,
                      style: str = "verbose", *, tokenizer: Tokenizer) -> tuple[jax.Array, float]:
    """The LM's behaviour at ``game``'s information sets as action probabilities ``[N, A]`` (``infoset_probs``
    of ``samples`` sampled answers per set), and its valid-answer rate."""
    probs, valid = _infoset_policy_fn(graphdef, game, sampler, samples, style, tokenizer)(params, key)
    return probs, float(valid)


def lm_policy_evaluations(graphdef, params, game: str, sampler: SamplerConfig, samples: int, key,
                          style: str = "verbose", *, tokenizer: Tokenizer) -> dict:
    """The game's exact evaluations (``GameSpec.evaluations``) of the LM's policy at its information sets, its
    valid-answer rate and the action probabilities (``probs``, rounded)."""
    probs, valid = lm_infoset_policy(graphdef, params, game, sampler, samples, key, style, tokenizer=tokenizer)
    exact = {k: float(f(probs)) for k, f in GAME_SPECS[game].evaluations.items()}
    return {**exact, "valid_rate": valid, "probs": np.asarray(probs).round(3).tolist()}


# ----------------------------------------------------------------------------- transfer
class TaskView(nnx.Module):
    """The LM seen through the tasks' tokenizer for ``rewards/evaluation``: ``table`` maps task ids to LM ids
    (``agents.spiral.tokenizer.id_table(task_tokenizer, lm_tokenizer)``); the logits are the LM's at those ids."""

    def __init__(self, model, table):
        self.inner = model
        self.cfg = model.cfg
        self.table = tuple(int(i) for i in np.asarray(table).reshape(-1))  # static: a constant in the trace

    def layer_states(self) -> list:
        return self.inner.layer_states()

    def hidden(self, tokens, positions=None, cache=None, layers=None):
        return self.inner.hidden(jnp.asarray(self.table, jnp.int32)[jnp.asarray(tokens)], positions, cache, layers)

    def logits(self, h):
        return jnp.take(self.inner.logits(h), jnp.asarray(self.table, jnp.int32), axis=-1)

    def __call__(self, tokens, positions=None, cache=None, layers=None):
        h, cache, aux = self.hidden(tokens, positions, cache, layers)
        return self.logits(h), cache, aux


def transfer_eval(model, num_problems: int = 64, seed: int = 1234, max_new_tokens: int = 32, *,
                  tokenizer: Tokenizer, task_tokenizer: Tokenizer | None = None) -> dict:
    """Greedy accuracy / format rate on RandomCalculation and Countdown (``rewards.evaluation``, scored on the
    decoded text). With ``task_tokenizer`` (``CharTokenizer()`` for the presets: R1 tags single tokens) the
    problems are encoded with it and the LM (``tokenizer``) is seen through ``TaskView``; without it (a
    checkpoint's tokenizer: the tags may be several tokens, which text scoring allows) the problems are
    encoded with ``tokenizer`` and the LM is evaluated as is."""
    from jaxrl_reason.tasks.base import make_batch
    from jaxrl_reason.tasks.countdown import Countdown
    from jaxrl_reason.rewards.evaluation import greedy_eval
    from jaxrl_reason.tasks.random_calculation import RandomCalculation

    if task_tokenizer is None:
        lm, tok, prompt_len = model, tokenizer, 64
    else:
        lm, tok, prompt_len = TaskView(model, id_table(task_tokenizer, tokenizer)), task_tokenizer, 32
    out = {}
    for task in (RandomCalculation(), Countdown()):
        batch = make_batch(task, np.random.default_rng(seed), num_problems, prompt_len=prompt_len, answer_len=24,
                           tokenizer=tok)
        r = greedy_eval(lm, [task], batch, max_new_tokens, tok)
        out[task.name] = {"accuracy": r["accuracy"], "format_rate": r["format_rate"],
                          "response_length": r["response_length"]}
    return out
