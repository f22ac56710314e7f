"""GRPO on a checkpoint, your data and your reward functions: the pieces of ``jaxrl-reason run grpo``
(``experiments/grpo.py`` holds its config, presets and run). ``config`` below is that experiment's config (duck-typed:
its fields are the command line's options).

    check_config(config)                        # every option checked, every reward loaded, before anything loads
    fns = reward_fns(config)                    # [(fn, weight)]: the built-in rewards, then --reward-fn's functions
    rows, held_rows, data, eval_data = grpo_rows(config, run_dir)   # the rows (without --data: the start's task)
    model_dir = start_checkpoint(config, run_dir, held_rows)        # --model, else the CPU start built in run_dir
    train_ds, held_ds, grpo = prompt_datasets(config, tok, model.cfg.max_seq_len, rows, held_rows, data, eval_data)
    summary = results(config, run_dir, model_dir, held_ds)          # results table and the summary's numbers

The command line's own checks (an option given that the run would not use) are ``rl.grpo.flags.check_flags``.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax

from jaxrl_reason.data import (DataError, PromptDataset, PromptFormat, heldout_split, load_rows, require_fields,
                               write_jsonl)
from jaxrl_reason.data.splits import AUTO_MAX
from jaxrl_reason.models.lm.lora import LoRAConfig
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.parallel.distributed import on_primary
from jaxrl_reason.rewards import REWARDS, RewardSuite, load_reward_fn, make_reward
from jaxrl_reason.rewards.evaluation import reward_eval
from jaxrl_reason.rewards.user import required_fields
from jaxrl_reason.rl.grpo.agent import GRPOConfig
from jaxrl_reason.rl.grpo.start import make_start_checkpoint
from jaxrl_reason.tasks import task_rows
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.records import summary_figures

ANSWER_REWARDS = ("exact_match", "math_verify", "wrong_label")  # they read --answer-field
DTYPES = ("float32", "bfloat16")
#: the progress bar's and the log lines' metrics: {label: metric}
SHOW = {"reward": "reward", "len": "response_length", "loss": "policy_loss", "kl": "kl", "lr": "lr",
        "s/step": "time_step_s"}


def synthetic_rows(config) -> bool:
    """The start's task makes the rows: no --data, and not an evaluation-only run (--steps 0) of --eval-data."""
    return config.data is None and (config.steps > 0 or config.eval_data is None)


def builtin_rewards(config) -> tuple[str, ...]:
    """``--reward``'s names; None: math_verify, or none when ``--reward-fn`` is given."""
    return config.reward if config.reward is not None else (() if config.reward_fn else ("math_verify",))


def reward_fns(config) -> list[tuple]:
    """[(fn, weight)]: the built-in rewards, then ``--reward-fn``'s functions (imported, signature-checked)."""
    builtin = builtin_rewards(config)
    n = len(builtin) + len(config.reward_fn)
    if not n:
        raise ValueError("give at least one --reward or --reward-fn")
    if config.reward_weight and len(config.reward_weight) != n:
        raise ValueError(f"--reward-weight needs one weight per reward ({n}: {len(builtin)} built-in, then "
                         f"{len(config.reward_fn)} --reward-fn), got {len(config.reward_weight)}")
    fns = [builtin_reward(name, config.answer_field, config.require) for name in builtin]
    fns += [load_reward_fn(ref) for ref in config.reward_fn]
    return list(zip(fns, config.reward_weight or (1.0,) * n))


def reward_names(config) -> tuple[str, ...]:
    """The rewards' names as logged (``reward/<name>``), made unique."""
    return RewardSuite(reward_fns(config)).names


def builtin_reward(name: str, answer_field: str | None, require: str):
    """A built-in reward by name; the answer rewards read ``answer_field`` where ``require`` says."""
    if name == "overlong":
        raise ValueError("use --grpo.overlong-cache N for DAPO's overlong reward")
    if name not in REWARDS:
        raise ValueError(f"unknown --reward {name!r}; built-in: {', '.join(sorted(set(REWARDS) - {'overlong'}))} "
                         "(your own: --reward-fn path/to/file.py:function)")
    if name in ANSWER_REWARDS:
        if answer_field is None:
            raise ValueError(f"--reward {name} compares with the gold answer: give --answer-field")
        kwargs = {"answer_field": answer_field}
        return make_reward(name, **kwargs, **({"require": require} if name != "wrong_label" else {}))
    return make_reward(name)


def prompt_format(config) -> PromptFormat:
    """``--prompt-format``: chat (the checkpoint's template) or plain (``--template``), ``--system`` and
    ``--chat-template-kwargs``."""
    chat = config.prompt_format == "chat"
    return PromptFormat(config.prompt_format, config.template if not chat else "{prompt}", config.system,
                        chat_kwargs(config.chat_template_kwargs))


def chat_kwargs(items: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
    """("enable_thinking=false", ...) -> (("enable_thinking", False), ...): JSON values, else the text."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.isidentifier():
            raise ValueError(f"--chat-template-kwargs takes NAME=VALUE items, got {item!r}")
        try:
            out.append((name, json.loads(value)))
        except json.JSONDecodeError:
            out.append((name, value))
    return tuple(out)


def lora_config(config) -> LoRAConfig | None:
    """--lora-rank's adapters, else ``grpo.lora``'s (Python only), else None (full fine-tuning)."""
    if config.lora_rank:
        return LoRAConfig(rank=config.lora_rank, alpha=config.lora_alpha, dropout=config.lora_dropout,
                          targets=config.lora_targets)
    return config.grpo.lora


def grpo_rows(config, run_dir: RunDir) -> tuple[list, list, str, str]:
    """(training rows, held-out rows, their sources), checked for the prompt field and, for the answer rewards, the
    answer field; without --data the start's synthetic task written as JSONL under the run dir."""
    data, eval_data = config.data, config.eval_data
    if synthetic_rows(config):
        n_held = config.heldout or AUTO_MAX
        if config.distinct_heldout:  # n distinct problems, the first seen in n more draws after the training rows
            rows = task_rows([config.start.task], config.train_rows + 2 * n_held, config.start.seed)
            held_rows = list({r["prompt"]: r for r in rows[config.train_rows:]}.values())  # first-seen order
            if len(held_rows) < n_held:
                raise DataError(f"{config.start.task} gave {len(held_rows)} distinct problems in {2 * n_held} "
                                f"draws, fewer than --heldout {n_held}; use a task with a larger problem space")
            held_rows = held_rows[:n_held]
        else:  # the n draws after the training rows (a problem may occur twice)
            rows = task_rows([config.start.task], config.train_rows + n_held, config.start.seed)
            held_rows = rows[config.train_rows:]
        held_prompts = {r["prompt"] for r in held_rows}  # whole problems held out: none of them is trained on
        train = [r for r in rows[: config.train_rows] if r["prompt"] not in held_prompts]
        if not train:
            raise DataError(f"{config.start.task} has too few distinct problems: every training row is also "
                            "held out; use a task with a larger problem space")
        data, eval_data = on_primary(lambda: [str(write_jsonl(rs, run_dir.path / "data" / f"{name}.jsonl"))
                                              for rs, name in ((train, "train"), (held_rows, "heldout"))])
    needs_answer = any(name in ANSWER_REWARDS for name in builtin_rewards(config))
    named = {f for fn, _ in reward_fns(config) for f in required_fields(fn)} - {"step", "completion_ids"}
    fields = tuple(dict.fromkeys((config.prompt_field, *((config.answer_field,) if needs_answer else ()), *named)))
    rows = [] if data is None else load_rows(data)  # none: --steps 0 of --eval-data alone
    if data is not None:
        require_fields(rows, fields, data)  # (before the split: the error names the file's row)
    if eval_data is None and not config.steps:  # evaluation only: every row
        rows, held_rows, eval_data = [], rows, data
    elif eval_data is None:
        rows, held_rows = heldout_split(rows, config.heldout, config.split_seed, str(data))
        eval_data = f"{data} ({len(held_rows)} rows held out at random, --split-seed {config.split_seed})"
    else:
        held_rows = load_rows(eval_data)
        require_fields(held_rows, fields, eval_data)
    return rows, held_rows, data, eval_data


def start_checkpoint(config, run_dir: RunDir, held_rows: list) -> str:
    """--model, or the CPU start built under the run dir (kept across --resume), its SFT data free of
    the held-out problems."""
    if config.model is not None:
        return config.model
    path = run_dir.path / "start"
    held = frozenset(str(r[config.prompt_field]) for r in held_rows)

    def build() -> None:  # process 0 builds it; the others wait and then read it
        if not (path / "config.json").is_file():
            make_start_checkpoint(path, config.start, overwrite=True, exclude_prompts=held)

    on_primary(build, errors=(DataError, ValueError))
    return str(path)


def model_dtypes(config) -> dict:
    """``load_model``'s dtype overrides (none for float32: the checkpoint loads as it always did)."""
    param_dtype = config.param_dtype or config.dtype
    if config.dtype == "bfloat16" and jax.default_backend() == "cpu":
        raise ValueError("--dtype bfloat16 computes in bfloat16, which XLA's CPU backend cannot (no bf16 x bf16 -> "
                         "f32 dot); on CPU use --param-dtype bfloat16 (bf16 weights, float32 activations)")
    if config.dtype == param_dtype == "float32":
        return {}
    return {"dtype": config.dtype, "param_dtype": param_dtype}


def prompt_datasets(config, tok, window: int, rows: list, held_rows: list, data, eval_data, run_dir: RunDir):
    """(training prompts, held-out prompts, ``config.grpo`` with its new tokens fitted): prompts over the cap
    (``--max-prompt-len``, None: the longest, capped by the model's ``window``) dropped and counted, logged at step
    0 of a new run as ``data/...``; the training set is the held-out one for ``--steps 0``."""
    cap = config.max_prompt_len or window - (1 if config.fit_new_tokens else config.grpo.max_new_tokens)
    if cap < 1:
        raise DataError(f"the model's window ({window} tokens) leaves no room for a prompt besides "
                        f"--grpo.max-new-tokens {config.grpo.max_new_tokens}")
    make = lambda rs, src, seed: PromptDataset(rs, tok, config.prompt_field, cap, prompt_format(config), seed,
                                               source=src, fit=config.max_prompt_len is None)
    held_ds = make(held_rows, eval_data, 0)
    train_ds = make(rows, data, config.grpo.seed) if config.steps else held_ds
    g = fit_new_tokens(config, window, max(train_ds.prompt_len, held_ds.prompt_len))
    if not run_dir.resumed:
        run_dir.log(0, {"data/dropped_train_prompts": train_ds.dropped, "data/dropped_heldout_prompts": held_ds.dropped,
                        "data/prompt_len": train_ds.prompt_len, "data/max_new_tokens": g.max_new_tokens})
    return train_ds, held_ds, g


def fit_new_tokens(config, window: int, longest: int) -> GRPOConfig:
    """``config.grpo``, its ``max_new_tokens`` lowered (``fit_new_tokens``) to what the model's ``window`` leaves after
    the ``longest`` prompt, with one printed line; DataError when nothing is left."""
    g = config.grpo
    if not config.fit_new_tokens or longest + g.max_new_tokens <= window:
        return g
    if longest >= window:
        raise DataError(f"--max-prompt-len {longest} leaves no room for new tokens in the model's window ({window})")
    print(f"[grpo] max new tokens: {window - longest} (the window {window} minus the longest prompt {longest}; pass "
          "--grpo.max-new-tokens to choose)", flush=True)
    return dataclasses.replace(g, max_new_tokens=window - longest)


def evaluator(config, run_dir: RunDir, tok, held_ds, suite: RewardSuite, g: GRPOConfig):
    """(model, step) -> the held-out evaluation (``rewards.evaluation.reward_eval``: greedy, and with
    ``--eval-samples`` n sampled completions by ``g``'s sampling) as ``eval/...`` metrics; its first completions
    logged to ``eval_samples.jsonl``."""
    sampler = SamplerConfig(g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, min_p=g.min_p)

    def evaluate(model, step: int) -> dict:
        res = reward_eval(model, tok, held_ds, suite, g.max_new_tokens, config.stop,
                          answer_field=config.answer_field, samples=config.sample_rows, accuracy=config.accuracy,
                          threshold=config.accuracy_threshold, n_samples=config.eval_samples, sampler=sampler,
                          seed=g.seed, on_samples=lambda rows: run_dir.log_table("eval_samples", step, rows))
        return {f"eval/{k}": v for k, v in res.items()}

    return evaluate


def sample_logger(config, run_dir: RunDir, agent):
    """``run_steps``' ``after_step``: a table of the step's first training completions (``train_samples.jsonl``),
    every ``--sample-every`` steps."""
    def after_step(state) -> None:
        step = int(state.step)
        if config.sample_every and step % config.sample_every == 0:
            last = agent.last_samples
            run_dir.log_table("train_samples", step, [{k: v[i] for k, v in last.items()}
                                                      for i in range(min(config.sample_rows, len(last["prompt"])))])

    return after_step


def train_overlap(config, rows: list, held_ds) -> float:
    """The share of held-out prompts that also occur in the training rows (by prompt text), printed when any."""
    seen = {str(r[config.prompt_field]) for r in rows}
    overlap = sum(str(r[config.prompt_field]) in seen for r in held_ds.rows) / len(held_ds)
    if overlap:
        print(f"note: {overlap:.0%} of the held-out prompts also occur in the training data (by prompt text): the "
              "held-out accuracy then measures those problems too")
    return overlap


def results(config, run_dir: RunDir, model_dir: str, held_ds) -> dict:
    """The first and last evaluations as a table (results.md / .csv, printed) and the summary's numbers: with
    training, start and final accuracy and their gains with SE; without, the evaluation's numbers."""
    evals = [{k.removeprefix("eval/"): v for k, v in r.items() if k.startswith("eval/")}
             for r in run_dir.read_metrics() if "eval/accuracy" in r]
    if not config.steps:
        print(run_dir.write_table("results", [{"model": model_dir, **evals[-1]}]))
        return {"eval": evals[-1], "accuracy": evals[-1]["accuracy"], "se": evals[-1]["se"], "n_heldout": len(held_ds)}
    start, end = evals[0], evals[-1]
    print(run_dir.write_table("results", [{"model": "start", **start}, {"model": "GRPO", **end}]))
    out = {"start_accuracy": start["accuracy"], "final_accuracy": end["accuracy"], "n_heldout": end["n"],
           "start_se": start["se"], "final_se": end["se"],
           "gain_points": 100 * (end["accuracy"] - start["accuracy"]),
           "gain_se_points": 100 * math.hypot(start["se"], end["se"]), "final_eval": end}
    if "strict_accuracy" in end:
        out |= {"start_strict_accuracy": start["strict_accuracy"], "final_strict_accuracy": end["strict_accuracy"],
                "strict_gain_points": 100 * (end["strict_accuracy"] - start["strict_accuracy"]),
                "strict_gain_se_points": 100 * math.hypot(start["strict_se"], end["strict_se"])}
    return out


def record(summary: dict) -> list[dict]:
    """The figures ``--record PATH`` writes: start and final held-out greedy accuracy and the gain in points, each
    with SE and n (``--steps 0``: the accuracy; ``--plan``: every scalar)."""
    n = summary.get("n_heldout")
    if "start_accuracy" in summary:
        return [{"name": "start accuracy", "value": summary["start_accuracy"], "se": summary["start_se"], "n": n},
                {"name": "final accuracy", "value": summary["final_accuracy"], "se": summary["final_se"], "n": n},
                {"name": "gain", "value": summary["gain_points"], "se": summary["gain_se_points"], "n": n,
                 "unit": "points"}]
    if "accuracy" in summary:
        return [{"name": "accuracy", "value": summary["accuracy"], "se": summary["se"], "n": n}]
    return summary_figures(summary)
