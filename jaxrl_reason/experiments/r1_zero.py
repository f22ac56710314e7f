"""R1-Zero-style GRPO on RandomCalculation from a small, partial SFT warm start.

Accuracy + format rewards (DeepSeek-R1); held-out greedy accuracy, format rate and response length
over RL steps; final greedy accuracy by difficulty and pass@k, before vs after.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import jax
import tyro

from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.rewards.evaluation import greedy_eval, pass_at_k_eval
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.rewards import RewardConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # the policy: --model CKPT_DIR (a HF checkpoint: RL from it, no SFT warm start, prompts through its chat
    # template), else --arch NAME (random weights of recipes.ARCHS[NAME], warm-started: throughput), else `lm`
    model: str | None = None
    arch: str | None = None
    task: RandomCalculation = RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=9, ops="+-*")
    lm: recipes.TinyLM = recipes.TinyLM()
    # brief SFT: the format is learned (~100%) but greedy accuracy stays low (~24%), so RL has headroom
    warm_start: recipes.WarmStart = recipes.WarmStart(problems=4096, steps=100)
    # no format reward: with std-normalised advantages a 0.1 format bonus is amplified to the scale of
    # correctness in groups without a correct sample, and that noise drives the policy off (measured)
    grpo: GRPOConfig = GRPOConfig(
        group_size=8, prompts_per_step=32, lr=3e-4, temperature=0.7, max_new_tokens=20,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
        reward=RewardConfig("correct", format_weight=0.0),
    )
    rl_steps: int = 400  # measured: +19.6 points at 240 steps, +25.4 at 400 (120 gave +7.8)
    eval_every: int = 40  # held-out evaluation interval (0: only before and after; the last step is always evaluated)
    heldout_problems: int = 256
    passk_problems: int = 64
    passk_samples: int = 32
    # --eval-data FILE (+ --eval-samples, --eval-reward, --eval-reward-fn, --eval-prompt-field, --eval-answer-field)
    eval_file: Annotated[recipes.EvalFile, tyro.conf.OmitArgPrefixes] = recipes.EvalFile()
    prompt_len: int | None = None  # None: 24 (raw prompts), or with --model the longest through its chat template
    answer_len: int = 12

    def __post_init__(self):
        check_hyperparameters(self)
        check_intervals(self.rl_steps, eval_every=self.eval_every)
        if self.heldout_problems < 1 or self.passk_problems < 1 or self.passk_samples < 1:
            raise ValueError("heldout_problems, passk_problems and passk_samples must be >= 1")


RAW_PROMPT_LEN = 24  # <bos> + the cpu preset's problem text (character tokens), with room


PRESETS = {
    "cpu": Config(),
    "gpu": recipes.gpu_preset(
        Config(), lm=recipes.GPU_LM, task=RandomCalculation(min_difficulty=1, max_difficulty=4, ops="+-*/"),
        warm_start=recipes.WarmStart(problems=2048, steps=400, batch_size=128, seq_len=96),
        # a Qwen2.5-0.5B-sized policy (random weights; --model a Qwen2.5-0.5B checkpoint for the paper's start);
        # prompt_len fits the R1 system prompt through a chat template
        arch="qwen2.5-0.5b", rl_steps=400, heldout_problems=1024, passk_problems=256, passk_samples=64),
}


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = [config.task]
    begin = recipes.task_start(config, run_dir, tasks, raw_prompt_len=RAW_PROMPT_LEN,
                               n_heldout=config.heldout_problems, desc="r1_zero", steps=config.rl_steps)
    if begin.summary is not None:  # --rl-steps 0 --eval-data F: F evaluated only
        return begin.summary
    policy, held = begin.policy, begin.held
    model, tok, fmt, prompt_len = policy.model, policy.tokenizer, policy.fmt, policy.prompt_len
    pk = held.take(range(min(config.passk_problems, len(held))))
    n = config.grpo.max_new_tokens

    def evaluate(m):
        r = greedy_eval(m, tasks, held, n, tok)
        return {"accuracy": r["accuracy"], "format_rate": r["format_rate"], "response_length": r["response_length"]}

    start = greedy_eval(model, tasks, held, n, tok)
    ks = tuple(k for k in (1, 8, 32, 64) if k <= config.passk_samples)
    start_pk = pass_at_k_eval(model, tasks, pk, tok, config.passk_samples, ks, max_new_tokens=n)
    learner, agent = grpo_for_tasks(config.grpo, model, tok, tasks, prompt_len, fmt=fmt)
    state = recipes.train(run_dir, learner, agent, learner.init(jax.random.key(config.seed), agent), config.rl_steps,
                          config.eval_every, evaluate, desc="r1_zero", heldout_file=policy.heldout_file)
    final_model = learner.model(state)
    end = greedy_eval(final_model, tasks, held, n, tok)
    end_pk = pass_at_k_eval(final_model, tasks, pk, tok, config.passk_samples, ks, max_new_tokens=n)

    s = lambda k: recipes.series(run_dir, k)
    recipes.plot_curves(run_dir.path / "r1_zero.png", {
        "held-out greedy accuracy": {"GRPO": s("eval/accuracy")},
        "train sample accuracy": {"GRPO": s("accuracy")},
        "response length (tokens)": {"train samples": s("response_length"), "held-out greedy": s("eval/response_length")},
        "format rate": {"held-out greedy": s("eval/format_rate")},
    }, title="R1-Zero-style GRPO on RandomCalculation (tiny LM)")
    rows = [{"model": "SFT start", "greedy_acc": start["accuracy"], **{f"acc_d{d}": v for d, v in start["by_difficulty"].items()},
             **{k: v for k, v in start_pk.items() if k.startswith("pass@")}, "format": start["format_rate"]},
            {"model": "GRPO", "greedy_acc": end["accuracy"], **{f"acc_d{d}": v for d, v in end["by_difficulty"].items()},
             **{k: v for k, v in end_pk.items() if k.startswith("pass@")}, "format": end["format_rate"]}]
    print(run_dir.write_table("results", rows))
    return {"start_accuracy": start["accuracy"], "final_accuracy": end["accuracy"],
            "gain_points": 100 * (end["accuracy"] - start["accuracy"]),
            f"start_pass@{ks[-1]}": start_pk[f"pass@{ks[-1]}"], f"final_pass@{ks[-1]}": end_pk[f"pass@{ks[-1]}"], "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
