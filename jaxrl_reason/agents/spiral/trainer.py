"""SPIRAL trainer: multi-game LM self-play with RAE, one jitted step per batch.

    trainer = SpiralTrainer(SpiralConfig(games=("tictactoe", "kuhn_poker")), model, tokenizer=spiral_tokenizer())
    state = trainer.init(jax.random.key(0))
    state, metrics = trainer.step(state)        # jitted: all rollouts + advantages + update

One step plays ``episodes_per_game`` games of every game in the config (each game's rollout is a
``lax.scan`` over turns inside the same jitted program), computes per-episode advantages
(``advantages.py``: RAE per (game, role), plain self-play, or a fixed opponent), gives every turn
of a role its episode's advantage, puts the turns of all games in one batch (prompts right-padded
to the longest game) and takes ``minibatches`` clipped policy-gradient steps (``rl/lm/loss``,
token-mean aggregation) on the stored per-turn token sequences: the turns are one ``rl.lm.Rollout``, the
update the learner core's (``rl.lm.make_update``) with the sampler's log-probs as the old policy's. Metrics are
global (``grad_norm``, ``loss``, ``entropy``, ...) and per game (``<game>/win0``, ``/draw``,
``/forfeit``, ``/format_error``, ``/response_length``, ``/baseline0``, ...).

Multi-device / multi-process: ``mesh="data=8"`` (or, in a multi-process run, ``mesh=None``: data over
every device of every process) splits each game's episodes over the data axis, each device playing its
slice of the one seeded batch; the state is replicated and the update's gradient is all-reduced by the
shardings, so the metrics are those of one device up to float rounding.
"""

from __future__ import annotations

import dataclasses

import flax
import jax
import jax.numpy as jnp
import optax
from flax import nnx

from jaxrl_reason.agents.spiral.advantages import MODES, episode_advantages, turn_advantages
from jaxrl_reason.agents.spiral.rollout import GAMES, LMGame, make_rollout
from jaxrl_reason.envs.games import game_spec
from jaxrl_reason.envs.games import text as gtext
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.models.lm.sequences import join, response_mask
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel.mesh import data_mesh, replicate
from jaxrl_reason.rl.lm.loss import LossConfig, make_loss
from jaxrl_reason.rl.lm import Rollout, UpdateConfig, lm_logp_fn, lm_optimizer, make_update, trainable_rows_only
from jaxrl_reason.rl.rae import init_baseline
from jaxrl_reason.utils.validation import POSITIVE, Range, Rule, at_least, check_hyperparameters, one_of, require


def fixed_opponent(opponent: str, game: str) -> str:
    """The name, among ``game``'s ``GameSpec.opponents``, of SpiralConfig's ``opponent``: ``"expert"`` is each
    game's expert (Tic-Tac-Toe's minimax, Kuhn Poker's Nash, ...), any other name is taken as is."""
    return game_spec(game).expert if opponent == "expert" else opponent


@dataclasses.dataclass(frozen=True)
class SpiralConfig:
    games: tuple[str, ...] = ("tictactoe", "kuhn_poker")
    episodes_per_game: int = 32
    advantage: str = "rae"  # rae | none | fixed (LM vs a fixed opponent)
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
              ("advantage", one_of(MODES)),
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


@flax.struct.dataclass
class SpiralState:
    params: nnx.State
    rest: nnx.State
    opt_state: optax.OptState
    baseline: jax.Array  # [num_games, 2] RAE baselines
    step: jax.Array
    key: jax.Array


class SpiralTrainer:
    """``tokenizer``: the LM's (``agents.spiral.tokenizer``: the presets' byte tokenizer, or a checkpoint's
    byte-level BPE): prompts, answer parsing, stops and padding."""

    def __init__(self, config: SpiralConfig, model, *, tokenizer: Tokenizer):
        self.config = config
        self.tokenizer = tokenizer
        self.games = [LMGame.make(g, config.prompt_style, tokenizer=tokenizer) for g in config.games]
        self.prompt_len = max(g.prompt_len for g in self.games)
        model.cfg.check_cache(self.prompt_len, config.max_new_tokens, self.prompt_len + config.max_new_tokens)
        tokenizer.check_model(model.cfg, self.prompt_len + config.max_new_tokens, "SpiralTrainer")
        self.graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        self._params, self._rest = params, rest
        self.full_graphdef = nnx.graphdef(model)
        self.sampler = SamplerConfig(max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                     pad_id=tokenizer.pad_id)
        self.optimizer = lm_optimizer(config.lr, config.max_grad_norm, config.adam_b2)
        self.mesh = data_mesh(config.mesh, {"episodes_per_game": config.episodes_per_game}, "SpiralConfig")
        self._step = _step_fn(self, config)

    def init(self, key: jax.Array, params: nnx.State | None = None) -> SpiralState:
        params = jax.tree.map(jnp.array, self._params if params is None else params)
        state = SpiralState(params=params, rest=self._rest, opt_state=self.optimizer.init(params),
                            baseline=init_baseline(len(self.games), 2), step=jnp.int32(0), key=key)
        if self.mesh is None:  # every leaf committed to the params' device, as the step's outputs are: else a
            # checkpoint's (committed) params beside uncommitted counters compile the step a second time
            leaf = jax.tree.leaves(params)[0]
            return state if isinstance(leaf, jax.core.Tracer) else jax.device_put(state, leaf.sharding)
        return replicate(state, self.mesh)

    def model(self, state: SpiralState):
        return nnx.merge(self.graphdef, state.params, state.rest)

    def step(self, state: SpiralState) -> tuple[SpiralState, dict]:
        return self._step(state)


def _step_fn(trainer: SpiralTrainer, cfg: SpiralConfig):
    graphdef, games, n_ep = trainer.graphdef, trainer.games, cfg.episodes_per_game
    opp = cfg.advantage == "fixed"
    rollouts = [make_rollout(graphdef, g, n_ep, trainer.sampler,
                             g.spec.opponent(fixed_opponent(cfg.opponent, g.name), g.env) if opp else None,
                             mesh=trainer.mesh) for g in games]
    p_max, n = trainer.prompt_len, cfg.max_new_tokens
    optimizer, pad_id = trainer.optimizer, trainer.tokenizer.pad_id
    logp_fn = lm_logp_fn(graphdef, n, cfg.temperature, cfg.logprob_chunk)
    if cfg.update_rows:
        logp_fn = trainable_rows_only(logp_fn, cfg.update_rows)
    # one pass of shuffled minibatches over the turns (their count need not divide), old = the sampler's log-probs
    learn = lambda logp: make_update(logp, make_loss(cfg.loss), optimizer,
                                     UpdateConfig(minibatches=cfg.minibatches, wrap=True, old_logp="sampler"))

    def step(state: SpiralState):
        key = jax.random.fold_in(state.key, state.step)
        k_roll, k_perm = jax.random.split(key)
        full = nnx.merge_state(state.params, state.rest)
        eps = [roll(full, k) for roll, k in zip(rollouts, jax.random.split(k_roll, len(games)))]
        returns = jnp.concatenate([e.returns for e in eps])
        game_ids = jnp.repeat(jnp.arange(len(games)), n_ep)
        valid = jnp.concatenate([e.finished for e in eps])
        adv_ep, baseline = episode_advantages(cfg.advantage, state.baseline, returns, game_ids, cfg.alpha, valid)
        rows = {k: [] for k in ("prompts", "tokens", "logprobs", "lengths", "active", "adv")}
        metrics = {}
        for g, (game, e) in enumerate(zip(games, eps)):
            t = e.turns
            adv = turn_advantages(adv_ep[g * n_ep:(g + 1) * n_ep], t.player)  # [T, B]
            flat = lambda x: x.reshape((-1,) + x.shape[2:])
            pad = p_max - game.prompt_len
            rows["prompts"].append(jnp.pad(flat(t.prompts), ((0, 0), (0, pad)), constant_values=pad_id))
            for k in ("tokens", "logprobs", "lengths", "active"):
                rows[k].append(flat(getattr(t, k)))
            rows["adv"].append(flat(adv))
            metrics.update(_game_metrics(game.name, e, baseline[g]))
        data = {k: jnp.concatenate(v) for k, v in rows.items()}
        plens = jnp.concatenate([jnp.full((game.max_turns * n_ep,), game.prompt_len, jnp.int32) for game in games])
        rollout = Rollout(join(data["prompts"], plens, data["tokens"], pad_id), plens,
                          response_mask(data["lengths"], n, data["active"]), data["adv"], sample_logp=data["logprobs"])
        (params, opt_state), m = learn(lambda p, rows: logp_fn(p, state.rest, rows))(
            state.params, state.opt_state, rollout, k_perm)
        metrics.update({k: v.mean() for k, v in m.items()})
        metrics["active_turns"] = data["active"].sum()
        metrics["mean_abs_adv"] = (jnp.abs(data["adv"]) * data["active"]).sum() / jnp.maximum(data["active"].sum(), 1)
        new = SpiralState(params=params, rest=state.rest, opt_state=opt_state, baseline=baseline,
                          step=state.step + 1, key=state.key)
        return new, metrics

    return jax.jit(step, donate_argnums=0)


def _game_metrics(name: str, e, baseline) -> dict:
    """Per-game metrics of one batch of episodes."""
    t = e.turns
    act = t.active.astype(jnp.float32)
    n_act = jnp.maximum(act.sum(), 1.0)
    lm = jnp.where(e.lm_seat < 0, 0, e.lm_seat)
    r_lm = jnp.take_along_axis(e.returns, lm[:, None], 1)[:, 0]
    r_other = jnp.take_along_axis(e.returns, 1 - lm[:, None], 1)[:, 0]
    m = {  # a forfeit (offender -1, opponent 0) counts as a win of the opponent
        "win0": (e.returns[:, 0] > e.returns[:, 1]).mean(),  # seat 0 (self-play)
        "win_lm": (r_lm > r_other).mean(),  # the LM's seat (fixed opponent; seat 0 in self-play)
        "draw": (e.returns[:, 0] == e.returns[:, 1]).mean(),
        "forfeit": e.forfeit.any(1).mean(),
        "format_error": ((t.status != gtext.OK) * act).sum() / n_act,
        "response_length": (t.lengths * act).sum() / n_act,
        "turns": act.sum() / t.active.shape[1],
        "baseline0": baseline[0],
        "baseline1": baseline[1],
    }
    return {f"{name}/{k}": v for k, v in m.items()}


__all__ = ["SpiralConfig", "SpiralState", "SpiralTrainer", "fixed_opponent"]
