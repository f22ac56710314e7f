"""GRPO step throughput with the time split between sampling, rewards and update, and the cost of
the tokenizer seam: two arms timed in interleaved rounds in one process.

One step = G completions for each of P prompts from the jitted KV-cache sampler, rewards, then the
old-policy and reference log-probs and the jitted update. The model is randomly initialised
(throughput does not depend on what it knows) and the prompts are RandomCalculation problems. Arms
(the same learner config, model, prompts and character tokenizer):

- ``token``: correctness scored in jnp on the sampled token ids (``tasks.verify.score``: the scoring
  the GRPO trainer ran before the tokenizer seam), called as one reward function;
- ``text``: the seam's path: completions decoded to text, ``rewards.TaskCorrect`` in the reward thread
  pool, overlapped with the device's log-probs.

Token rates count the tokens actually generated (a sequence stops at its stop token). Steps after
``warmup`` (compilation) are timed, arms alternating each round; medians are reported with the ratio
text / token of the step time. ``reward_idle`` is the time the device waited for the host's rewards.

    python experiments/bench_grpo.py --preset cpu   # tiny model, 16 prompts x 8, 64 new tokens
    python experiments/bench_grpo.py --preset gpu   # ~100M dense bf16, 256 prompts x 8, 256 new tokens
"""

from __future__ import annotations

import dataclasses
import statistics

import jax
import numpy as np

from jaxrl_reason.models.lm import param_count
from jaxrl_reason.models.tokenizer import CharTokenizer
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_learner
from jaxrl_reason.rewards import TaskCorrect
from jaxrl_reason.tasks import TaskDataset
from jaxrl_reason.tasks.base import batch_from_problems
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.tasks.verify import score
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    # unrolled: the sampler keeps per-layer weights and cache in its loop; max_seq_len >= prompt + new tokens
    lm: recipes.TinyLM = recipes.TinyLM(scan_layers=False)
    prompts: int = 16
    group_size: int = 8
    new_tokens: int = 64
    minibatches: int = 1
    prompt_len: int = 28
    warmup: int = 1
    steps: int = 5

    def __post_init__(self):
        check_hyperparameters(self)
        if self.warmup < 1 or self.steps < 1:
            raise ValueError(f"warmup and steps must be >= 1 (the first step compiles), got {self.warmup}, {self.steps}")


PRESETS = {
    "cpu": Config(),
    # the target: ~100M parameters (113M), 256 prompts x 8 samples, 256 new tokens
    "gpu": Config(lm=recipes.TinyLM(d_model=768, n_layers=12, n_heads=12, d_ff=3072, max_seq_len=288, dtype="bfloat16"),
                  prompts=256, new_tokens=256, minibatches=8, steps=3),
}


class TokenScore:
    """Correctness scored on token ids in jnp (``tasks.verify.score``), as GRPO did before the seam."""

    name = "correct"

    def __init__(self, tasks: tuple, tokenizer: CharTokenizer):
        self.tasks, self.tokenizer = tasks, tokenizer

    def __call__(self, prompts, completions, completion_ids, problem, task_id, **fields):
        width = max(map(len, completion_ids))
        ids, lens = self.tokenizer.pad_batch(completion_ids, width)
        batch = batch_from_problems(problem, task_id, 64, 32, tokenizer=self.tokenizer)
        return score(self.tasks, batch, ids, lens, self.tokenizer)["correct"].astype(np.float32)


def run(config: Config, run_dir: RunDir) -> dict:
    tok = CharTokenizer()
    model = recipes.build_model(config.lm, config.seed, tok)
    grpo = GRPOConfig(group_size=config.group_size, prompts_per_step=config.prompts, max_new_tokens=config.new_tokens,
                      minibatches=config.minibatches, seed=config.seed)
    tasks = (RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=9, ops="+-*"),)
    dataset = TaskDataset(list(tasks), tok, config.prompt_len, seed=config.seed)
    arms = {"token": [TokenScore(tasks, tok)], "text": [TaskCorrect(tasks)]}
    runs = {arm: grpo_learner(grpo, model, tok, dataset, fns) for arm, fns in arms.items()}  # (learner, agent)
    states = {arm: learner.init(jax.random.key(config.seed), agent) for arm, (learner, agent) in runs.items()}
    steps = {arm: learner.step_fn(agent) for arm, (learner, agent) in runs.items()}
    rows = {arm: [] for arm in arms}
    keys = ("time_sample_s", "time_reward_idle_s", "time_update_s", "response_length")
    for i in range(config.warmup + config.steps):
        for arm, step in steps.items():  # interleaved: the machine's noise hits both arms alike
            states[arm], m = step(states[arm])
            if i >= config.warmup:
                rows[arm].append({k: float(m[k]) for k in keys})
                run_dir.log(i, {f"{arm}/{k}": v for k, v in rows[arm][-1].items()})
    for _, agent in runs.values():
        agent.close()
    sequences = config.prompts * config.group_size
    table = []
    for arm, rs in rows.items():
        med = {k: statistics.median(r[k] for r in rs) for k in keys}
        step_s = statistics.median(r["time_sample_s"] + r["time_reward_idle_s"] + r["time_update_s"] for r in rs)
        tokens = sequences * med["response_length"]
        table.append({"arm": arm, "device": jax.devices()[0].device_kind, "params": param_count(model),
                      "sequences_per_step": sequences, "new_tokens": config.new_tokens, "step_s": step_s,
                      "sample_s": med["time_sample_s"], "reward_idle_s": med["time_reward_idle_s"],
                      "update_s": med["time_update_s"], "sampled_tokens_per_s": tokens / med["time_sample_s"],
                      "step_tokens_per_s": tokens / step_s, "rounds": len(rs)})
    print(run_dir.write_table("results", table))
    summary = {row["arm"]: row for row in table}
    summary["ratio_text_over_token_step"] = summary["text"]["step_s"] / summary["token"]["step_s"]
    print(f"step time, text rewards (seam) / token-id scoring: {summary['ratio_text_over_token_step']:.3f}")
    return summary


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
