"""Spurious rewards on clean data ("Reasoning or Memorization?", arXiv 2507.10532), in miniature.

One SFT start on RandomCalculation, GRPO with correct / random / inverted / wrong-label rewards;
one held-out greedy-accuracy curve per variant. Also demonstrates the partial-prompt contamination
probe: a copy of the start fine-tuned on the test split (prompt text included) vs a copy fine-tuned
as long on a disjoint split.
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
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.rewards.evaluation import contamination_probe, greedy_eval
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.rewards import VARIANTS, RewardConfig
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # the policy: --model CKPT_DIR (a HF checkpoint: RL from it, no SFT warm start, prompts through its chat
    # template), else --arch NAME (random weights of recipes.ARCHS[NAME], warm-started: throughput), else `lm`
    model: str | None = None
    arch: str | None = None
    variants: tuple[str, ...] = ("correct", "random", "inverted", "wrong_label")
    task: RandomCalculation = RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=9, ops="+-*")
    lm: recipes.TinyLM = recipes.TinyLM()
    warm_start: recipes.WarmStart = recipes.WarmStart(problems=4096, steps=100)  # same start as r1_zero
    grpo: GRPOConfig = GRPOConfig(group_size=8, prompts_per_step=32, lr=3e-4, temperature=0.7, max_new_tokens=20,
                                  loss=LossConfig(eps_low=0.2, eps_high=0.28))
    random_p: float = 0.5
    rl_steps: int = 320  # measured: correct rewards +25.0 points at 320 steps (+7.8 at 120)
    eval_every: int = 40  # held-out evaluation interval (0: only before and after; the last step is always evaluated)
    heldout_problems: int = 256
    # --eval-data FILE (+ --eval-samples, --eval-reward, --eval-reward-fn, --eval-prompt-field, --eval-answer-field):
    # each variant also evaluated on a prompt/answer file (by the correct answer, whatever the training reward)
    eval_file: Annotated[recipes.EvalFile, tyro.conf.OmitArgPrefixes] = recipes.EvalFile()
    contamination_demo: bool = True
    probe_problems: int = 32
    probe_sft_steps: int = 150
    prompt_len: int | None = None  # None: 24 (raw prompts), or with --model the longest through its chat template
    answer_len: int = 12

    def __post_init__(self):
        check_hyperparameters(self)
        if not self.variants or set(self.variants) - set(VARIANTS):
            raise ValueError(f"variants must be a non-empty subset of {VARIANTS}, got {self.variants}")
        check_intervals(self.rl_steps, eval_every=self.eval_every)


RAW_PROMPT_LEN = 24  # <bos> + the cpu preset's problem text (character tokens), with room


PRESETS = {
    "cpu": Config(),
    "gpu": recipes.gpu_preset(Config(), lm=recipes.GPU_LM, task=RandomCalculation(min_difficulty=1, max_difficulty=3),
                              warm_start=recipes.WarmStart(problems=8192, steps=600, batch_size=128, seq_len=96),
                              arch="qwen2.5-0.5b",  # Qwen2.5-sized (random weights; --model a Qwen2.5 checkpoint)
                              rl_steps=300, eval_every=20, heldout_problems=1024, probe_problems=128),
}


def _probe_demo(config: Config, graphdef, start_state, tok, prompt_len: int) -> list[dict]:
    tasks = [config.task]
    test = recipes.heldout(tasks, config.probe_problems, config.seed, prompt_len, config.answer_len, tok).problems
    other = recipes.sft_problems(tasks, config.probe_problems, config.seed + 1)
    rows = []
    for name, data in (("fine-tuned on a disjoint split (clean)", other), ("fine-tuned on the test split", test)):
        m = nnx.merge(graphdef, jax.tree.map(jax.numpy.copy, start_state))  # a copy of the RL start
        sft_warm_start(m, list(data), config.probe_sft_steps, 32, config.warm_start.seq_len, 3e-3, prompt_loss=True,
                      tokenizer=tok)
        rows.append({"model": name, **contamination_probe(m, test, tok, 0.6)})
    return rows


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = [config.task]
    begin = recipes.task_start(config, run_dir, tasks, raw_prompt_len=RAW_PROMPT_LEN,
                               n_heldout=config.heldout_problems, desc="spurious_rewards", steps=config.rl_steps)
    if begin.summary is not None:  # --rl-steps 0 --eval-data F: F evaluated only
        return begin.summary
    policy, held = begin.policy, begin.held
    model, tok, fmt, prompt_len = policy.model, policy.tokenizer, policy.fmt, policy.prompt_len
    start_state = jax.tree.map(jax.numpy.copy, nnx.state(model))
    n = config.grpo.max_new_tokens
    evaluate = lambda m: {"accuracy": greedy_eval(m, tasks, held, n, tok)["accuracy"]}
    start = evaluate(model)["accuracy"]
    final, curves = {}, {}
    for variant in config.variants:
        sub = run_dir.child(variant)
        cfg = dataclasses.replace(config.grpo, reward=RewardConfig(variant, random_p=config.random_p))
        nnx.update(model, start_state)
        learner, agent = grpo_for_tasks(cfg, model, tok, tasks, prompt_len, fmt=fmt)
        state = recipes.train(sub, learner, agent, learner.init(jax.random.key(config.seed), agent), config.rl_steps,
                              config.eval_every, evaluate, desc=f"spurious {variant}", heldout_file=policy.heldout_file)
        final[variant] = evaluate(learner.model(state))["accuracy"]
        curves[variant] = recipes.series(sub, "eval/accuracy")
    recipes.plot_curves(run_dir.path / "spurious_rewards.png", {"held-out greedy accuracy": curves},
                        title="GRPO with correct vs spurious rewards (clean RandomCalculation)")
    rows = [{"reward": "SFT start", "greedy_acc": start}] + [
        {"reward": v, "greedy_acc": a, "gain_points": 100 * (a - start)} for v, a in final.items()]
    print(run_dir.write_table("results", rows))
    summary = {"start_accuracy": start, **{f"final_{v}": a for v, a in final.items()}, "run_dir": str(run_dir.path)}
    if config.contamination_demo:
        probe = _probe_demo(config, nnx.graphdef(model), start_state, tok, prompt_len)
        print(run_dir.write_table("contamination_probe", probe))
        summary["probe_clean_completion"] = probe[0]["completion_exact"]
        summary["probe_contaminated_completion"] = probe[1]["completion_exact"]
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
