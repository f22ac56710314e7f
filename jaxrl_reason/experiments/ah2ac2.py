"""AH2AC2-style ad-hoc coordination study in 2-player Hanabi, on data we generate.

1. "Human-like" records: convention bots (cautious, discard_oldest) play each other;
   games are written in the hanab.live JSON style, loaded back and validated by replay.
2. BC (GRU) on those records; IPPO self-play from scratch; HDR-IPPO
   (loss = (1-lambda) PPO + lambda KL(pi_BC || pi)) started from the BC policy.
3. Evaluation with a held-out bot (colour_cautious, never in the data) and a random
   partner: mean score +- standard error over ``eval_games`` games per pairing.
4. 3-player cross-play (``crossplay_3p``): the convention bots and a random agent with the
   held-out bot and the data bots as partners (the learned policies above are 2-player).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_reason.agents.hanabi import bc, ippo, play, records
from jaxrl_reason.agents.hanabi.bots import BOTS
from jaxrl_reason.envs.hanabi import Hanabi
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    num_records: int = 256
    bc: bc.BCConfig = bc.BCConfig()
    ippo: ippo.IPPOConfig = ippo.IPPOConfig()
    hdr_lambda: float = 0.25
    eval_games: int = 1000
    crossplay_3p: bool = True

    def __post_init__(self):
        check_hyperparameters(self)
        if self.num_records < self.bc.batch_games:
            raise ValueError(f"num_records={self.num_records} < bc.batch_games={self.bc.batch_games}")
        if not 0.0 < self.hdr_lambda <= 1.0:
            raise ValueError(f"hdr_lambda must be in (0, 1], got {self.hdr_lambda}")
        if self.eval_games < 2:
            raise ValueError("eval_games must be >= 2")


PRESETS = {
    "cpu": Config(num_records=256, bc=bc.BCConfig(epochs=30, hidden=128, lr=3e-3),
                  ippo=ippo.IPPOConfig(num_envs=64, num_steps=32, num_updates=150, hidden=128, lr=2.5e-3,
                                       update_epochs=4, num_minibatches=4),
                  eval_games=1000),
    "gpu": Config(num_records=2048, bc=bc.BCConfig(epochs=60, hidden=256, batch_games=128, lr=1e-3),
                  ippo=ippo.IPPOConfig(num_envs=1024, num_steps=64, num_updates=300, hidden=256, lr=5e-4,
                                       update_epochs=4, num_minibatches=8),
                  eval_games=5000),
}


def run(config: Config, run_dir: RunDir) -> dict:
    env = Hanabi(num_players=2)
    cfg = env.config
    keys = jax.random.split(jax.random.key(config.seed), 6)
    human = [play.bot_agent(env, BOTS["cautious"]), play.bot_agent(env, BOTS["discard_oldest"])]

    # 1. records from the "human" bots, written, loaded, replayed
    recs = []
    pairs = [(0, 0), (0, 1), (1, 0), (1, 1)]
    per = config.num_records // len(pairs)
    for (i, j), k in zip(pairs, jax.random.split(keys[0], len(pairs))):
        out = play.play_games(env, [human[i], human[j]], k, per)
        for g in range(per):
            acts = [int(a) for a in out["actions"][g] if a >= 0]
            recs.append(records.game_to_record(cfg, len(recs), out["decks"][g], acts, out["scores"][g],
                                               players=[human[i].name, human[j].name]))
    path = records.write_records(run_dir.path / "records.json", recs)
    games = records.load_records(cfg, path)
    games, data = records.replay(cfg, games)
    print(f"records: {len(games.ids)} valid, {len(games.rejected)} rejected, mean score {data['scores'].mean():.2f}")

    # 2. BC, IPPO, HDR-IPPO
    bc_gd, bc_params, bc_m = bc.train_bc(config.bc, env, data)
    ic = config.ippo
    gd, train = ippo.make_train(dataclasses.replace(ic, hdr_lambda=0.0), env)
    ippo_params, ippo_m = jax.jit(train)(keys[1])
    hdr_cfg = dataclasses.replace(ic, hdr_lambda=config.hdr_lambda, hidden=config.bc.hidden)
    _, train_hdr = ippo.make_train(hdr_cfg, env, bc=(bc_gd, bc_params), init_params=bc_params)
    hdr_params, hdr_m = jax.jit(train_hdr)(keys[2])
    for u in range(ic.num_updates):
        run_dir.log(u, {"ippo_score": ippo_m["episode_score"][u], "hdr_score": hdr_m["episode_score"][u],
                        "hdr_kl_bc": hdr_m["kl_bc"][u], "ippo_entropy": ippo_m["entropy"][u]})
    for e, (loss, acc) in enumerate(zip(bc_m["loss"], bc_m["accuracy"])):
        run_dir.log(e, {"bc_loss": loss, "bc_accuracy": acc})
    run_dir.plot(["ippo_score", "hdr_score", "hdr_kl_bc"], "training.png", title="self-play training score")
    run_dir.plot(["bc_loss", "bc_accuracy"], "bc.png", title="behaviour cloning")

    # 3. ad-hoc evaluation with held-out partners
    agents = [play.random_agent(), play.policy_agent("BC", bc_gd, bc_params),
              play.policy_agent("IPPO", gd, ippo_params), play.policy_agent("HDR-IPPO", bc_gd, hdr_params)]
    partners = [play.bot_agent(env, BOTS["colour_cautious"]), *agents[1:]]
    res = play.cross_play(env, agents, keys[3], config.eval_games, partners=partners)
    play.plot_matrix(res, run_dir.path / "crossplay.png")
    rows = [{"agent": a, **{f"with {p}": f"{res['mean'][i, j]:.2f} ± {res['sem'][i, j]:.2f}"
                           for j, p in enumerate(res["partners"])}} for i, a in enumerate(res["names"])]
    print(run_dir.write_table("crossplay", rows))
    run_dir.save_json("crossplay", {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in res.items()})
    held = res["mean"][:, 0]
    summary = {}
    if config.crossplay_3p:
        env3 = Hanabi(num_players=3)
        bots3 = {name: play.bot_agent(env3, BOTS[name]) for name in ("cautious", "discard_oldest", "colour_cautious")}
        rows3 = [play.random_agent(), bots3["cautious"], bots3["discard_oldest"]]
        partners3 = [bots3["colour_cautious"], bots3["cautious"], bots3["discard_oldest"]]
        res3 = play.cross_play(env3, rows3, keys[4], config.eval_games, partners=partners3)
        play.plot_matrix(res3, run_dir.path / "crossplay_3p.png", title="3-player cross-play mean score")
        rows = [{"agent": a, **{f"with 2x {p}": f"{res3['mean'][i, j]:.2f} ± {res3['sem'][i, j]:.2f}"
                                for j, p in enumerate(res3["partners"])}} for i, a in enumerate(res3["names"])]
        print(run_dir.write_table("crossplay_3p", rows))
        run_dir.save_json("crossplay_3p", {k: (v.tolist() if isinstance(v, np.ndarray) else v) for k, v in res3.items()})
        summary = {"3p_heldout_random": float(res3["mean"][0, 0]), "3p_heldout_cautious": float(res3["mean"][1, 0]),
                   "3p_heldout_discard_oldest": float(res3["mean"][2, 0]), "3p_games_per_pair": res3["games"]}
    return {**summary,
        "records_valid": len(games.ids), "records_mean_score": float(data["scores"].mean()),
        "bc_accuracy": float(bc_m["accuracy"][-1]),
        "ippo_selfplay_first": float(np.nanmean(ippo_m["episode_score"][:5])),
        "ippo_selfplay_last": float(np.nanmean(ippo_m["episode_score"][-5:])),
        "heldout_random": float(held[0]), "heldout_bc": float(held[1]),
        "heldout_ippo": float(held[2]), "heldout_hdr_ippo": float(held[3]),
        "heldout_sem_max": float(res["sem"][:, 0].max()), "games_per_pair": res["games"],
        "run_dir": str(run_dir.path),
    }


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
