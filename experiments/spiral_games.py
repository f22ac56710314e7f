"""SPIRAL's games with small policies: AlphaZero on TicTacToe, PPO self-play (with and without RAE)
on Kuhn Poker and Simple Negotiation.

Writes learning curves (``curves_*.png``), metrics and a results table (``results.md``):
TicTacToe win/draw/loss vs random and vs the perfect minimax player from both seats, Kuhn Poker
exact exploitability over training, negotiation payoff vs a fixed heuristic, per advantage mode.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrl_reason import envs
from jaxrl_reason.envs.games import arena, opponents as O
from jaxrl_reason.rl.selfplay import SelfPlay, SelfPlayConfig, kuhn_exploitability_metric
from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig
from jaxrl_reason.utils.experiment import RunDir


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    tictactoe: AlphaZeroConfig = AlphaZeroConfig()
    ttt_eval_games: int = 1000
    ttt_eval_simulations: int = 64
    kuhn: SelfPlayConfig = SelfPlayConfig(env="kuhn_poker", num_updates=300)
    negotiation: SelfPlayConfig = SelfPlayConfig(env="negotiation", num_updates=150, rollout_length=20,
                                                 hidden=(128, 128))
    advantages: tuple[str, ...] = ("rae", "none")
    neg_eval_games: int = 1000
    log_every: int = 10

    def __post_init__(self):
        if self.ttt_eval_games < 1 or self.neg_eval_games < 1 or self.log_every < 1:
            raise ValueError("ttt_eval_games, neg_eval_games and log_every must be >= 1")
        if self.tictactoe.env != "tictactoe" or self.kuhn.env != "kuhn_poker" or self.negotiation.env != "negotiation":
            raise ValueError("the sub-configs must name tictactoe, kuhn_poker and negotiation")
        for a in self.advantages:
            SelfPlayConfig(advantage=a)  # validates the name


PRESETS = {
    "cpu": Config(),
    "gpu": Config(
        tictactoe=AlphaZeroConfig(num_envs=1024, num_simulations=64, num_iterations=200, minibatch_size=2048),
        kuhn=SelfPlayConfig(env="kuhn_poker", num_envs=2048, num_updates=1000),
        negotiation=SelfPlayConfig(env="negotiation", num_envs=2048, num_updates=500, rollout_length=20,
                                   hidden=(128, 128)),
    ),
}


def _both_seats(env, agent, opponent, key, n):
    play = jax.jit(lambda k, players: arena.play(env, players, k, n), static_argnums=1)
    k0, k1 = jax.random.split(key)
    first, _ = play(k0, (agent, opponent))
    second, _ = play(k1, (opponent, agent))
    return arena.summarize(first, 0), arena.summarize(second, 1)


def train_tictactoe(config: Config, run_dir: RunDir) -> list[dict]:
    az = AlphaZero(config.tictactoe)
    state = az.init(jax.random.key(config.seed))
    for i in tqdm(range(config.tictactoe.num_iterations), desc="tictactoe alphazero"):
        state, m = az.iteration(state)
        if i % config.log_every == 0 or i == config.tictactoe.num_iterations - 1:
            run_dir.log(i, {f"ttt/{k}": v for k, v in m.items()})
    env = envs.make("tictactoe")
    agent = az.agent(config.ttt_eval_simulations)(state.params)
    rows = []
    for name, opp in (("minimax", O.batched(O.minimax_action)), ("random", O.batched(O.random_action))):
        first, second = _both_seats(env, agent, opp, jax.random.key(config.seed + 1), config.ttt_eval_games)
        for seat, r in (("first", first), ("second", second)):
            rows.append({"game": "tictactoe", "method": "alphazero", "opponent": name, "seat": seat, **r})
    return rows


def train_selfplay(sp_config: SelfPlayConfig, adv: str, config: Config, run_dir: RunDir, metrics_fn=None):
    sp = SelfPlay(dataclasses.replace(sp_config, advantage=adv, seed=config.seed), metrics_fn=metrics_fn)
    state = sp.init(jax.random.key(config.seed))
    history = []
    for i in tqdm(range(sp.config.num_updates), desc=f"{sp_config.env} {adv}"):
        state, m = sp.update(state)
        if i % config.log_every == 0 or i == sp.config.num_updates - 1:
            m = {k: float(v) for k, v in m.items()}
            history.append(m)
            run_dir.log(i, {f"{sp_config.env}_{adv}/{k}": v for k, v in m.items()})
    return sp, state, history


def run(config: Config, run_dir: RunDir) -> dict:
    rows = train_tictactoe(config, run_dir)
    run_dir.plot(["ttt/value_mse", "ttt/policy_ce"], "curves_tictactoe.png")
    summary = {}
    for adv in config.advantages:
        sp, state, hist = train_selfplay(config.kuhn, adv, config, run_dir, kuhn_exploitability_metric)
        final = float(kuhn_exploitability_metric(lambda o, m: sp.probs(state.params, o, m))["exploitability"])
        best = min(h["exploitability"] for h in hist)
        rows.append({"game": "kuhn_poker", "method": f"ppo-selfplay-{adv}", "opponent": "best response",
                     "seat": "both", "exploitability_final": final, "exploitability_best_logged": best})
        summary[f"kuhn_{adv}_exploitability"] = final
    run_dir.plot([f"kuhn_poker_{a}/exploitability" for a in config.advantages], "curves_kuhn.png")
    neg_env = envs.make("negotiation")
    heuristic = O.batched(O.negotiation_heuristic_action(neg_env))
    for adv in config.advantages:
        sp, state, _ = train_selfplay(config.negotiation, adv, config, run_dir)
        first, second = _both_seats(neg_env, sp.policy_player(state.params), heuristic,
                                    jax.random.key(config.seed + 2), config.neg_eval_games)
        for seat, r in (("first", first), ("second", second)):
            rows.append({"game": "negotiation", "method": f"ppo-selfplay-{adv}", "opponent": "heuristic",
                         "seat": seat, **r})
        summary[f"negotiation_{adv}_mean_return"] = 0.5 * (first["mean_return"] + second["mean_return"])
    run_dir.plot([f"negotiation_{a}/return_p0" for a in config.advantages], "curves_negotiation.png")
    for r in rows:
        if r["game"] == "tictactoe":
            summary[f"ttt_vs_{r['opponent']}_{r['seat']}_loss"] = r["loss"]
            summary[f"ttt_vs_{r['opponent']}_{r['seat']}_win"] = r["win"]
    table = run_dir.write_table("results", rows)
    print(table)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
