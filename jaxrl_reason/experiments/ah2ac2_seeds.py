"""AH2AC2's IPPO arm over several seeds: the held-out-partner score's spread from seed to seed.

Trains 2-player Hanabi IPPO self-play (``agents.hanabi.ippo``, AH2AC2's cpu-preset budget) once per seed
and scores each policy with the held-out ``colour_cautious`` bot over ``eval_games`` games; reports each
seed's mean ± SE, the mean over seeds ± its SE (n = seeds) and the seed-to-seed standard deviation. It
separates a change of training code from the draw of one run (one seed's evaluation SE says nothing
about the next seed). The seeds' keys are those of ``experiments/ah2ac2.py`` (IPPO key 1, evaluation
key 3 of ``split(key(seed), 6)``), so seed 0 is that experiment's IPPO arm trained alone.

Ablations of the on-policy trainer's choices: ``--ippo.adv-norm minibatch`` (standardise per minibatch),
``--ippo.adam-eps 1e-8`` (optax's default) and ``--fixed-init`` (every seed starts from the parameters of
``make_policy(env, hidden, 0)``, as the IPPO loop before the one trainer did; the seed then varies only the
games and the sampling).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.agents.hanabi import ippo, play
from jaxrl_reason.agents.hanabi.bots import BOTS
from jaxrl_reason.envs.hanabi import Hanabi
from jaxrl_reason.experiments.ah2ac2 import PRESETS as AH2AC2_PRESETS
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seeds: int = 4
    first_seed: int = 0
    ippo: ippo.IPPOConfig = AH2AC2_PRESETS["cpu"].ippo
    eval_games: int = 1000
    fixed_init: bool = False  # every seed starts from make_policy(env, hidden, 0)

    def __post_init__(self):
        check_hyperparameters(self)
        if self.seeds < 2:
            raise ValueError(f"seeds must be >= 2 (a spread needs two runs), got {self.seeds}")
        if self.eval_games < 2:
            raise ValueError("eval_games must be >= 2")


PRESETS = {"cpu": Config(), "gpu": Config(ippo=AH2AC2_PRESETS["gpu"].ippo, eval_games=5000)}


def run(config: Config, run_dir: RunDir) -> dict:
    env = Hanabi(num_players=2)
    held_out = play.bot_agent(env, BOTS["colour_cautious"])
    init = nnx.state(ippo.make_policy(env, config.ippo.hidden, 0)) if config.fixed_init else None
    graphdef, train = ippo.make_train(dataclasses.replace(config.ippo, hdr_lambda=0.0), env, init_params=init)
    train = jax.jit(train)
    scores, rows = [], []
    for seed in range(config.first_seed, config.first_seed + config.seeds):
        keys = jax.random.split(jax.random.key(seed), 6)
        params, m = train(keys[1])
        res = play.cross_play(env, [play.policy_agent("IPPO", graphdef, params)], keys[3], config.eval_games,
                              partners=[held_out])
        mean, sem = float(res["mean"][0, 0]), float(res["sem"][0, 0])
        selfplay = float(np.nanmean(np.asarray(m["episode_score"])[-5:]))
        scores.append(mean)
        rows.append({"seed": seed, "with colour_cautious": f"{mean:.2f} ± {sem:.2f}", "self-play (last 5)": f"{selfplay:.2f}"})
        run_dir.log(seed, {"heldout": mean, "heldout_sem": sem, "selfplay_last": selfplay})
        print(f"seed {seed}: with colour_cautious {mean:.2f} ± {sem:.2f} (n = {res['games']}), self-play {selfplay:.2f}")
    s = np.asarray(scores)
    rows.append({"seed": "mean ± SE over seeds", "with colour_cautious": f"{s.mean():.2f} ± {s.std(ddof=1) / np.sqrt(len(s)):.2f}",
                 "self-play (last 5)": ""})
    print(run_dir.write_table("ippo_seeds", rows))
    return {"heldout_mean": float(s.mean()), "heldout_se_over_seeds": float(s.std(ddof=1) / np.sqrt(len(s))),
            "heldout_seed_std": float(s.std(ddof=1)), "heldout_per_seed": s.tolist(), "seeds": len(s),
            "games_per_seed": config.eval_games, "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
