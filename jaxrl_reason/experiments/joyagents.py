"""JoyAgents-R1: plain joint GRPO vs node-wise Monte Carlo + top-K selection, with and without memory.

Pipeline (an LM with shared weights and role prompts unless ``--system.shared False``, then one LM per
agent; see "The LM" below): (1) SFT warm start on scripted traces of the assistant benchmark
(``tasks.assistant``), deliberately imperfect (``TraceNoise``: some route targets are the type's
confusion route; a short schedule leaves the sub-agents partly trained) so that RL has room;
(2) from that same start, four RL arms at the same number of updates (one optimiser step per RL
step; ``rl.minibatches`` of them in the gpu preset) and the same request stream: plain joint GRPO, joint GRPO + memory, node-wise MC + top-K,
node-wise MC + top-K + memory; (3) greedy held-out accuracy per request type every ``eval_every``
updates (memory arms retrieve from their evolved memory; their final model is also evaluated with
the memory switched off). ``mean_acc`` is the mean held-out accuracy over all evaluations (start
included): the area under the learning curve, a summary of learning speed at equal updates.

The LM: ``--model CKPT_DIR`` (a HF checkpoint: its weights, fp32, and its tokenizer; every agent starts
from the checkpoint, one copy per model with ``--system.shared False``, each trained separately), else
``--arch NAME`` (random weights of ``recipes.ARCHS[NAME]`` with the character tokenizer: throughput
runs; the gpu preset: ``qwen3-0.6b``), else the tiny ``lm`` from scratch with ``CharTokenizer`` (the cpu
and gpu_tiny presets). The SFT warm start runs in every case, on the checkpoint too: it is part of the
method here and teaches the system's protocol (templates, routing / role tokens, calls, text spelled
one token per character). A checkpoint tokenizer must have every character of the task as one token
(byte-level BPE: Qwen2/3, Llama 3, ...; else a ValueError names the first character that is not):
requests, answers and steps are spelled one token per character, valid ids but not its canonical
tokenization, and a merged multi-character token the model generates does not parse
(``agents.joyagents.system``). The window (``max_seq_len``) of a checkpoint / arch model is a node's
length, ``system.seq_len``. An arch model's activations are bfloat16 (``PolicySource().dtype``): meant for
a GPU (XLA's CPU backend cannot run the KV-cache sampler's bf16 dots).

    python experiments/joyagents.py --preset cpu
    python experiments/joyagents.py --preset cpu --seeds 8     # seeds seed .. seed+7, paired comparisons
    python experiments/joyagents.py --preset gpu --model /path/to/Qwen3-0.6B
    jaxrl-reason run joyagents --preset smollm2    # heterogeneous SmolLM2-135M-Instruct agents (issue 40)
Plots: accuracy_vs_updates.png (overall + per type), accuracy_vs_trajectories.png; results.md/.csv.
With ``--seeds N > 1`` every seed is a sub-run (``seed<k>/``, its own plots and table) and the run
directory gets ``paired.md/.csv``: for each comparison (memory vs none in each mode, node-wise vs
joint) the mean paired difference of final and mean held-out accuracy, overall and per request type,
with its standard error over seeds and the number of seeds where it is positive; and
``accuracy_vs_updates_mean.png``: every arm's held-out accuracy averaged over the seeds.
Every evaluation also scores the same number of training-split requests (``train_eval/``,
``train_final_acc``, ``train_mean_acc``): RL acts on those directly, while held-out accuracy also needs
the sub-agents' skills to generalise to unseen requests.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from jaxrl_reason.agents.joyagents import study
from jaxrl_reason.agents.joyagents.data import TraceNoise
from jaxrl_reason.agents.joyagents.study import ARMS
from jaxrl_reason.agents.joyagents.system import SystemConfig
from jaxrl_reason.agents.joyagents.trainer import JoyConfig, evaluate, joy_learner, sft_warm_start
from jaxrl_reason.models.lm.sft import SFTConfig
from jaxrl_reason.rl.base import check_intervals, run_steps
from jaxrl_reason.rl.grpo.recipes import PolicySource, TinyLM
from jaxrl_reason.tasks.assistant import TYPES, AssistantTask
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import Rule, at_least, check_hyperparameters, require

@dataclasses.dataclass(frozen=True)
class Config:
    seed: int = 0
    seeds: int = 1  # > 1: run seeds seed .. seed + seeds - 1 and compare the arms paired by seed
    # the LM of every agent: --model CKPT_DIR (a HF checkpoint: its weights and tokenizer; the SFT warm start
    # below still runs on it, it teaches the system's protocol), else --arch NAME (random weights of
    # recipes.ARCHS[NAME] with the character tokenizer: throughput), else `lm` (tiny, from scratch)
    model: str | None = None
    arch: str | None = None
    task: AssistantTask = AssistantTask(difficulty=1)
    system: SystemConfig = SystemConfig(request_tokens=11, step_tokens=6, answer_tokens=2)
    lm: TinyLM = TinyLM(d_model=64, n_layers=2, n_heads=4, d_ff=256, max_seq_len=28)
    noise: TraceNoise = TraceNoise(route_noise=(0.2, 0.2, 0.6, 0.6), hint_rate=0.5, wrong_hint_rate=0.1)
    sft: SFTConfig = SFTConfig(problems=2048, steps=300, batch_size=64, lr=3e-3)
    rl: JoyConfig = JoyConfig(group_size=8, top_k=2, lr=3e-4, temperature=1.0)
    arms: tuple[str, ...] = ("joint", "joint+memory", "nodewise", "nodewise+memory")  # + "joint_4g"
    requests_per_step: int = 8
    rl_steps: int = 30
    eval_every: int = 5
    heldout: int = 256

    CHECKS = ((("requests_per_step", "seeds"), at_least(1)),
              ("heldout", at_least(len(TYPES)), "one per request type at least"),
              ("arms", Rule(lambda a: bool(a) and all(x in ARMS for x in a), f"a non-empty subset of {tuple(ARMS)}")))

    def __post_init__(self):
        check_hyperparameters(self)
        system, task = self.system, self.task
        require(self, system.request_tokens >= task.request_chars,
                f"system.request_tokens ({system.request_tokens}) < the task's longest request ({task.request_chars})")
        require(self, system.step_tokens >= task.call_chars, "system.step_tokens too small for the task's calls")
        require(self, system.answer_tokens >= task.answer_chars, "system.answer_tokens too small for the task's answers")
        PolicySource(self.model, self.arch)  # a known arch
        require(self, self.model is not None or self.arch is not None or self.lm.max_seq_len >= system.seq_len,
                f"lm.max_seq_len ({self.lm.max_seq_len}) < a node's length ({system.seq_len})")
        check_intervals(self.rl_steps, eval_every=self.eval_every)


#: issue 40: agents from the real pretrained SmolLM2-135M-Instruct (--model smollm2-135m-instruct, a packaged
#: GGUF): the protocol SFT on it, then node-wise MC + top-K vs plain joint GRPO (no memory: the claim is the credit
#: assignment) from that same start, paired over seeds; held-out success per request type. CPU-sized: one model
#: with role prompts (``system.shared``; 4 fp32 copies with their Adam states are ~7-8 GB on the shared 2-core
#: machine), a short low-lr SFT, small groups; the gpu preset has one copy per agent (heterogeneous agents)
SMOLLM2 = Config(
    model="smollm2-135m-instruct",
    sft=SFTConfig(problems=1024, steps=60, batch_size=16, lr=5e-5),
    rl=JoyConfig(group_size=4, top_k=2, lr=1e-5, temperature=1.0, memory=False),
    arms=("joint", "nodewise"), seeds=2, requests_per_step=4, rl_steps=16, eval_every=8, heldout=128,
)

PRESETS = {
    "cpu": Config(),
    "smollm2": SMOLLM2,
    # the same claim sized for one H200: 4 seeds, larger groups and request batches, the equal-samples joint
    # control (4G trajectories a request), learning rates for fine-tuning a pretrained model
    "smollm2_gpu": dataclasses.replace(
        SMOLLM2, system=dataclasses.replace(Config().system, shared=False),  # one copy of the model per agent
        sft=SFTConfig(problems=8192, steps=600, batch_size=128, lr=2e-5),
        rl=JoyConfig(group_size=16, top_k=2, lr=1e-6, temperature=1.0, memory=False, minibatches=4),
        arms=("joint", "nodewise", "joint_4g"), seeds=4, requests_per_step=32, rl_steps=100, eval_every=10,
        heldout=512),
    "gpu": Config(
        # JoyAgents-R1's master and sub-agents are Qwen3 models; the Qwen3 in recipes.ARCHS (it fits one GPU,
        # four separate agents included) is Qwen3-0.6B: random weights of it here (throughput), --model a
        # Qwen3-0.6B checkpoint for the paper's kind of start. Learning rates for a 0.6B model (not tuned):
        # full fine-tuning SFT 2e-5, RL 1e-6; minibatches and a one-position logprob chunk bound the RL update's
        # activations and the [rows, chunk, 151936] logits.
        arch="qwen3-0.6b",
        sft=SFTConfig(problems=8192, steps=600, batch_size=128, lr=2e-5),
        rl=JoyConfig(group_size=16, top_k=2, lr=1e-6, temperature=1.0, minibatches=8, logprob_chunk=1),
        requests_per_step=32, rl_steps=100, eval_every=10, heldout=512,
    ),
    # the gpu preset before it took Qwen3-0.6B: a larger tiny LM from scratch (the README's gpu-model row)
    "gpu_tiny": Config(
        lm=TinyLM(d_model=128, n_layers=4, n_heads=4, d_ff=512, max_seq_len=28),
        sft=SFTConfig(problems=8192, steps=600, batch_size=128, lr=2e-3),
        rl=JoyConfig(group_size=16, top_k=2, lr=2e-4, temperature=1.0),
        requests_per_step=32, rl_steps=100, eval_every=10, heldout=512,
    ),
}


def run(config: Config, run_dir: RunDir) -> dict:
    if config.seeds == 1:
        return run_seed(config, run_dir)[0]
    per_seed = []
    for s in range(config.seed, config.seed + config.seeds):
        summary, curves = run_seed(dataclasses.replace(config, seed=s, seeds=1), run_dir.child(f"seed{s}"))
        per_seed.append((summary, curves))
    return study.paired_summary(config, run_dir, per_seed)


def run_seed(config: Config, run_dir: RunDir) -> tuple[dict, dict]:
    """One seed: SFT warm start, every arm, plots and results table -> (summary, curves per arm)."""
    task, system = config.task, config.system
    tok = study.load_tokenizer(config)
    # (1) SFT warm start on scripted, noised traces (on a checkpoint too: it teaches the system's protocol)
    models = study.initial_models(config, tok)
    losses = sft_warm_start(models, task.generate_batch(np.random.default_rng([config.seed, 1]), config.sft.problems),
                            system, config.noise, config.sft, config.seed, tokenizer=tok)
    run_dir.save_json("sft_loss.json", {"first": [float(x[0]) for x in losses],
                                        "last": [float(x[-10:].mean()) for x in losses]})
    held = study.requests(config, task.generate_batch(np.random.default_rng([config.seed, 3]), config.heldout,
                                                      "heldout", balanced=True), tok)
    # the same number of training-split requests: where RL acts directly (held-out accuracy also needs the
    # sub-agents' skills to generalise to unseen requests)
    train = study.requests(config, task.generate_batch(np.random.default_rng([config.seed, 4]), config.heldout,
                                                       "train", balanced=True), tok)

    # (2) RL arms from the same start, same request stream
    requests = lambda s: study.requests(config, task.generate_batch(np.random.default_rng([config.seed, 2, s]),
                                                                    config.requests_per_step), tok)
    rows, curves = [], {}
    for arm in config.arms:
        mode, memory, mult = ARMS[arm]
        rl = dataclasses.replace(config.rl, mode=mode, memory=memory, group_size=config.rl.group_size * mult)
        learner, joy = joy_learner(rl, system, models, tokenizer=tok, requests=requests)
        arm_dir = run_dir.child(arm.replace("+", "_"))

        def evals(state):
            return {**{f"eval/{k}": v for k, v in evaluate(joy, state, held).items()},
                    **{f"train_eval/{k}": v for k, v in evaluate(joy, state, train).items()}}

        state = run_steps(arm_dir, learner.step_fn(joy), learner.init(jax.random.key(config.seed), joy),
                          config.rl_steps, config.eval_every, evals, desc=arm)
        row, curves[arm] = study.arm_row(arm_dir, arm, mode, memory, state, joy, held)
        rows.append(row)
        arm_dir.close()
        print(row, flush=True)

    # (3) updates to reach plain joint GRPO's final accuracy, the figures, the table and the summary
    return study.finish_seed(run_dir, rows, curves), curves


if __name__ == "__main__":
    from jaxrl_reason.cli import script_main

    script_main(__file__)
