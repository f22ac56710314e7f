"""SFT warm start: teach a tiny LM the answer format from games played by a teacher.

A tiny LM trained from scratch cannot read a board from text or write ``\\boxed{...}`` on its own,
so (as the SPIRAL brief allows) self-play starts from a short supervised warm start. The games are
played by a *teacher* that mixes an expert with random-legal play, so that the positions are varied:

- TicTacToe: perfect minimax move with probability ``expert_prob``, else a random legal move;
- Kuhn Poker: a Nash policy (alpha = 1/6) move with probability ``expert_prob``, else random legal;
- Negotiation: the fixed heuristic with probability ``expert_prob``, else random legal;
- any other registered game: its ``GameSpec.expert`` (``envs.games``), likewise.

The SFT target at each visited position is the expert's move (``labels="expert"``, the default:
imitation of the expert on the teacher's varied positions) or the move the teacher played
(``labels="played"``: half of the targets are random moves, so the warm-started LM plays about as
well as its mixed teacher).

Each example is ``[bos] prompt`` + ``"<rationale> \\boxed{<action>}"`` + ``[eos]`` (ids of the games'
tokenizer: the prompt as the rollout renders it, one id per character; the response encoded as plain
text, ``tokenizer.encode``: a BPE's canonical tokens, which the rollout's parser reads) with the loss on
the response only; the rationale is a short, state-derived sentence (``GameSpec.rationale``: free
cells / own card / own values) so that responses carry a little "reasoning" whose length RL can keep or collapse.

    params, metrics = warm_start(model, ("tictactoe", "kuhn_poker"), WarmStartConfig(), seed=0, style="compact",
                                 tokenizer=spiral_tokenizer())
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from jaxrl_reason.agents.spiral.rollout import LMGame, _render
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.envs.games.arena import mover_view
from jaxrl_reason.envs.wrappers import where_done
from jaxrl_reason.models.lm import sft
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.utils.validation import check_hyperparameters

LABELS = ("expert", "played")


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    expert_prob: float = 0.5  # teacher = expert with this probability, else random legal
    labels: str = "expert"  # SFT target: "expert" (the expert's move) or "played" (the teacher's move)
    games_per_game: int = 256  # teacher games played per game (data set size)
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3

    def __post_init__(self):
        check_hyperparameters(self)
        if self.labels not in LABELS:
            raise ValueError(f"WarmStartConfig: labels must be one of {LABELS}, got {self.labels!r}")
        if min(self.games_per_game, self.steps, self.batch_size) < 1:
            raise ValueError("WarmStartConfig: games_per_game, steps, batch_size must be >= 1")


def expert_player(game: LMGame):
    """The game's expert (``GameSpec.expert``: minimax / Kuhn Nash / negotiation heuristic / ...)."""
    return game.spec.expert_player(game.env)


def teacher_player(game: LMGame, expert_prob: float):
    """``act(key, state, ts) -> (played, expert)``: the teacher's move (the expert's with probability
    ``expert_prob``, else random legal) and the expert's move at the same position."""
    expert = expert_player(game)

    def act(key, state, ts):
        k0, k1, k2 = jax.random.split(key, 3)
        best = expert(k1, state, ts)
        return jnp.where(jax.random.uniform(k0) < expert_prob, best, O.random_action(k2, state, ts)), best

    return act


def rationale(game: LMGame, state, player: int, legal: np.ndarray) -> str:
    """Short state-derived sentence written before the boxed answer (host side, one game; ``GameSpec.rationale``)."""
    return game.spec.rationale(game.env, state, player, legal)


def response_text(game: LMGame, state, player: int, legal: np.ndarray, action: int) -> str:
    return f"{rationale(game, state, player, legal)} \\boxed{{{game.text.action_strings[int(action)]}}}"


def teacher_games(game: LMGame, num_games: int, expert_prob: float, key) -> dict:
    """Play ``num_games`` teacher-vs-teacher games; per turn ``[T, B]`` prompts, the played
    ``action``, the ``expert`` action at that position, legal masks, movers, states and an
    ``active`` flag (numpy)."""
    env, b = game.env, num_games
    teacher = teacher_player(game, expert_prob)

    @jax.jit
    def play(key):
        k_reset, k_play = jax.random.split(key)
        state, ts = jax.vmap(env.reset)(jax.random.split(k_reset, b))

        def turn(carry, key):
            state, ts = carry
            k_a, k_e = jax.random.split(key)
            done = ts.terminated | ts.truncated
            _, legal = mover_view(ts)
            action, best = jax.vmap(teacher)(jax.random.split(k_a, b), state, ts)
            rec = dict(prompts=_render(game, state, ts.current_player), action=action, expert=best, legal=legal,
                       player=ts.current_player, active=~done, state=state)
            new = jax.vmap(env.step)(jax.random.split(k_e, b), state, action)
            return where_done(done, (state, ts), new), rec  # ended games stay

        _, recs = jax.lax.scan(turn, (state, ts), jax.random.split(k_play, game.max_turns))
        return recs

    return jax.device_get(play(key))


def sft_examples(games: Sequence[LMGame], cfg: WarmStartConfig, key, seq_len: int | None = None) -> dict:
    """Teacher turns of every game as ``{"tokens" [M, L], "loss_mask" [M, L-1]}`` (numpy), in the ids of
    the games' tokenizer (one tokenizer for all of them)."""
    tok = games[0].tokenizer
    if any(g.tokenizer is not tok for g in games):
        raise ValueError("sft_examples: every game must use the same tokenizer")
    prompts, responses = [], []
    for game, k in zip(games, jax.random.split(key, len(games))):
        rec = teacher_games(game, cfg.games_per_game, cfg.expert_prob, k)
        target = rec["expert"] if cfg.labels == "expert" else rec["action"]
        for t, i in zip(*np.nonzero(rec["active"])):
            state = jax.tree.map(lambda x: x[t, i], rec["state"])
            p = int(rec["player"][t, i])
            resp = tok.encode(response_text(game, state, p, rec["legal"][t, i], target[t, i]))
            prompts.append(rec["prompts"][t, i].tolist())
            responses.append(resp + [tok.eos_id])
    longest = max(len(p) + len(r) for p, r in zip(prompts, responses))
    length = seq_len or longest
    if longest > length:
        raise ValueError(f"an SFT example of {longest} tokens does not fit seq_len {length}")
    return sft.sft_examples(prompts, responses, length, tok)


def warm_start(model, games: Sequence[str], cfg: WarmStartConfig = WarmStartConfig(), seed: int = 0,
               style: str = "verbose", *, tokenizer: Tokenizer):
    """SFT ``model`` (in place) on teacher moves of ``games`` rendered in prompt ``style`` in the ids of
    ``tokenizer`` (the LM's: ``agents.spiral.tokenizer``); returns ``(params, {"nll": [steps], "examples": count})``."""
    specs = [LMGame.make(g, style, tokenizer=tokenizer) for g in games]
    data = sft_examples(specs, cfg, jax.random.key(seed))
    tokenizer.check_model(model.cfg, data["tokens"].shape[1], "SPIRAL warm start")
    params, nll = sft.fit(model, data, cfg.steps, cfg.batch_size, cfg.lr, seed, chunk=128, name="SPIRAL SFT warm start",
                          progress="SFT warm start")
    return params, {"nll": nll, "examples": len(data["tokens"])}
