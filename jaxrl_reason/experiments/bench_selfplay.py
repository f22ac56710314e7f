"""On-device multi-turn LM self-play rollout vs the same rollout driven turn by turn from Python.

Both use the same LM, the same jitted sampler and the same keys (so they play the same games):

- ``device``: ``agents.spiral.rollout.game_rollout`` -- every turn (render -> sample -> parse ->
  step) of the whole episode batch inside one jitted ``lax.scan``;
- ``python``: ``python_rollout`` -- a Python loop over turns: a jitted render+sample call, the
  answers copied to the host, decoded to strings and parsed in Python (as a text-arena harness
  does), a jitted batched env step, and an early exit once every game has ended.

The LM gets a short SFT warm start first (``warm_steps``) so that games last several turns (an
untrained LM forfeits on its first answer). Reports episodes/s of both and the ratio.

    python experiments/bench_selfplay.py --preset cpu
"""

from __future__ import annotations

import dataclasses
import time

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.agents.spiral.rollout import GAMES, LMGame, game_rollout, python_rollout
from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, warm_start
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

VOCAB_SIZE = spiral_tokenizer().vocab_size  # 264: 8 special tokens + 256 bytes


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    game: str = "kuhn_poker"
    num_episodes: int = 32
    max_new_tokens: int = 24
    lm: LMConfig = LMConfig(vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                            max_seq_len=512)
    warm: WarmStartConfig = WarmStartConfig(games_per_game=64, steps=100, batch_size=16)
    repeats: int = 2

    def __post_init__(self):
        check_hyperparameters(self)
        if self.game not in GAMES:
            raise ValueError(f"unknown SPIRAL game {self.game!r}; choose from {GAMES}")
        n = spiral_tokenizer().vocab_size
        if self.lm.vocab_size != n:
            raise ValueError(f"lm.vocab_size must be {n} (the SPIRAL tokenizer), got {self.lm.vocab_size}")
        if self.num_episodes < 1 or self.repeats < 1:
            raise ValueError("num_episodes and repeats must be >= 1")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(game="tictactoe", num_episodes=1024, max_new_tokens=32,
                  lm=LMConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768,
                              max_seq_len=512),
                  warm=WarmStartConfig(games_per_game=512, steps=400, batch_size=64, lr=1e-3), repeats=5),
}


def run(config: Config, run_dir: RunDir) -> dict:
    tok = spiral_tokenizer()
    model = Transformer(config.lm, rngs=nnx.Rngs(config.seed))
    warm_start(model, (config.game,), config.warm, seed=config.seed, tokenizer=tok)
    graphdef, params = nnx.split(model)
    game = LMGame.make(config.game, tokenizer=tok)
    sampler = SamplerConfig(max_new_tokens=config.max_new_tokens, temperature=1.0, pad_id=tok.pad_id)
    device = jax.jit(game_rollout(graphdef, game, config.num_episodes, sampler))
    keys = [jax.random.key(config.seed + 100 + i) for i in range(config.repeats + 1)]
    # warm-up (compilation) for both
    jax.block_until_ready(device(params, keys[0]))
    python_rollout(graphdef, game, config.num_episodes, sampler, params, keys[0])
    t_dev, t_py, same = [], [], []
    for k in keys[1:]:
        t = time.perf_counter()
        turns, games = jax.block_until_ready(device(params, k))
        t_dev.append(time.perf_counter() - t)
        t = time.perf_counter()
        py = python_rollout(graphdef, game, config.num_episodes, sampler, params, k)
        t_py.append(time.perf_counter() - t)
        same.append(bool(np.allclose(np.asarray(games.returns), py["returns"])))
    act = np.asarray(turns.info["active"])
    row = {
        "game": config.game, "episodes": config.num_episodes, "backend": jax.default_backend(),
        "mean_turns": float(act.sum(0).mean()),
        "forfeit_rate": float(np.asarray(games.forfeit).any(1).mean()),
        "device_s": float(np.median(t_dev)), "python_s": float(np.median(t_py)),
        "device_episodes_per_s": config.num_episodes / float(np.median(t_dev)),
        "python_episodes_per_s": config.num_episodes / float(np.median(t_py)),
        "same_games": all(same),
    }
    row["speedup"] = row["python_s"] / row["device_s"]
    print(run_dir.write_table("bench_selfplay", [row]))
    run_dir.save_json("bench_selfplay", row)
    return row


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
