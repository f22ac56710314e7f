"""The checks of ``jaxrl-reason run grpo``'s options (``experiments/grpo.py``; ``config`` is its config, duck-typed):
``check_config`` (every value, every reward loaded, before anything loads: the config's ``__post_init__``) and
``check_flags`` (an option given on the command line that this run would not use is refused: the CLI's hook)."""

from __future__ import annotations

import dataclasses

from jaxrl_reason.rewards.answers import check_require
from jaxrl_reason.rl.base import check_intervals
from jaxrl_reason.rl.grpo.on_data import DTYPES, lora_config, prompt_format, reward_names, synthetic_rows

#: the grpo.* options an evaluation-only run (--steps 0) uses
EVAL_GRPO_FLAGS = {"grpo.max_new_tokens", "grpo.temperature", "grpo.top_p", "grpo.top_k", "grpo.min_p", "grpo.seed"}
TRAIN_FLAGS = {"eval_every", "save_every", "log_every", "sample_every", "export_dtype", "lora_rank", "lora_alpha",
               "lora_dropout", "lora_targets", "train_rows", "plan"}


def check_config(config) -> None:
    """ValueError on a bad value or combination; every reward loaded and checked (``reward_names``). (The config's
    own ``__post_init__`` calls ``check_hyperparameters`` first.)"""
    check_intervals(config.steps, eval_every=config.eval_every, save_every=config.save_every,
                    log_every=config.log_every, sample_every=config.sample_every, eval_samples=config.eval_samples)
    check_require(config.require)
    prompt_format(config)  # the format's own checks (--template / --system / --chat-template-kwargs)
    if (config.heldout is not None and config.heldout < 1) or config.train_rows < 1 or config.sample_rows < 1:
        raise ValueError("heldout, train_rows and sample_rows must be >= 1")
    if config.max_prompt_len is not None and config.max_prompt_len < 1:
        raise ValueError(f"max_prompt_len must be >= 1 (or None: from the data), got {config.max_prompt_len}")
    for name in ("dtype", "param_dtype", "export_dtype"):
        if getattr(config, name) not in (*DTYPES, *((None,) if name == "param_dtype" else ())):
            raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(config, name)!r}")
    if config.lora_rank and config.grpo.lora is not None:
        raise ValueError("give LoRA once: lora_rank or grpo.lora, not both")
    lora_config(config)  # LoRAConfig's own checks
    if config.plan and not config.steps:
        raise ValueError("--plan plans the training step; --steps 0 trains nothing")
    names = reward_names(config)  # loads and checks every reward before anything else
    if config.accuracy not in (None, "strict", *names):
        raise ValueError(f"--accuracy must be 'strict' or a reward's name ({', '.join(names)}), got "
                         f"{config.accuracy!r}")
    if config.accuracy == "strict" and config.answer_field is None:
        raise ValueError("--accuracy strict needs --answer-field")


def check_flags(config, flags: set[str]):
    """Refuse (ValueError) an option given on the command line that this run would not use; ``flags``: the dotted
    field names given (``start.sft_steps``). -> the config, ``fit_new_tokens`` off where ``--grpo.max-new-tokens``
    was given (the budget given is the budget; ``cli.run_experiment`` runs the config returned)."""
    def refuse(flag: str, why: str):
        raise ValueError(f"--{flag.replace('_', '-')} {why}")

    for flag in sorted(flags):
        if flag.startswith("grpo.reward.") or flag == "grpo.reward":
            refuse(flag, "configures the synthetic tasks' reward (rl.grpo.agent.grpo_for_tasks); this run's rewards are "
                   "--reward and --reward-fn")
        rows_from = "--data" if config.data is not None else "--eval-data (--steps 0)"
        if flag.startswith("start.") and config.model is not None and (
                not synthetic_rows(config) or flag not in ("start.task", "start.seed")):
            refuse(flag, "configures the built-in CPU start, which --model replaces" if flag not in (
                "start.task", "start.seed") else f"makes synthetic rows, which {rows_from} replaces")
        if flag in ("train_rows", "distinct_heldout") and not synthetic_rows(config):
            refuse(flag, f"sets the synthetic rows, which {rows_from} replaces")
        if flag in ("heldout", "split_seed") and config.eval_data is not None:
            refuse(flag, "splits --data; the held-out rows come from --eval-data")
        if flag in ("heldout", "split_seed") and config.data is not None and not config.steps:
            refuse(flag, "splits --data for training; --steps 0 evaluates every row of --data")
        if flag == "split_seed" and config.data is None:
            refuse(flag, "splits --data; the synthetic rows hold out whole problems (--heldout of them)")
        if flag == "eval_data" and config.data is None and config.steps:
            refuse(flag, "needs --data to train on (the synthetic rows come with their own held-out problems); "
                   "with --steps 0 it is evaluated alone")
        if flag in ("lora_alpha", "lora_dropout", "lora_targets") and not config.lora_rank:
            refuse(flag, "needs --lora-rank")
        if flag == "accuracy_threshold" and config.accuracy == "strict":
            refuse(flag, "applies to a reward's accuracy, not --accuracy strict")
        if not config.steps and (flag in TRAIN_FLAGS or flag.startswith("grpo.") and flag not in EVAL_GRPO_FLAGS):
            refuse(flag, "applies to training; --steps 0 only evaluates")
    if config.fit_new_tokens and "grpo.max_new_tokens" in flags and "fit_new_tokens" not in flags:
        return dataclasses.replace(config, fit_new_tokens=False)
    return config
