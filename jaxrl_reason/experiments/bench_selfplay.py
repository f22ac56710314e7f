"""On-device multi-turn LM self-play rollout vs the same rollout driven turn by turn from Python, and the game's
rules prefix prefilled once per rollout vs every prompt prefilled whole.

All arms use the same LM, the same jitted sampler and the same keys (so they play the same games):

- ``device``: ``agents.spiral.rollout.game_rollout`` -- every turn (render -> sample -> parse ->
  step) of the whole episode batch inside one jitted ``lax.scan``; the LM responder keeps the cache of the
  prompts' shared prefix (``GameTextEnv.shared_prefix``: bos + the rules before the template's first slot),
  prefilled once per rollout, and prefills only the rest of each prompt every turn;
- ``device_whole``: the same rollout with the responder as a plain function (every prompt prefilled whole);
- ``python``: ``python_rollout`` -- a Python loop over turns: a jitted render+sample call, the
  answers copied to the host, decoded to strings and parsed in Python (as a text-arena harness
  does), a jitted batched env step, and an early exit once every game has ended.

The LM gets a short SFT warm start first (``warm``; ``--no-warm-start``: none) so that games last several turns (an
untrained LM forfeits on its first answer); ``--model`` a checkpoint (``models.lm.load_model``: a packaged name, HF
directory or .gguf, with its tokenizer) instead of the tiny random LM. Timing: one untimed rollout per arm, then medians of
``repeats`` interleaved rounds (``utils.timing.interleaved``); episodes/s of each and the ratios to ``device``.
Checked, not timed: the fraction of ``device``'s tokens equal to ``device_whole``'s (1.0 unless float differences
of the two prefills flip a sampled token) and whether the Python loop played the same games.

    python experiments/bench_selfplay.py --preset cpu
    python experiments/bench_selfplay.py --preset smollm2   # SmolLM2-135M-Instruct, verbose Kuhn Poker prompts
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx

from jaxrl_reason.agents.spiral.rollout import GAMES, LMGame, game_responder, game_rollout, python_rollout
from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, warm_start
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.utils import timing
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

VOCAB_SIZE = spiral_tokenizer().vocab_size  # 264: 8 special tokens + 256 bytes


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    model: str | None = None  # a checkpoint (packaged name, HF directory or .gguf); None = the tiny random ``lm``
    game: str = "kuhn_poker"
    style: str = "verbose"  # the prompts' style (envs.games.text.STYLES)
    num_episodes: int = 32
    max_new_tokens: int = 24
    lm: LMConfig = LMConfig(vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128,
                            max_seq_len=512)
    warm: WarmStartConfig = WarmStartConfig(games_per_game=64, steps=100, batch_size=16)
    warm_start: bool = True  # False: the LM as it is (a pretrained checkpoint's SFT on the rules' prompts is slow)
    repeats: int = 2

    def __post_init__(self):
        check_hyperparameters(self)
        if self.game not in GAMES:
            raise ValueError(f"unknown SPIRAL game {self.game!r}; choose from {GAMES}")
        n = spiral_tokenizer().vocab_size
        if self.model is None and self.lm.vocab_size != n:
            raise ValueError(f"lm.vocab_size must be {n} (the SPIRAL tokenizer), got {self.lm.vocab_size}")
        if self.num_episodes < 1 or self.repeats < 1:
            raise ValueError("num_episodes and repeats must be >= 1")


PRESETS = {
    "cpu": Config(),
    "gpu": Config(game="tictactoe", num_episodes=1024, max_new_tokens=32,
                  lm=LMConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768,
                              max_seq_len=512),
                  warm=WarmStartConfig(games_per_game=512, steps=400, batch_size=64, lr=1e-3), repeats=5),
    # the real model on its pretrained-LM prompts (verbose: 185 of Kuhn Poker's 323 prompt tokens shared), as it is
    # (a warm start on 323-token prompts costs ~1 min a step here), 16 games
    "smollm2": Config(model="smollm2-135m-instruct", num_episodes=16, max_new_tokens=24, warm_start=False, repeats=3),
}


def _lm(config: Config):
    """(the LM, its tokenizer): the checkpoint ``config.model`` (float32) or the tiny random ``config.lm``."""
    if config.model is None:
        return Transformer(config.lm, rngs=nnx.Rngs(config.seed)), spiral_tokenizer()
    from jaxrl_reason.models.lm import load_model, load_tokenizer

    return load_model(config.model, dtype="float32", max_seq_len=config.lm.max_seq_len), load_tokenizer(config.model)


def run(config: Config, run_dir: RunDir) -> dict:
    model, tok = _lm(config)
    if config.warm_start:
        warm_start(model, (config.game,), config.warm, seed=config.seed, style=config.style, tokenizer=tok)
    graphdef, params = nnx.split(model)
    game = LMGame.make(config.game, config.style, tokenizer=tok)
    sampler = SamplerConfig(max_new_tokens=config.max_new_tokens, temperature=1.0, pad_id=tok.pad_id)
    respond = game_responder(graphdef, sampler, tokenizer=tok)
    device = jax.jit(game_rollout(graphdef, game, config.num_episodes, sampler))
    whole = jax.jit(game_rollout(graphdef, game, config.num_episodes, sampler, responder=lambda *a: respond(*a)))
    keys = [jax.random.key(config.seed + 100 + i) for i in range(config.repeats + 1)]
    last = {}
    times = timing.interleaved({
        "device": lambda i: device(params, keys[i]),
        "device_whole": lambda i: whole(params, keys[i]),
        "python": lambda i: python_rollout(graphdef, game, config.num_episodes, sampler, params, keys[i]),
    }, config.repeats, last)
    (turns, games), (ref, _), py = last["device"], last["device_whole"], last["python"]
    act = np.asarray(turns.info["active"])
    row = {
        "game": config.game, "style": config.style, "model": config.model or "tiny random", "episodes":
        config.num_episodes, "backend": jax.default_backend(), "mean_turns": float(act.sum(0).mean()),
        "forfeit_rate": float(np.asarray(games.forfeit).any(1).mean()),
        "shared_prefix": game.prefix_len, "prompt_tokens": game.prompt_len,
        **{f"{k}_s": t.median for k, t in times.items()},
        **{f"{k}_episodes_per_s": config.num_episodes / t.median for k, t in times.items()},
        "whole_token_agreement": float(np.mean(np.asarray(turns.tokens)[act] == np.asarray(ref.tokens)[act])),
        "same_games": bool(np.allclose(np.asarray(games.returns), py["returns"])),
    }
    row["speedup"] = row["python_s"] / row["device_s"]
    row["whole_over_shared"] = row["device_whole_s"] / row["device_s"]
    print(run_dir.write_table("bench_selfplay", [row]))
    run_dir.save_json("bench_selfplay", row)
    return row


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
