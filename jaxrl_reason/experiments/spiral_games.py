"""SPIRAL's games with small policies: AlphaZero on TicTacToe, PPO self-play (with and without RAE)
on Kuhn Poker and Simple Negotiation.

Writes learning curves (``curves_*.png``), metrics and a results table (``results.md``):

- TicTacToe: win/draw/loss of the AlphaZero agent (network + Gumbel MuZero search at play time)
  and, for reference, of its network alone (greedy), vs uniform random and vs the perfect
  minimax player (uniform among optimal moves, so games differ), ``ttt_eval_games`` games per
  seat; the curve tracks the network alone vs minimax during training.
- Kuhn Poker: exact exploitability of the *current* policy and of the *time-averaged* policy
  (sequence-form average of every update's policy, ``envs.games.kuhn_poker.average_*``; self-play
  converges in average, the current iterate cycles), per advantage mode.
- Negotiation: payoff vs the fixed heuristic from both seats, per advantage mode.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from tqdm.auto import tqdm

from jaxrl_reason import envs
from jaxrl_reason.envs.games import arena, game_spec, kuhn_poker
from jaxrl_reason.envs.games import opponents as O
from jaxrl_reason.rl.selfplay import SelfPlay, SelfPlayConfig
from jaxrl_reason.search.alphazero import AlphaZero, AlphaZeroConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    tictactoe: AlphaZeroConfig = AlphaZeroConfig(explore_eps=0.2, sgd_steps=16, num_iterations=80)
    ttt_eval_games: int = 1000
    ttt_curve_games: int = 200
    ttt_eval_simulations: int = 64
    kuhn: SelfPlayConfig = SelfPlayConfig(env="kuhn_poker", num_updates=300)
    negotiation: SelfPlayConfig = SelfPlayConfig(env="negotiation", num_updates=150, num_steps=20,
                                                 hidden=(128, 128))
    advantages: tuple[str, ...] = ("rae", "none")
    neg_eval_games: int = 1000
    log_every: int = 10

    def __post_init__(self):
        check_hyperparameters(self)
        if min(self.ttt_eval_games, self.ttt_curve_games, self.neg_eval_games, self.log_every) < 1:
            raise ValueError("ttt_eval_games, ttt_curve_games, neg_eval_games and log_every must be >= 1")
        if self.tictactoe.env != "tictactoe" or self.kuhn.env != "kuhn_poker" or self.negotiation.env != "negotiation":
            raise ValueError("the sub-configs must name tictactoe, kuhn_poker and negotiation")
        for a in self.advantages:
            SelfPlayConfig(advantage=a)  # validates the name


PRESETS = {
    "cpu": Config(),
    "gpu": Config(
        tictactoe=AlphaZeroConfig(num_envs=1024, num_simulations=64, num_iterations=200, minibatch_size=2048,
                                  explore_eps=0.2, sgd_steps=32),
        kuhn=SelfPlayConfig(env="kuhn_poker", num_envs=2048, num_updates=1000),
        negotiation=SelfPlayConfig(env="negotiation", num_envs=2048, num_updates=500, num_steps=20,
                                   hidden=(128, 128)),
    ),
}


def _both_seats(env, agent, opponent, key, n):
    play = jax.jit(lambda k, players: arena.play(env, players, k, n), static_argnums=1)
    k0, k1 = jax.random.split(key)
    first, _ = play(k0, (agent, opponent))
    second, _ = play(k1, (opponent, agent))
    return arena.summarize(first, 0), arena.summarize(second, 1)


def network_player(az: AlphaZero, params):
    """The AlphaZero network alone: greedy on its policy head (no search)."""

    def act(key, state, ts):
        obs, mask = arena.mover_view(ts)
        logits, _ = az.evaluate(params, obs, mask)
        return logits.argmax(-1).astype(jax.numpy.int32)

    return act


def train_tictactoe(config: Config, run_dir: RunDir) -> list[dict]:
    az = AlphaZero(config.tictactoe)
    state = az.init(jax.random.key(config.seed))
    env = envs.make("tictactoe")
    minimax = O.batched(game_spec("tictactoe").opponent("minimax", env))
    n = config.ttt_curve_games
    curve = jax.jit(lambda params, key: (
        arena.play(env, (network_player(az, params), minimax), key, n)[0][:, 0],
        arena.play(env, (minimax, network_player(az, params)), key, n)[0][:, 1]))
    for i in tqdm(range(config.tictactoe.num_iterations), desc="tictactoe alphazero"):
        state, m = az.iteration(state)
        if i % config.log_every == 0 or i == config.tictactoe.num_iterations - 1:
            first, second = curve(state.params, jax.random.key(i))
            m = {**m, "net_loss_vs_minimax_first": (first < 0).mean(), "net_loss_vs_minimax_second": (second < 0).mean()}
            run_dir.log(i, {f"ttt/{k}": v for k, v in m.items()})
    players = {"alphazero (net + search)": az.agent(config.ttt_eval_simulations)(state.params),
               "network only (greedy)": network_player(az, state.params)}
    rows = []
    for method, agent in players.items():
        for name, opp in (("minimax", minimax), ("random", O.batched(O.random_action))):
            first, second = _both_seats(env, agent, opp, jax.random.key(config.seed + 1), config.ttt_eval_games)
            for seat, r in (("first", first), ("second", second)):
                rows.append({"game": "tictactoe", "method": method, "opponent": name, "seat": seat,
                             "games": config.ttt_eval_games, **r})
    return rows


def train_selfplay(sp_config: SelfPlayConfig, adv: str, config: Config, run_dir: RunDir, kuhn: bool = False):
    """PPO self-play; for Kuhn Poker also the exploitability of the current and the averaged policy."""
    sp = SelfPlay(dataclasses.replace(sp_config, advantage=adv, seed=config.seed))
    state = sp.init(jax.random.key(config.seed))
    table = jax.jit(lambda params: kuhn_poker.policy_table(lambda o, m: sp.probs(params, o, m)))
    avg = kuhn_poker.average_init()
    history = []
    for i in tqdm(range(sp.config.num_updates), desc=f"{sp_config.env} {adv}"):
        state, m = sp.update(state)
        if kuhn:
            pi = table(state.params)
            avg = kuhn_poker.average_update(avg, pi)
            m = {**m, "exploitability": kuhn_poker.exploitability(pi),
                 "exploitability_avg": kuhn_poker.exploitability(kuhn_poker.average_policy(avg))}
        if i % config.log_every == 0 or i == sp.config.num_updates - 1:
            m = {k: float(v) for k, v in m.items()}
            history.append(m)
            run_dir.log(i, {f"{sp_config.env}_{adv}/{k}": v for k, v in m.items()})
    return sp, state, history, (kuhn_poker.average_policy(avg) if kuhn else None)


def run(config: Config, run_dir: RunDir) -> dict:
    rows = train_tictactoe(config, run_dir)
    run_dir.plot(["ttt/value_mse", "ttt/policy_ce", "ttt/net_loss_vs_minimax_first", "ttt/net_loss_vs_minimax_second"],
                 "curves_tictactoe.png")
    summary = {}
    for adv in config.advantages:
        sp, state, hist, avg = train_selfplay(config.kuhn, adv, config, run_dir, kuhn=True)
        final = hist[-1]["exploitability"]
        avg_expl = hist[-1]["exploitability_avg"]
        run_dir.save_json(f"kuhn_{adv}_average_policy.json", {"bet_or_call_prob[card][history]": np.asarray(avg).tolist()})
        for policy, value in (("current (final iterate)", final), ("time-averaged (all iterates)", avg_expl)):
            rows.append({"game": "kuhn_poker", "method": f"ppo-selfplay-{adv}", "opponent": "best response",
                         "seat": "both", "policy": policy, "exploitability": value})
        summary[f"kuhn_{adv}_exploitability_current"] = final
        summary[f"kuhn_{adv}_exploitability_average"] = avg_expl
    run_dir.plot([f"kuhn_poker_{a}/{k}" for a in config.advantages for k in ("exploitability", "exploitability_avg")],
                 "curves_kuhn.png")
    neg_env = envs.make("negotiation")
    heuristic = O.batched(game_spec("negotiation").opponent("heuristic", neg_env))
    for adv in config.advantages:
        sp, state, _, _ = train_selfplay(config.negotiation, adv, config, run_dir)
        first, second = _both_seats(neg_env, sp.policy_player(state.params), heuristic,
                                    jax.random.key(config.seed + 2), config.neg_eval_games)
        for seat, r in (("first", first), ("second", second)):
            rows.append({"game": "negotiation", "method": f"ppo-selfplay-{adv}", "opponent": "heuristic",
                         "seat": seat, **r})
        summary[f"negotiation_{adv}_mean_return"] = 0.5 * (first["mean_return"] + second["mean_return"])
    run_dir.plot([f"negotiation_{a}/return_p0" for a in config.advantages], "curves_negotiation.png")
    for r in rows:
        if r["game"] == "tictactoe" and r["method"].startswith("alphazero"):
            summary[f"ttt_vs_{r['opponent']}_{r['seat']}_loss"] = r["loss"]
            summary[f"ttt_vs_{r['opponent']}_{r['seat']}_win"] = r["win"]
    table = run_dir.write_table("results", rows)
    print(table)
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
