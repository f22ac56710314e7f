"""SPIRAL on the LM learner: multi-game LM self-play with RAE, one jitted program per step.

    learner, agent = spiral_learner(SpiralConfig(games=("tictactoe", "kuhn_poker")), model, tokenizer=spiral_tokenizer())
    state = learner.init(jax.random.key(0), agent)
    state, metrics = learner.step(state, agent)     # jitted: all rollouts + advantages + update

``SpiralAgent`` is the rollout (``rl.lm.learner``): one step plays ``episodes_per_game`` games of every game in the
config (each game's rollout is a ``lax.scan`` over turns, ``rollout.game_rollout``, inside the learner's one jitted
program), puts the turns of all games in one ``Rollout`` (prompts right-padded to the longest game; rows game-major,
then turn-major) and hands the learner one reward per (episode, seat) sample: its group the (game, seat), each
turn row's sample its (episode, seat) (``Rollout.sample``), unfinished games invalid. The learner's estimator
(``SpiralConfig.advantage`` -> ``advantages.spiral_estimator``: RAE per (game, role), plain self-play, or RAE against
a fixed opponent) makes the advantages, its baselines [2 * num_games] carried in the learner's state; the update is
``minibatches`` clipped policy-gradient steps (token-mean) on the stored per-turn token sequences, the sampler's
log-probs as the old policy's. Metrics: the learner's (``grad_norm``, ``loss``, ``entropy``, ``mean_abs_adv``, ...)
and per game (``<game>/win0``, ``/win_lm``, ``/draw``, ``/forfeit``, ``/format_error``, ``/response_length``,
``/turns``, ``/reward_var``, and ``/baseline0``, ``/baseline1`` from the learner's state).

Multi-device / multi-process: ``mesh="data=8"`` (or, in a multi-process run, ``mesh=None``: data over every device
of every process) splits each game's episodes over the data axis, each device playing its slice of the one seeded
batch; the learner replicates the state and the update's gradient is all-reduced by the shardings, so the metrics
are those of one device up to float rounding.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from jaxrl_reason.agents.spiral.advantages import FIXED, spiral_estimator
from jaxrl_reason.agents.spiral.rollout import GAMES, LMGame, game_rollout
from jaxrl_reason.envs.games import game_spec
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import data_mesh
from jaxrl_reason.rl.lm import Learner, LearnerConfig, Rollout
from jaxrl_reason.rl.lm.advantages import ESTIMATORS
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.utils.validation import POSITIVE, Range, Rule, at_least, check_hyperparameters, one_of, require


def fixed_opponent(opponent: str, game: str) -> str:
    """The name, among ``game``'s ``GameSpec.opponents``, of SpiralConfig's ``opponent``: ``"expert"`` is each
    game's expert (Tic-Tac-Toe's minimax, Kuhn Poker's Nash, ...), any other name is taken as is."""
    return game_spec(game).expert if opponent == "expert" else opponent


@dataclasses.dataclass(frozen=True)
class SpiralConfig:
    games: tuple[str, ...] = ("tictactoe", "kuhn_poker")
    episodes_per_game: int = 32
    # rae | none | fixed (RAE, the LM vs a fixed opponent) | any registered estimator (agents.spiral.advantages)
    advantage: str = "rae"
    # the fixed opponent of advantage="fixed": "random", "expert" (each game's), or a name every game's spec has
    opponent: str = "random"
    prompt_style: str = "verbose"  # the games' prompt style (envs.games.text.STYLES)
    alpha: float = 0.05  # RAE EMA rate
    max_new_tokens: int = 28
    temperature: float = 1.0
    lr: float = 3e-4
    max_grad_norm: float = 1.0
    adam_b2: float = 0.999  # (rl.lm.optim's default)
    minibatches: int = 1
    loss: LossConfig = LossConfig(aggregation="token_mean")
    logprob_chunk: int = 64
    # rows (turns) per forward pass of the update; 0: every turn slot in one pass. With a value, the trainable
    # turns (live LM turns) are gathered first and a pass holding none is skipped: the update of a large model
    # costs its trainable turns, not all T x B turn slots of the games (most are padding after a game ended)
    update_rows: int = 0
    mesh: str | None = None  # e.g. "data=8": the games split over the data axis (multi-process: data over all)

    CHECKS = (("games", Rule(lambda g: 0 < len(g) == len(set(g)), "distinct names, at least one")),
              ("games", Rule(lambda g: all(x in GAMES for x in g), f"among {GAMES}")),
              ("advantage", Rule(lambda a: a == FIXED or a in ESTIMATORS,
                                 "'fixed' or a registered advantage estimator (rl.lm.advantages.ESTIMATORS)")),
              ("alpha", Range(0.0, 1.0, low_open=True)),
              ("episodes_per_game", Rule(lambda n: n >= 2 and n % 2 == 0, "even and >= 2")),
              ("temperature", POSITIVE, "RL trains on the sampler's log-probs"),
              ("minibatches", at_least(1)),
              ("update_rows", at_least(0), "0: all rows in one pass"),
              ("prompt_style", one_of(gtext.STYLES)))  # (utils.validation; lr and max_grad_norm: their names' ranges)

    def __post_init__(self):
        check_hyperparameters(self)
        lacking = [g for g in self.games if fixed_opponent(self.opponent, g) not in game_spec(g).opponents]
        require(self, not lacking, f"opponent {self.opponent!r} is not an opponent of {lacking}: use 'random', "
                                   f"'expert' or one of {[tuple(game_spec(g).opponents) for g in lacking]}")
        SamplerConfig(max_new_tokens=self.max_new_tokens)

    @property
    def fixed(self) -> bool:
        """Whether the LM plays a fixed opponent (``advantage="fixed"``) rather than itself."""
        return self.advantage == FIXED

    def learner_config(self) -> LearnerConfig:
        """The learner's configuration: the estimator (``advantages.spiral_estimator``), one epoch of
        ``minibatches`` shuffled minibatches over the turns (their count need not divide: ``wrap``), the sampler's
        log-probs as the old policy's."""
        return LearnerConfig(lr=self.lr, max_grad_norm=self.max_grad_norm, adam_b2=self.adam_b2,
                             advantage=spiral_estimator(self.advantage, self.alpha), loss=self.loss,
                             minibatches=self.minibatches, wrap=True, old_logp="sampler", temperature=self.temperature,
                             logprob_chunk=self.logprob_chunk, update_rows=self.update_rows, mesh=self.mesh)


@dataclasses.dataclass(frozen=True)
class SpiralAgent:
    """SPIRAL's rollout on the learner (module docstring). ``graphdef``: the learner's; ``tokenizer``: the LM's
    (``agents.spiral.tokenizer``: the presets' byte tokenizer, or a checkpoint's byte-level BPE): prompts, answer
    parsing, stops and padding; ``mesh``: the learner's (the games split over its ``data`` axis)."""

    graphdef: Any
    config: SpiralConfig
    tokenizer: Tokenizer
    mesh: Any = None

    @functools.cached_property
    def games(self) -> tuple[LMGame, ...]:
        return tuple(LMGame.make(g, self.config.prompt_style, tokenizer=self.tokenizer) for g in self.config.games)

    @property
    def prompt_len(self) -> int:
        """P: the longest game's prompt (every row's prompt is padded to it)."""
        return max(g.prompt_len for g in self.games)

    @property
    def num_groups(self) -> int:
        """The estimator's groups: (game, seat), group ``game * 2 + seat``."""
        return 2 * len(self.config.games)

    @functools.cached_property
    def sampler(self) -> SamplerConfig:
        cfg = self.config
        return SamplerConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature,
                             pad_id=self.tokenizer.pad_id)

    @functools.cached_property
    def _rollouts(self) -> tuple:
        cfg = self.config
        return tuple(game_rollout(self.graphdef, g, cfg.episodes_per_game, self.sampler,
                                  g.spec.opponent(fixed_opponent(cfg.opponent, g.name), g.env) if cfg.fixed else None,
                                  mesh=self.mesh) for g in self.games)

    def rollout(self, policy, key, batch=None) -> tuple[Rollout, dict]:
        """-> (the turns of every game as one ``Rollout`` [G * T_g * B rows summed over games], with rewards [S] per
        (episode, seat) sample, S = 2 * G * B; metrics). ``batch``: unused (the games are drawn from ``key``)."""
        n_ep, pad, width = self.config.episodes_per_game, self.tokenizer.pad_id, self.prompt_len
        parts, returns, finished, metrics, active = [], [], [], {}, 0
        keys = jax.random.split(key, len(self.games))
        for g, (game, roll, k) in enumerate(zip(self.games, self._rollouts, keys)):
            turns, games = roll(policy, k)
            turns = turns.replace(  # every row's prompt padded to the longest game's, its length the game's
                prompts=jnp.pad(turns.prompts, ((0, 0), (0, 0), (0, width - game.prompt_len)), constant_values=pad),
                prompt_lens=jnp.full(turns.prompt_lens.shape, game.prompt_len, jnp.int32))
            episode = g * n_ep + jnp.arange(n_ep, dtype=jnp.int32)
            sample = episode[None] * 2 + jnp.clip(turns.info["player"], 0, 1)  # [T, B]: the (episode, seat) it trains
            parts.append(turns.to_rollout(None, active=turns.info["active"], pad_id=pad, sample=sample.reshape(-1)))
            returns.append(games.returns.reshape(-1))
            finished.append(jnp.repeat(games.finished, 2))
            metrics.update(game_metrics(game.name, turns, games))
            active = active + turns.info["active"].sum()
        rollout = jax.tree.map(lambda *x: jnp.concatenate(x), *parts)
        s = jnp.arange(2 * len(self.games) * n_ep)
        rollout = rollout.replace(rewards=jnp.concatenate(returns), groups=(s // 2 // n_ep) * 2 + s % 2,
                                  valid=jnp.concatenate(finished), num_groups=self.num_groups)
        metrics["active_turns"] = active  # the LM's turns of live games: the rows trained
        return rollout, metrics

    def metrics(self, state) -> dict:
        """The per-game baselines of a stateful estimator (``<game>/baseline0``, ``/baseline1``) after the update."""
        b = state.advantage_carry
        if b is None or getattr(b, "shape", None) != (self.num_groups,):
            return {}
        return {f"{name}/baseline{seat}": b[2 * g + seat] for g, name in enumerate(self.config.games)
                for seat in (0, 1)}

    def evaluate(self, policy, key, batch: str | None = None) -> dict:
        """Win rates of the LM against the fixed opponent ``batch`` (default ``"random"``) in every game, over
        ``episodes_per_game`` games each (seats alternate): ``<game>/<win|draw|loss|forfeit|mean_return|...>``."""
        from jaxrl_reason.agents.spiral.evaluation import win_rates

        out = {}
        for game, k in zip(self.config.games, jax.random.split(key, len(self.config.games))):
            r = win_rates(self.graphdef, policy, game, fixed_opponent(batch or "random", game),
                          self.config.episodes_per_game, self.sampler, k, self.config.prompt_style,
                          tokenizer=self.tokenizer)
            out.update({f"{game}/{name}": v for name, v in r.items()})
        return out


def game_metrics(name: str, turns, games) -> dict:
    """Per-game metrics of one batch of episodes (``turns``: ``rl.lm.multiturn.Turns``, ``games``: ``Games``)."""
    active, status = turns.info["active"], turns.info["status"]
    act = active.astype(jnp.float32)
    n_act = jnp.maximum(act.sum(), 1.0)
    ret = games.returns
    lm = jnp.where(games.lm_seat < 0, 0, games.lm_seat)
    r_lm = jnp.take_along_axis(ret, lm[:, None], 1)[:, 0]
    r_other = jnp.take_along_axis(ret, 1 - lm[:, None], 1)[:, 0]
    m = {  # a forfeit (offender -1, opponent 0) counts as a win of the opponent
        "win0": (ret[:, 0] > ret[:, 1]).mean(),  # seat 0 (self-play)
        "win_lm": (r_lm > r_other).mean(),  # the LM's seat (fixed opponent; seat 0 in self-play)
        "draw": (ret[:, 0] == ret[:, 1]).mean(),
        "forfeit": games.forfeit.any(1).mean(),
        "format_error": ((status != gtext.OK) * act).sum() / n_act,
        "response_length": (turns.lengths * act).sum() / n_act,
        "turns": act.sum() / active.shape[1],
        "reward_var": ret.var(0).mean(),  # the returns' variance over episodes, per seat (a baseline's group)
    }
    return {f"{name}/{k}": v for k, v in m.items()}


def spiral_learner(config: SpiralConfig, model, *, tokenizer: Tokenizer) -> tuple[Learner, SpiralAgent]:
    """-> (the learner of ``model``, its ``SpiralAgent``), checked: the model's window and vocabulary hold the
    games' prompts and answers in ``tokenizer``'s ids, the episodes divide over the mesh's data axis."""
    prompt_len = max(LMGame.make(g, config.prompt_style, tokenizer=tokenizer).prompt_len for g in config.games)
    n = config.max_new_tokens
    model.cfg.check_cache(prompt_len, n, prompt_len + n)
    tokenizer.check_model(model.cfg, prompt_len + n, "SpiralAgent")
    data_mesh(config.mesh, {"episodes_per_game": config.episodes_per_game}, "SpiralConfig")
    learner = Learner(config.learner_config(), model)
    return learner, SpiralAgent(learner.graphdef, config, tokenizer, learner.mesh)


__all__ = ["SpiralAgent", "SpiralConfig", "fixed_opponent", "game_metrics", "spiral_learner"]
