"""LoRA vs full fine-tuning under GRPO, from the same SFT warm start, task, seed and held-out set.

R1-Zero-style GRPO (exact-answer reward) on RandomCalculation. Both arms start from one partial SFT
warm start; "full" trains every weight, "lora" only adapters on every Linear (the base frozen, the
KL reference the base with adapters off). Reports held-out greedy
accuracy before/after each with its standard error sqrt(p(1-p)/n) and n, the optimiser-state bytes of
each arm and their ratio, and checks that the merged LoRA model (``merge_lora``, what export writes)
scores as the adapted one. ``arms=("lora",)`` runs the LoRA arm alone (screening variants; the full arm
is deterministic for a seed and config). ``objective="sft"``: the arms continue the warm start with
``sft_steps`` of supervised traces on fresh problems instead of GRPO (each arm at its own step size).
The LoRA arm is exported twice: ``lora/hf/`` (adapters merged, `save_hf_model`) and ``lora/adapter/`` (a PEFT
adapter, `save_peft_adapter`, on ``--model``'s checkpoint, else on ``base/``: the warm start, exported too).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Annotated

import jax
import jax.numpy as jnp
import tyro
from flax import nnx

from jaxrl_reason.models.lm import save_hf_model, save_peft_adapter
from jaxrl_reason.models.lm.lora import (
    LoRAConfig,
    LoRAParam,
    apply_lora,
    merge_lora,
    state_bytes,
)
from jaxrl_reason.models.lm.train import make_optimizer
from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.models.lm.sft import fit
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_for_tasks
from jaxrl_reason.tasks.base import sft_batch
from jaxrl_reason.rewards.evaluation import greedy_eval
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
    # d_model 128: rank-4 adapters on every Linear hold ~4.3% of the weights (at d_model 64 ~9%, at 256 ~2.2%)
    lm: recipes.TinyLM = recipes.TinyLM(d_model=128, n_layers=2, n_heads=4, d_ff=512, max_seq_len=48)
    warm_start: recipes.WarmStart = recipes.WarmStart(problems=4096, steps=100, lr=2e-3, seq_len=40)
    grpo: GRPOConfig = GRPOConfig(
        group_size=8, prompts_per_step=16, lr=1e-4, temperature=0.7, max_new_tokens=16,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
        reward=RewardConfig("correct", format_weight=0.0),
    )
    lora: LoRAConfig = LoRAConfig(rank=4, alpha=8.0, targets=("all_linear",))
    lora_lr: float = 1e-3  # LoRA's usual ~10x larger step size (every other setting the same)
    # the arms to run: ("lora",) screens LoRA variants without rerunning the full arm, which is deterministic
    # for a given seed and config (the optimiser-state ratio is still against the full arm's state, initialised)
    arms: tuple[str, ...] = ("full", "lora")
    objective: str = "grpo"  # grpo | sft (supervised traces from the same warm start)
    sft_steps: int = 100
    sft_problems: int = 4096  # fresh problems (their own seed stream) for objective="sft"
    sft_lr: float = 2e-3  # the full arm's SFT step size (the warm start's)
    lora_sft_lr: float = 1e-2
    rl_steps: int = 100
    eval_every: int = 50  # held-out evaluation interval (0: only before and after; the last step is always evaluated)
    heldout_problems: int = 512
    # --eval-data FILE (+ --eval-samples, --eval-reward, --eval-reward-fn, --eval-prompt-field, --eval-answer-field):
    # each GRPO arm also evaluated on a prompt/answer file
    eval_file: Annotated[recipes.EvalFile, tyro.conf.OmitArgPrefixes] = recipes.EvalFile()
    prompt_len: int | None = None  # None: 24 (raw prompts), or with --model the longest through its chat template
    answer_len: int = 12

    def __post_init__(self):
        check_hyperparameters(self)
        check_intervals(self.rl_steps, eval_every=self.eval_every)
        if self.heldout_problems < 1:
            raise ValueError("heldout_problems must be >= 1")
        if not self.arms or len(set(self.arms)) != len(self.arms) or not set(self.arms) <= {"full", "lora"}:
            raise ValueError(f"arms must be distinct names from ('full', 'lora'), got {self.arms!r}")
        if self.objective not in ("grpo", "sft"):
            raise ValueError(f"objective must be grpo or sft, got {self.objective!r}")
        if self.sft_steps < 1 or self.sft_problems < 1:
            raise ValueError("sft_steps and sft_problems must be >= 1")


RAW_PROMPT_LEN = 24  # <bos> + the cpu preset's problem text (character tokens), with room


PRESETS = {
    "cpu": Config(),
    "gpu": recipes.gpu_preset(
        Config(), lm=recipes.TinyLM(d_model=512, n_layers=4, n_heads=8, d_ff=2048, max_seq_len=128),
        task=RandomCalculation(min_difficulty=1, max_difficulty=4, ops="+-*/"),
        warm_start=recipes.WarmStart(problems=2048, steps=400, batch_size=128, seq_len=96),
        arch="qwen3-0.6b",  # Qwen3-0.6B-sized (random weights; --model a Qwen3 checkpoint)
        lora=LoRAConfig(rank=8, alpha=16.0, targets=("all_linear",)), lora_lr=1e-5,
        rl_steps=400, eval_every=50, heldout_problems=1024),
}


def _se(p: float, n: int) -> float:
    return math.sqrt(p * (1 - p) / n)


SFT_STREAM = 7777  # seed offset of the objective="sft" problems (apart from the warm start's)


def _copy(model):
    """An independent copy of ``model``'s arrays (the jitted SFT step donates what it trains)."""
    return nnx.merge(nnx.graphdef(model), jax.tree.map(jnp.copy, nnx.state(model)))


def _sft_arm(config: Config, name: str, model, tok, tasks):
    """SFT of a copy of ``model`` (LoRA: adapters only) -> (trained model, trained params, optimiser-state bytes)."""
    ws = config.warm_start
    problems = recipes.sft_problems(tasks, config.sft_problems, config.seed + SFT_STREAM)
    data = sft_batch(problems, ws.seq_len, True, None, tokenizer=tok)
    lora = name == "lora"
    m, wrt, lr = (apply_lora(_copy(model), config.lora), LoRAParam, config.lora_sft_lr) if lora else \
        (_copy(model), nnx.Param, config.sft_lr)
    params, _ = fit(m, data, config.sft_steps, ws.batch_size, lr, config.seed, wrt=wrt, name="sft_train")
    return m, params, state_bytes(make_optimizer(lr, config.sft_steps).init(params))


def _grpo_arm(config: Config, name: str, cfg: GRPOConfig, policy: recipes.Policy, tasks, evaluate, run_dir: RunDir):
    """GRPO from ``policy.model`` (never mutated) -> (trained model, trained params, optimiser-state bytes)."""
    learner, agent = grpo_for_tasks(cfg, policy.model, policy.tokenizer, tasks, policy.prompt_len, fmt=policy.fmt)
    state = recipes.train(run_dir.child(name), learner, agent, learner.init(jax.random.key(config.seed), agent),
                          config.rl_steps, config.eval_every, evaluate, desc=f"lora: {name}",
                          heldout_file=policy.heldout_file)
    return learner.model(state), state.params, state_bytes(state.opt_state)


def _export_lora(config: Config, trained, base, tok, run_dir: RunDir) -> dict:
    """The LoRA arm's exports: ``lora/hf/`` (adapters merged; a drop-in replacement of ``--model``'s checkpoint) and
    ``lora/adapter/`` (PEFT, on ``--model``'s checkpoint, else on ``base/``, the warm start exported here); the
    adapter is None, with a note, where peft cannot name the adapters (``save_peft_adapter``'s refusals)."""
    tok = tok if callable(getattr(tok, "save", None)) else None  # CharTokenizer: no HF tokenizer files
    base_model = config.model or save_hf_model(base, run_dir.path / "base", tok, overwrite=True)
    out = {"lora_hf": str(save_hf_model(trained, run_dir.path / "lora" / "hf", tok, source=config.model,
                                        overwrite=True)), "lora_adapter": None}
    try:
        out["lora_adapter"] = str(save_peft_adapter(trained, run_dir.path / "lora" / "adapter", base_model=base_model,
                                                    overwrite=True))
    except ValueError as e:
        print(f"note: no PEFT adapter written ({e}); lora/hf holds the adapters merged", flush=True)
    return out | ({"base_hf": str(base_model)} if config.model is None else {})


def run(config: Config, run_dir: RunDir) -> dict:
    tasks = [config.task]
    begin = recipes.task_start(config, run_dir, tasks, raw_prompt_len=RAW_PROMPT_LEN,
                               n_heldout=config.heldout_problems, desc="lora", steps=config.rl_steps)
    if begin.summary is not None:  # --rl-steps 0 --eval-data F: F evaluated only
        return begin.summary
    policy, held = begin.policy, begin.held
    model, tok, fmt, prompt_len = policy.model, policy.tokenizer, policy.fmt, policy.prompt_len
    n, n_held = config.grpo.max_new_tokens, len(held)
    evaluate = lambda m: {"accuracy": greedy_eval(m, tasks, held, n, tok)["accuracy"]}
    start = evaluate(model)["accuracy"]
    all_arms = {"full": config.grpo, "lora": dataclasses.replace(config.grpo, lora=config.lora, lr=config.lora_lr)}
    rows, out, curves = [], {}, {}
    for name in config.arms:
        t0 = time.perf_counter()
        trained, params, opt_bytes = (_sft_arm(config, name, model, tok, tasks) if config.objective == "sft" else
                                      _grpo_arm(config, name, all_arms[name], policy, tasks, evaluate, run_dir))
        end = evaluate(trained)["accuracy"]
        row = {"arm": name, "n_heldout": n_held, "acc_before": start, "se_before": _se(start, n_held),
               "acc_after": end, "se_after": _se(end, n_held), "gain_points": 100 * (end - start),
               "trainable_params": sum(x.size for x in jax.tree.leaves(params)), "opt_state_bytes": opt_bytes}
        if name == "lora":
            row["acc_merged"] = evaluate(merge_lora(trained))["accuracy"]
            exports = _export_lora(config, trained, model, tok, run_dir)
        row["wall_s"] = time.perf_counter() - t0
        rows.append(row)
        out[name] = row
        if config.objective == "grpo":
            curves[name] = recipes.series(run_dir.child(name), "eval/accuracy")
    if "full" in out:
        full_bytes = out["full"]["opt_state_bytes"]
    elif config.objective == "sft":  # not trained here: the size of the full arm's optimiser state
        full_bytes = state_bytes(make_optimizer(config.sft_lr, config.sft_steps).init(nnx.state(model, nnx.Param)))
    else:
        full, agent = grpo_for_tasks(all_arms["full"], model, tok, tasks, prompt_len, fmt=fmt)
        full_bytes = state_bytes(full.init(jax.random.key(config.seed), agent).opt_state)
        agent.close()
    print(run_dir.write_table("results", rows))
    summary = {"start_accuracy": start, "n_heldout": n_held, "run_dir": str(run_dir.path)}
    for name, row in out.items():
        summary[f"{name}_accuracy"] = row["acc_after"]
        summary[f"{name}_gain_points"] = row["gain_points"]
        summary[f"{name}_wall_s"] = row["wall_s"]
    if "lora" in out:
        ratio = out["lora"]["opt_state_bytes"] / full_bytes
        summary.update(opt_state_ratio=ratio, lora_merged_accuracy=out["lora"]["acc_merged"], **exports)
        print(f"optimiser state: LoRA {out['lora']['opt_state_bytes']:,} B vs full {full_bytes:,} B "
              f"= {100 * ratio:.2f}%")
        print(f"merged LoRA model: {out['lora']['acc_merged']:.4f} vs adapted {out['lora']['acc_after']:.4f}")
    if "full" in out and "lora" in out:
        diff = out["lora"]["acc_after"] - out["full"]["acc_after"]
        se_diff = math.hypot(out["lora"]["se_after"], out["full"]["se_after"])
        summary.update(lora_minus_full_points=100 * diff, se_diff_points=100 * se_diff)
        print(f"final accuracy LoRA - full = {100 * diff:+.1f} points (SE {100 * se_diff:.1f}, n = {n_held} each)")
    if curves:
        recipes.plot_curves(run_dir.path / "lora.png", {"held-out greedy accuracy": curves},
                            title="GRPO: LoRA vs full fine-tuning (same warm start)")
    return summary

if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
