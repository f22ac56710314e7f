"""SPIRAL with a tiny LM: SFT warm start, then on-device LM self-play on TicTacToe / Kuhn Poker
(/ Negotiation) with RAE vs plain self-play (no RAE), multi-game vs single game.

The LM: the tiny ``lm`` with the byte tokenizer (``agents.spiral.tokenizer``; the cpu preset), or
``--model CKPT_DIR`` (a HF checkpoint: its weights and its tokenizer, a byte-level BPE whose every
game-text character is one token), or ``--arch NAME`` (random weights of ``rl.grpo.recipes.ARCHS[NAME]``
with the byte tokenizer: throughput; the gpu preset, ``qwen3-0.6b``). The SFT warm start on teacher
games runs on every LM, a checkpoint included: it is SPIRAL's own data (the games) and teaches the
answer format (``\\boxed{move}``) on prompts that reach a checkpoint spelled one token per character
(``agents.spiral.tokenizer``); ``--no-warm-start`` skips it (the SPIRAL paper's start: a base model
prompted with the rules, e.g. ``--spiral.prompt-style verbose``). With a checkpoint the results also
get a "checkpoint" row (the LM before the warm start), and the transfer evaluation encodes the tasks
with the checkpoint's tokenizer instead of the character tokenizer.

Each variant is a sub-run (``<run>/<variant>/``: per step metrics in JSONL + TensorBoard, the win rates vs
random every ``eval_every`` steps and after the last, checkpoints at the same points: ``--resume`` continues
exactly; ``steps`` need not be a multiple of ``eval_every``; 0: at the start and the end only). Writes
``compare.png`` (eval win rate vs random, response length, format-error rate and gradient norm of every
variant on shared axes), ``results.md`` (win /
draw / loss / forfeit vs random and vs minimax / Kuhn Nash, the games' exact evaluations of the LM policy
(``GameSpec.evaluations``: Kuhn exploitability, value vs random and vs Nash),
grad-norm std, transfer accuracy on RandomCalculation and Countdown) for the warm-started model
("sft") and after self-play for every variant.

    python experiments/spiral.py --preset cpu
    jaxrl-reason run spiral --preset gpu                         # Qwen3-0.6B-sized, random weights
    jaxrl-reason run spiral --preset gpu --model /path/to/Qwen3-0.6B-Base
    jaxrl-reason run spiral --preset smollm2 --seed 0              # the real SmolLM2-135M-Instruct (issue 40)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

from jaxrl_reason.agents.spiral import study
from jaxrl_reason.agents.spiral.agent import SpiralConfig, spiral_learner
from jaxrl_reason.agents.spiral.rollout import GAMES  # registration order (envs.games.register_game)
from jaxrl_reason.agents.spiral.tokenizer import spiral_tokenizer
from jaxrl_reason.agents.spiral.warmstart import WarmStartConfig
from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.rl.base import check_intervals, run_steps
from jaxrl_reason.rl.grpo.recipes import ARCHS
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

VOCAB_SIZE = spiral_tokenizer().vocab_size  # 264: 8 special tokens + 256 bytes
TINY_LM = LMConfig(vocab_size=VOCAB_SIZE, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_ff=128, max_seq_len=512)


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # the LM: --model CKPT_DIR (a HF checkpoint, its weights and tokenizer), else --arch NAME (random weights of
    # recipes.ARCHS[NAME] with the byte tokenizer: throughput), else `lm` (a tiny LM with the byte tokenizer)
    model: str | None = None
    arch: str | None = None
    max_seq_len: int = 1024  # the window of a checkpoint / arch LM (prompt + response; RoPE and KV cache size)
    dtype: str = "bfloat16"  # activations of an arch LM ("float32" on CPU); a checkpoint runs in float32
    remat: bool = True  # recompute each block of a checkpoint / arch LM in the backward pass (memory)
    warm_start: bool = True  # the SFT warm start on teacher games (every LM; False: self-play from the LM as is)
    evaluate_checkpoint: bool = True  # a checkpoint's results row before the warm start too
    lm: LMConfig = TINY_LM
    warm: WarmStartConfig = WarmStartConfig()
    spiral: SpiralConfig = SpiralConfig()  # games / advantage are set per variant
    # variants: "<advantage>:<game>+<game>"
    variants: tuple[str, ...] = ("rae:tictactoe+kuhn_poker", "none:tictactoe+kuhn_poker", "rae:kuhn_poker")
    steps: int = 40
    eval_every: int = 10
    eval_episodes: int = 64
    final_eval_episodes: int = 256
    infoset_samples: int = 32  # LM answers sampled per information set (games with exact evaluations)
    transfer_problems: int = 64
    transfer_max_new_tokens: int = 32

    def __post_init__(self):
        check_hyperparameters(self)
        n = spiral_tokenizer().vocab_size
        if self.lm.vocab_size != n:
            raise ValueError(f"lm.vocab_size must be {n} (the SPIRAL tokenizer: task specials + bytes), "
                             f"got {self.lm.vocab_size}")
        if self.arch is not None and self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; known: {sorted(ARCHS)}")
        if self.max_seq_len < 1:
            raise ValueError(f"max_seq_len must be >= 1, got {self.max_seq_len}")
        if min(self.steps, self.infoset_samples, self.transfer_problems, self.transfer_max_new_tokens) < 1:
            raise ValueError("steps, infoset_samples, transfer_problems, transfer_max_new_tokens must be >= 1")
        check_intervals(self.steps, eval_every=self.eval_every)
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


#: issue 40 / 55, the real SmolLM2-135M-Instruct on the 2-core CPU, sized so one arm (self-play + its evaluations)
#: takes ~30-45 min on the idle machine. Its cost is the model's: a turn trained (a compact prompt of <= 119 tokens,
#: one per character, + 24 new) costs ~1-2 s of forward + backward and a turn played ~0.2 s of prefill a game, so a
#: step is 2 episodes per game (~20 trained turns: ``update_rows`` trains only those), 48 steps an arm, every fixed
#: opponent every 12 steps (16 games each), 128 games each at the end (win-rate SE <= 0.044 an arm), the warm-started
#: start evaluated once (not the checkpoint before it), a 512-example warm start (64 x 8 at lr 1e-4; 24 x 4 at 5e-5
#: left 89% of TicTacToe games vs random forfeited). 24 new tokens hold the warm start's answers (rationale +
#: \boxed{move}: at most 19 tokens on TicTacToe, 11 on Kuhn Poker). lr 1e-5 (the GRPO preset's; SPIRAL's 1e-6 moves
#: nothing in this many steps)
SMOLLM2 = Config(
    model="smollm2-135m-instruct", max_seq_len=256, dtype="float32", evaluate_checkpoint=False,
    warm=WarmStartConfig(games_per_game=256, steps=64, batch_size=8, lr=1e-4),
    spiral=SpiralConfig(episodes_per_game=2, max_new_tokens=24, lr=1e-5, prompt_style="compact", update_rows=4),
    variants=("rae:tictactoe+kuhn_poker", "none:tictactoe+kuhn_poker"),
    steps=48, eval_every=12, eval_episodes=16, final_eval_episodes=128, infoset_samples=16, transfer_problems=64,
    transfer_max_new_tokens=24,
)

PRESETS = {
    # compact prompts (a tiny LM from scratch gains nothing from the rules in prose, and pays for every
    # prompt token) and expert-labelled SFT on varied teacher positions; self-play then has to lift
    # the play (the warm-started LM plays TicTacToe at about a random player's level)
    "cpu": Config(
        warm=WarmStartConfig(games_per_game=2048, steps=1000, batch_size=32, lr=3e-3),
        spiral=SpiralConfig(episodes_per_game=32, max_new_tokens=28, lr=2e-4, prompt_style="compact"),
        steps=60, eval_every=10, eval_episodes=128, final_eval_episodes=1024, infoset_samples=64, transfer_problems=32,
    ),
    # SPIRAL starts from Qwen3-4B(-Base); the largest Qwen3 in recipes.ARCHS, and one that fits one GPU, is
    # Qwen3-0.6B: random weights of its configuration (throughput), or --model a Qwen3-0.6B(-Base) checkpoint.
    # Verbose prompts (the rules in prose: the style for a pretrained LM), a short low-lr warm start (the
    # format, not the play), then self-play at SPIRAL's lr 1e-6. `lm` is used only with --arch None.
    # Sized for the KV cache (~115 KB a token in bf16, twice that for a float32 checkpoint): evaluation batches
    # of at most 512 sequences of <= 577 tokens; 16 minibatches of ~176 turns per update (remat on).
    "gpu": Config(
        arch="qwen3-0.6b", max_seq_len=1024,
        lm=LMConfig(vocab_size=VOCAB_SIZE, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4, d_ff=768, max_seq_len=512),
        warm=WarmStartConfig(games_per_game=2048, steps=200, batch_size=64, lr=1e-5),
        spiral=SpiralConfig(episodes_per_game=128, max_new_tokens=128, lr=1e-6, minibatches=16, prompt_style="verbose"),
        variants=("rae:tictactoe+kuhn_poker+negotiation", "none:tictactoe+kuhn_poker+negotiation",
                  "rae:kuhn_poker", "fixed:tictactoe+kuhn_poker+negotiation"),
        steps=200, eval_every=25, eval_episodes=128, final_eval_episodes=512, infoset_samples=32,
        transfer_problems=512, transfer_max_new_tokens=256,
    ),
    # issue 40: the real pretrained SmolLM2-135M-Instruct (--model smollm2-135m-instruct, a packaged GGUF) in
    # self-play on two games, RAE vs no RAE (one seed a run: --seed 0, 1, 2 for several). A short low-lr warm
    # start teaches the answer format (\boxed{move}) on compact prompts; response length, format errors
    # (invalid moves / forfeits) and gradient norm every step, win rates vs random every eval_every steps,
    # vs every fixed opponent (random, minimax / Nash: the games' expert bots) and Kuhn's exact evaluations
    # after the warm start and after self-play; the arms' differences with their SE (differences.md).
    # An arm takes ~30-45 min on a 2-core CPU (SMOLLM2's comment).
    "smollm2": SMOLLM2,
    # the same claim sized for one H200: verbose prompts (the rules in prose), longer responses, more
    # episodes and steps, a third game
    "smollm2_gpu": dataclasses.replace(
        SMOLLM2, max_seq_len=1024, evaluate_checkpoint=True,
        warm=WarmStartConfig(games_per_game=2048, steps=200, batch_size=64, lr=1e-5),
        spiral=SpiralConfig(episodes_per_game=128, max_new_tokens=128, lr=1e-6, minibatches=8, prompt_style="verbose",
                            update_rows=64),
        variants=("rae:tictactoe+kuhn_poker+negotiation", "none:tictactoe+kuhn_poker+negotiation"),
        steps=200, eval_every=25, eval_episodes=128, final_eval_episodes=512, infoset_samples=32,
        transfer_problems=512, transfer_max_new_tokens=128),
}

def run(config: Config, run_dir: RunDir) -> dict:
    all_games = sorted({g for v in config.variants for g in config.variant_config(v).games}, key=GAMES.index)
    model, tok, task_tok = study.load_lm(config)
    sampler = SamplerConfig(max_new_tokens=config.spiral.max_new_tokens, temperature=config.spiral.temperature,
                            pad_id=tok.pad_id)
    key = jax.random.key(config.seed + 1)
    evaluate = lambda games: study.evaluate_model(config, *nnx.split(model), model, games, sampler, key, tok, task_tok)
    rows = []  # each row and the warm start are saved in the run: a resumed run reads them back
    if config.model is not None and config.warm_start and config.evaluate_checkpoint:  # the checkpoint as it came
        rows.append(study.row_once(run_dir, "row_checkpoint", lambda: {"variant": "checkpoint", **evaluate(all_games)}))
        run_dir.write_table("results", rows)
    examples = study.warm_started(config, model, all_games, tok, run_dir) if config.warm_start else 0
    warm_graphdef, warm_full = nnx.split(model)
    start = "sft (warm start)" if config.warm_start else ("checkpoint" if config.model is not None else "start")
    rows.append(study.row_once(run_dir, "row_start", lambda: {"variant": start, **evaluate(all_games)}))
    run_dir.write_table("results", rows)  # rewritten after every variant, so partial runs leave a table
    curves = {}
    for variant in config.variants:
        vcfg = config.variant_config(variant)
        model = nnx.merge(warm_graphdef, jax.tree.map(jnp.copy, warm_full))  # the warm-started LM, a fresh copy
        learner, agent = spiral_learner(vcfg, model, tokenizer=tok)
        vdir = run_dir.child(variant.replace(":", "_").replace("+", "_"))  # own metrics and checkpoints (resume)
        state = run_steps(vdir, learner.step_fn(agent), learner.init(jax.random.key(config.seed), agent),
                          config.steps, config.eval_every, study.win_rate_eval(config, learner, vcfg, sampler, tok),
                          desc=variant)
        curves[variant], row = study.variant_row(vdir, variant, vcfg)
        model = learner.model(state)
        rows.append(study.row_once(vdir, "row_final", lambda: row | evaluate(vcfg.games)))
        run_dir.write_table("results", rows)
        study.compare_plot(run_dir, curves)
    study.compare_plot(run_dir, curves)
    # one table per game keeps the markdown readable
    md = run_dir.write_table("results", rows)
    run_dir.save_json("results", rows)
    summary = study.summarize(rows, examples, run_dir)
    diffs = study.arm_differences(rows, config.final_eval_episodes)
    summary["final_eval_episodes"] = config.final_eval_episodes
    if diffs:
        md += "\n\n" + run_dir.write_table("differences", diffs)
        for d in diffs:
            summary[f"{d['comparison']} | {d['metric']}"] = d["difference"]
            summary[f"{d['comparison']} | {d['metric']} se"] = d["se"]
    print(md)
    return summary


def record(summary: dict) -> list[dict]:
    """``--record``: the arms' final differences (the first variant minus each other: win, forfeit, mean return vs
    every fixed opponent) with their SE, n = ``final_eval_episodes`` games each."""
    return [{"name": k, "value": v, "se": summary[f"{k} se"], "n": summary["final_eval_episodes"]}
            for k, v in summary.items() if f"{k} se" in summary]


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
