"""SPIRAL with a tiny LM: SFT warm start, then on-device LM self-play on TicTacToe / Kuhn Poker
(/ Negotiation) with RAE vs plain self-play (no RAE), multi-game vs single game.

Writes per step metrics (JSONL + TensorBoard), ``compare.png`` (eval win rate vs random, response
length, format-error rate and gradient norm of every variant on shared axes), ``results.md`` (win /
draw / loss / forfeit vs random and vs minimax / Kuhn Nash, Kuhn exploitability of the LM policy,
grad-norm std, transfer accuracy on RandomCalculation and Countdown) for the warm-started model
("sft") and after self-play for every variant.

    python experiments/spiral.py --preset cpu
    jaxrl-reason run spiral --preset gpu
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from flax import nnx
from tqdm.auto import tqdm

from jaxrl_reason.agents.spiral import evaluation as E
from jaxrl_reason.agents.spiral.trainer import SpiralConfig, SpiralTrainer
from jaxrl_reason.agents.spiral.vocab import VOCAB_SIZE
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig, warm_start
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

TINY_LM = LMConfig(vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=512)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    lm: LMConfig = TINY_LM
    warm: WarmStartConfig = WarmStartConfig()
    spiral: SpiralConfig = SpiralConfig()  # games / advantage are set per variant
    # variants: "<advantage>:<game>+<game>"
    variants: tuple[str, ...] = ("rae:tictactoe+kuhn_poker", "none:tictactoe+kuhn_poker", "rae:kuhn_poker")
    steps: int = 40
    eval_every: int = 10
    eval_episodes: int = 64
    final_eval_episodes: int = 256
    kuhn_samples: int = 32
    transfer_problems: int = 64

    def __post_init__(self):
        check_hyperparameters(self)
        if self.lm.vocab_size != VOCAB_SIZE:
            raise ValueError(f"lm.vocab_size must be {VOCAB_SIZE} (task specials + bytes), got {self.lm.vocab_size}")
        if self.steps < 1 or self.eval_every < 1 or self.kuhn_samples < 1 or self.transfer_problems < 1:
            raise ValueError("steps, eval_every, kuhn_samples, transfer_problems must be >= 1")
        for n in (self.eval_episodes, self.final_eval_episodes):
            if n < 2 or n % 2:
                raise ValueError(f"eval episode counts must be even and >= 2, got {n}")
        for v in self.variants:
            self.variant_config(v)

    def variant_config(self, variant: str) -> SpiralConfig:
        if ":" not in variant:
            raise ValueError(f"variant must look like 'rae:tictactoe+kuhn_poker', got {variant!r}")
        adv, games = variant.split(":", 1)
        return dataclasses.replace(self.spiral, advantage=adv, games=tuple(games.split("+")))


PRESETS = {
    # compact prompts (a tiny LM from scratch gains nothing from the rules in prose, and pays for every
    # prompt token) and expert-labelled SFT on varied teacher positions; self-play then has to lift
    # the play (the warm-started LM plays TicTacToe at about a random player's level)
    "cpu": Config(
        warm=WarmStartConfig(games_per_game=2048, steps=1000, batch_size=32, lr=3e-3),
        spiral=SpiralConfig(episodes_per_game=32, max_new_tokens=28, lr=2e-4, prompt_style="compact"),
        steps=60, eval_every=10, eval_episodes=128, final_eval_episodes=1024, kuhn_samples=64, transfer_problems=32,
    ),
    "gpu": Config(
        lm=LMConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768, max_seq_len=512),
        warm=WarmStartConfig(games_per_game=8192, steps=1500, batch_size=128, lr=1e-3),
        spiral=SpiralConfig(episodes_per_game=256, max_new_tokens=48, lr=1e-4, minibatches=4, prompt_style="compact"),
        variants=("rae:tictactoe+kuhn_poker+negotiation", "none:tictactoe+kuhn_poker+negotiation",
                  "rae:kuhn_poker", "fixed:tictactoe+kuhn_poker+negotiation"),
        steps=300, eval_every=25, eval_episodes=512, final_eval_episodes=2048, kuhn_samples=256,
        transfer_problems=512,
    ),
}

_EVAL_GAMES = ("tictactoe", "kuhn_poker", "negotiation")


def evaluate_model(config: Config, graphdef, params, model, games, sampler, key) -> dict:
    """Final evaluation row: vs every fixed opponent of each game, Kuhn exploitability, transfer."""
    row, style = {}, config.spiral.prompt_style
    for game in games:
        for opp in E.OPPONENTS[game]:
            key, sub = jax.random.split(key)
            r = E.win_rates(graphdef, params, game, opp, config.final_eval_episodes, sampler, sub, style)
            for k in ("win", "draw", "loss", "forfeit", "mean_return", "return_se"):
                row[f"{game}_vs_{opp}/{k}"] = r[k]
    if "kuhn_poker" in games:
        k = E.kuhn_lm_exploitability(graphdef, params, sampler, config.kuhn_samples, key, style)
        row["kuhn/exploitability"] = k["exploitability"]
        row["kuhn/value_vs_random"] = k["value_vs_random"]
        row["kuhn/valid_rate"] = k["valid_rate"]
    for task, r in E.transfer_eval(model, config.transfer_problems).items():
        row[f"transfer_{task}/accuracy"] = r["accuracy"]
        row[f"transfer_{task}/format_rate"] = r["format_rate"]
    return row


def run(config: Config, run_dir: RunDir) -> dict:
    all_games = sorted({g for v in config.variants for g in config.variant_config(v).games}, key=_EVAL_GAMES.index)
    model = Transformer(config.lm, rngs=nnx.Rngs(config.seed))
    warm_params, warm_m = warm_start(model, all_games, config.warm, seed=config.seed, style=config.spiral.prompt_style)
    for i, nll in enumerate(warm_m["nll"]):
        if i % 10 == 0 or i == len(warm_m["nll"]) - 1:
            run_dir.log(i, {"sft/nll": nll})
    graphdef, full = nnx.split(model)
    sampler = SamplerConfig(max_new_tokens=config.spiral.max_new_tokens, temperature=config.spiral.temperature)
    key = jax.random.key(config.seed + 1)
    rows = [{"variant": "sft (warm start)", **evaluate_model(config, graphdef, full, model, all_games, sampler, key)}]
    run_dir.write_table("results", rows)  # rewritten after every variant, so partial runs leave a table
    curves = {}
    for variant in config.variants:
        vcfg = config.variant_config(variant)
        model = Transformer(config.lm, rngs=nnx.Rngs(config.seed))
        nnx.update(model, warm_params)
        trainer = SpiralTrainer(vcfg, model)
        state = trainer.init(jax.random.key(config.seed))
        hist = []
        for i in tqdm(range(config.steps), desc=variant):
            state, m = trainer.step(state)
            m = {k: float(v) for k, v in jax.device_get(m).items()}
            if i % config.eval_every == 0 or i == config.steps - 1:
                full = nnx.merge_state(state.params, state.rest)
                for g in vcfg.games:
                    r = E.win_rates(trainer.full_graphdef, full, g, "random", config.eval_episodes, sampler,
                                    jax.random.key(1000 + i), vcfg.prompt_style)
                    m[f"{g}/eval_win_vs_random"] = r["win"]
                    m[f"{g}/eval_loss_vs_random"] = r["loss"]
                    m[f"{g}/eval_return_vs_random"] = r["mean_return"]
                    m[f"{g}/eval_forfeit_vs_random"] = r["forfeit"]
            hist.append({"step": i, **m})
            run_dir.log(i, {f"{variant}/{k}": v for k, v in m.items()})
        curves[variant] = hist
        model = trainer.model(state)
        graphdef, full = nnx.split(model)
        grad = np.asarray([h["grad_norm"] for h in hist])
        row = {"variant": variant, "grad_norm_mean": float(grad.mean()), "grad_norm_std": float(grad.std())}
        for g in vcfg.games:
            lens = [h[f"{g}/response_length"] for h in hist]
            row[f"{g}/final_response_length"] = float(np.mean(lens[-5:]))
            row[f"{g}/train_format_error_last5"] = float(np.mean([h[f"{g}/format_error"] for h in hist[-5:]]))
        row.update(evaluate_model(config, graphdef, full, model, vcfg.games, sampler, key))
        rows.append(row)
        run_dir.write_table("results", rows)
        _compare_plot(run_dir, curves)
    _compare_plot(run_dir, curves)
    # one table per game keeps the markdown readable
    md = run_dir.write_table("results", rows)
    run_dir.save_json("results", rows)
    summary = {"results_md": str(run_dir.path / "results.md"), "sft_examples": warm_m["examples"]}
    for r in rows:
        for k, v in r.items():
            if "_vs_random/" in k and k.rsplit("/", 1)[1] in ("win", "loss", "forfeit", "mean_return") \
                    or k in ("kuhn/exploitability", "kuhn/value_vs_random", "grad_norm_std"):
                summary[f"{r['variant']} | {k}"] = v
    print(md)
    return summary


def _compare_plot(run_dir: RunDir, curves: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    games = sorted({k.split("/")[0] for h in curves.values() for k in h[0] if "/" in k})
    panels = [(f"{g}/{m}", f"{g}: {m}") for g in games
              for m in ("eval_win_vs_random", "eval_return_vs_random", "response_length", "format_error")]
    panels += [("grad_norm", "grad norm")]
    fig, axes = plt.subplots(1, len(panels), figsize=(3.6 * len(panels), 3.2), squeeze=False)
    for ax, (key, title) in zip(axes[0], panels):
        for variant, hist in curves.items():
            pts = [(h["step"], h[key]) for h in hist if key in h]
            if pts:
                ax.plot(*zip(*pts), marker="." if "eval" in key else None, label=variant)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(run_dir.path / "compare.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
