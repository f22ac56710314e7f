"""ProRL in miniature: prolonged GRPO over a task mix with a KL penalty, with vs without reference
hard resets (reference <- policy, optimiser re-initialised every ``reset_every`` steps).

Both arms: decoupled clip (eps_low 0.2, eps_high 0.4), token-level loss, dynamic sampling, k3 KL.
Held-out sampled pass@1 over steps (reset steps marked); pass@1 / pass@k per task vs the start.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated

import jax
import tyro
from flax import nnx

from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.tasks import Countdown, OrderingPuzzle, Parity, RandomCalculation, Sorting
from jaxrl_reason.rewards.evaluation import pass_at_k_eval
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

MIX = (RandomCalculation(1, 1, 9, "+-*"), Countdown(2, 2, 5), Sorting(2, 4), Parity(2, 6), OrderingPuzzle(3, 4))


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # the policy: --model CKPT_DIR (a HF checkpoint: RL from it, no SFT warm start, prompts through its chat
    # template), else --arch NAME (random weights of recipes.ARCHS[NAME], warm-started: throughput), else `lm`
    model: str | None = None
    arch: str | None = None
    lm: recipes.TinyLM = recipes.TinyLM()
    warm_start: recipes.WarmStart = recipes.WarmStart(problems=2048, steps=200)
    grpo: GRPOConfig = GRPOConfig(
        group_size=8, prompts_per_step=16, dynamic_sampling=True, oversample=2, lr=3e-4, temperature=1.0,
        max_new_tokens=24, loss=LossConfig(eps_low=0.2, eps_high=0.4, aggregation="token_mean", kl_coef=0.5))
    # kl_coef 0.5: the penalty to a fixed reference holds the no-reset arm (measured: flat at ~0.25 pass@1
    # from step 50) while resets keep improving (0.39 at 400); with 0.1 both arms kept improving
    reset_every: int = 25
    rl_steps: int = 400
    eval_every: int = 25  # held-out evaluation interval (0: only before and after; the last step is always evaluated)
    eval_problems: int = 100
    final_samples: int = 32
    # --eval-samples: samples per held-out problem for pass@1 (and per --eval-data row for pass@k / mean@n);
    # --eval-data FILE (+ --eval-reward, --eval-reward-fn, --eval-prompt-field, --eval-answer-field): each arm also
    # evaluated on a prompt/answer file
    eval_file: Annotated[recipes.EvalFile, tyro.conf.OmitArgPrefixes] = recipes.EvalFile(eval_samples=8)
    prompt_len: int | None = None  # None: 28 (raw prompts), or with --model the longest through its chat template
    answer_len: int = 12

    def __post_init__(self):
        check_hyperparameters(self)
        if self.reset_every < 1 or self.eval_file.eval_samples < 1:
            raise ValueError(f"reset_every and eval_samples must be >= 1, got {self.reset_every} and "
                             f"{self.eval_file.eval_samples}")
        check_intervals(self.rl_steps, eval_every=self.eval_every)


RAW_PROMPT_LEN = 28  # <bos> + the longest problem text of MIX (character tokens), with room


PRESETS = {
    "cpu": Config(),
    "gpu": recipes.gpu_preset(Config(), lm=recipes.GPU_LM,
                              warm_start=recipes.WarmStart(problems=8192, steps=600, batch_size=128, seq_len=96),
                              # ProRL's start: DeepSeek-R1-Distill-Qwen-1.5B (random weights of its shape; --model
                              # the checkpoint)
                              arch="r1-distill-qwen-1.5b",
                              rl_steps=600, reset_every=100, eval_every=50, eval_problems=500, final_samples=64),
}


def late_gain(curve: tuple) -> float:
    """Held-out pass@1 gained from the second to the last quarter of the run (means of the
    evaluations in each quarter of the steps); about 0 for a run that has plateaued. NaN when either quarter holds
    no evaluation (a run too short for its ``eval_every``)."""
    steps, vals = curve
    q = steps.max() / 4
    late, mid = vals[steps > 3 * q], vals[(steps > q) & (steps <= 2 * q)]
    return float(late.mean() - mid.mean()) if len(late) and len(mid) else float("nan")


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = list(MIX)
    begin = recipes.task_start(config, run_dir, tasks, raw_prompt_len=RAW_PROMPT_LEN, n_heldout=config.eval_problems,
                               desc="prorl", steps=config.rl_steps)
    if begin.summary is not None:  # --rl-steps 0 --eval-data F: F evaluated only
        return begin.summary
    policy, held = begin.policy, begin.held
    model, tok, fmt, prompt_len = policy.model, policy.tokenizer, policy.fmt, policy.prompt_len
    start_state = jax.tree.map(jax.numpy.copy, nnx.state(model))
    n = config.grpo.max_new_tokens
    samples = config.eval_file.eval_samples
    evaluate = lambda m: {"pass@1": pass_at_k_eval(m, tasks, held, tok, samples, (1,), max_new_tokens=n)["pass@1"]}
    ks = tuple(k for k in (1, 4, 16, 32, 64) if k <= config.final_samples)
    final = {"start": pass_at_k_eval(model, tasks, held, tok, config.final_samples, ks, max_new_tokens=n)}
    curves, kl, ent = {}, {}, {}
    for arm, every in (("no reset", None), (f"reset every {config.reset_every}", config.reset_every)):
        sub = run_dir.child("reset" if every else "no_reset")
        nnx.update(model, start_state)
        learner, agent = grpo_for_tasks(dataclasses.replace(config.grpo, ref_reset_every=every), model, tok, tasks,
                                        prompt_len, fmt=fmt)
        state = recipes.train(sub, learner, agent, learner.init(jax.random.key(config.seed), agent), config.rl_steps,
                              config.eval_every, evaluate, desc=f"prorl {arm}", heldout_file=policy.heldout_file)
        final[arm] = pass_at_k_eval(learner.model(state), tasks, held, tok, config.final_samples, ks, max_new_tokens=n)
        curves[arm], kl[arm], ent[arm] = (recipes.series(sub, k) for k in ("eval/pass@1", "kl_ref", "sample_entropy"))
    resets = list(range(config.reset_every, config.rl_steps + 1, config.reset_every))
    recipes.plot_curves(run_dir.path / "prorl.png", {"held-out pass@1": curves, "KL to reference (k3)": kl,
                                                     "sampling entropy": ent},
                        title="ProRL-style KL + reference resets vs no resets", marks={"held-out pass@1": resets})
    rows = []
    for arm, res in final.items():
        for task, vals in res["by_task"].items():
            rows.append({"model": arm, "task": task, **vals})
        rows.append({"model": arm, "task": "all", **{k: v for k, v in res.items() if k.startswith("pass@")}})
    print(run_dir.write_table("results", rows))
    gains = {f"late_gain[{arm}]": late_gain(c) for arm, c in curves.items()}
    print("pass@1 gained from the second to the last quarter of the run:", {k: round(v, 3) for k, v in gains.items()})
    return {arm: {k: v for k, v in res.items() if k.startswith("pass@")} for arm, res in final.items()} | gains | {
        "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
