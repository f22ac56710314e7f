"""Shared pieces of the small-scale GRPO studies (r1_zero, prorl, spurious_rewards, lora, astro, the notebook):
a tiny LM sized for a tokenizer (the presets use ``CharTokenizer``), seeded data splits, the partial
SFT warm start and a GRPO run with periodic held-out evaluation (``rl.base.run_steps``: checkpoints + exact
resume), on the experiment's own held-out problems and, with ``--eval-data FILE`` (``EvalFile``), on the rows of
a prompt/answer file scored by reward functions (``rewards.evaluation``: greedy accuracy, pass@k, mean@n, each
reward, response length, with SE and n; ``eval_data/...`` metrics and ``eval.png``); ``--rl-steps 0`` with
``--eval-data`` only evaluates the file (``evaluate_only``).

    policy = setup_policy(PolicySource(config.model, config.arch), config.lm, config.warm_start, tasks, seed,
                          prompt_len=config.prompt_len, raw_prompt_len=24, grpo=config.grpo,
                          eval_file=config.eval_file)   # .model .tokenizer .fmt .prompt_len .heldout_file
    if not steps and policy.heldout_file is not None:   # an evaluation-only run
        return evaluate_only(run_dir, policy.model, policy.heldout_file, "r1_zero")
    state = train(run_dir, learner, agent, state, steps, eval_every, evaluate, heldout_file=policy.heldout_file)
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel import distributed
from jaxrl_reason.rewards.evaluation import FileEval, plot_eval
from jaxrl_reason.rl.base import run_steps
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.rl.grpo.agent import GRPOAgent
from jaxrl_reason.rl.lm import Learner
from jaxrl_reason.tasks.base import make_batch, prompt_ids, sample_problems
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

# seed streams: the agent draws step s from default_rng([seed, s]); these 3-element seeds never collide
# (tasks.dataset.TASK_ROWS_STREAM is (2**31 - 1, 17))
SFT_STREAM, HELDOUT_STREAM, PROBE_STREAM = (2**31 - 1, 11), (2**31 - 1, 13), (2**31 - 1, 19)


@dataclasses.dataclass(frozen=True)
class TinyLM:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_seq_len: int = 96
    dtype: str = "float32"  # activations / matmuls (parameters stay float32)
    scan_layers: bool = True  # False: the layer scan unrolled (see sampler.decodes_unstacked)

    def __post_init__(self):
        check_hyperparameters(self)

    def config(self, vocab_size: int) -> LMConfig:
        return LMConfig(vocab_size=vocab_size, d_model=self.d_model, n_layers=self.n_layers, n_heads=self.n_heads,
                        n_kv_heads=self.n_heads, d_ff=self.d_ff, max_seq_len=self.max_seq_len, dtype=self.dtype,
                        scan_layers=self.scan_layers)


@dataclasses.dataclass(frozen=True)
class WarmStart:
    """Deliberately partial SFT: few problems, few steps, so RL has headroom."""

    problems: int = 256
    steps: int = 150
    batch_size: int = 32
    lr: float = 3e-3
    seq_len: int = 64

    def __post_init__(self):
        check_hyperparameters(self)


def build_model(lm: TinyLM, seed: int, tokenizer: Tokenizer) -> Transformer:
    return Transformer(lm.config(tokenizer.vocab_size), rngs=nnx.Rngs(seed))


# The papers' starting points that fit one GPU, as HF config.json fields (models.lm.hf_import reads them).
ARCHS = {
    "qwen2.5-0.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=896, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864, rope_theta=1e6,
                         rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=32768),
    "qwen3-0.6b": dict(model_type="qwen3", vocab_size=151936, hidden_size=1024, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, intermediate_size=3072,
                       rope_theta=1e6, rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=40960),
    "r1-distill-qwen-1.5b": dict(model_type="qwen2", vocab_size=151936, hidden_size=1536, num_hidden_layers=28,
                                 num_attention_heads=12, num_key_value_heads=2, intermediate_size=8960,
                                 rope_theta=1e4, rms_norm_eps=1e-6, tie_word_embeddings=False,
                                 max_position_embeddings=131072),
    "llama-3.2-1b": dict(model_type="llama", vocab_size=128256, hidden_size=2048, num_hidden_layers=16,
                         num_attention_heads=32, num_key_value_heads=8, intermediate_size=8192, rope_theta=5e5,
                         rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=131072,
                         rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                           original_max_position_embeddings=8192)),
}


@dataclasses.dataclass(frozen=True)
class PolicySource:
    """Where an experiment's policy LM comes from: ``model`` (a HF checkpoint directory: its weights and
    tokenizer, no SFT warm start), else ``arch`` (a name in ``ARCHS``: random weights of that size with the
    character tokenizer, warm-started like the tiny LM: for throughput), else the experiment's tiny LM."""

    model: str | None = None
    arch: str | None = None
    max_seq_len: int = 2048  # the window of a checkpoint / arch model (KV cache and RoPE table size)
    dtype: str = "bfloat16"  # activations of an arch model ("float32" on CPU); checkpoints run in fp32

    def __post_init__(self):
        check_hyperparameters(self)
        if self.arch is not None and self.arch not in ARCHS:
            raise ValueError(f"unknown arch {self.arch!r}; known: {sorted(ARCHS)}")

    @property
    def pretrained(self) -> bool:
        return self.model is not None

    def arch_config(self, **overrides) -> LMConfig:
        """The ``LMConfig`` of ``ARCHS[arch]``: window ``max_seq_len``, activations ``dtype``, ``overrides`` (e.g.
        ``remat=True``)."""
        from jaxrl_reason.models.lm.hf_import import config_from_hf

        return config_from_hf(ARCHS[self.arch], source=f"ARCHS[{self.arch!r}]", max_seq_len=self.max_seq_len,
                              dtype=self.dtype, **overrides)

    def build(self, tiny: LMConfig, seed: int, **overrides) -> Transformer:
        """The policy LM before any warm start (every experiment's one loader): the checkpoint (fp32 weights and
        activations), random weights of the arch (seeded by ``seed``), else a fresh model of ``tiny``. The window of
        a checkpoint / arch model is ``max_seq_len``; ``overrides``: more of its ``LMConfig`` fields (``remat``)."""
        if self.model is not None:
            from jaxrl_reason.models.lm.pretrained import load_model

            return load_model(self.model, max_seq_len=self.max_seq_len, **overrides)
        return Transformer(tiny if self.arch is None else self.arch_config(**overrides), rngs=nnx.Rngs(seed))


def checkpoint_format(tokenizer: Tokenizer):
    """A checkpoint's prompt format: its chat template with the R1 system message, else the R1 plain-text prompt."""
    from jaxrl_reason.data import PromptFormat
    from jaxrl_reason.models.tokenizer import R1_SYSTEM

    return PromptFormat("chat", system=R1_SYSTEM) if tokenizer.chat_template else PromptFormat(
        "plain", template=R1_SYSTEM + " User: {prompt} Assistant: <think>")


def policy_tokenizer(source: PolicySource) -> tuple[Tokenizer, object]:
    """(tokenizer, prompt format): a checkpoint's own with ``checkpoint_format``, else ``CharTokenizer`` and None
    (raw ``<bos>`` + problem prompts)."""
    from jaxrl_reason.models.lm.pretrained import load_tokenizer
    from jaxrl_reason.models.tokenizer import CharTokenizer

    if source.model is not None:
        tok = load_tokenizer(source.model)
        return tok, checkpoint_format(tok)
    return CharTokenizer(), None


def load_policy(source: PolicySource, lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, weights=None):
    """-> (model, tokenizer, prompt format): a checkpoint as is with a chat-template prompt (R1 system
    message), or an ``arch`` / tiny model warm-started on ``tasks`` with ``CharTokenizer`` and raw prompts."""
    tok, fmt = policy_tokenizer(source)
    return _build_policy(source, lm, ws, tasks, seed, tok, weights), tok, fmt


def _build_policy(source: PolicySource, lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, tok, weights=None):
    if source.model is not None:
        return source.build(None, seed)
    return warm_start(source.build(lm.config(tok.vocab_size), seed), ws, tasks, seed, tok, weights)


@dataclasses.dataclass(frozen=True)
class EvalFile:
    """``--eval-data FILE``: also evaluate on the rows of a prompt/answer file (JSONL / JSON / Parquet / a
    ``datasets`` directory), before training, every ``--eval-every`` steps and after the last (``--rl-steps 0``:
    once, ``evaluate_only``), scored by reward functions (``rewards.evaluation.reward_eval``): greedy accuracy (a row
    is correct by the strict answer match against ``eval_answer_field`` where every row has it, else when the first
    reward is >= 1; printed once), strict accuracy, pass@k and mean@n of ``eval_samples`` sampled completions (correct
    by the same rule), each reward's mean, response length, all with SE and n, logged as ``eval_data/...`` and drawn
    in ``eval.png``. The prompts are rendered as the experiment's (a
    checkpoint's chat template with the R1 system message, else ``<bos>`` + the prompt)."""

    eval_data: str | None = None  # the eval file (None: only the experiment's own held-out evaluation)
    eval_samples: int = 0  # n sampled completions per row for pass@k and mean@n (0: greedy only)
    # built-in rewards by name (rewards.REWARDS); default exact_match of the <answer> span against
    # --eval-answer-field: the experiments' own answer reward (TaskCorrect) for a file's rows
    eval_reward: tuple[str, ...] = ("exact_match",)
    eval_reward_fn: tuple[str, ...] = ()  # your reward functions: path/to/file.py:name or module:name
    eval_prompt_field: str = "prompt"
    eval_answer_field: str = "answer"

    def __post_init__(self):
        check_hyperparameters(self)
        if self.eval_samples < 0:
            raise ValueError(f"eval_samples must be >= 0 (0: greedy only), got {self.eval_samples}")
        if self.eval_data is not None:
            self.reward_fns()  # every reward loaded and checked before anything else

    def reward_fns(self) -> list:
        """The built-in rewards (the answer rewards read ``eval_answer_field`` in the ``<answer>`` span), then
        ``eval_reward_fn``'s functions (imported, signature-checked)."""
        from jaxrl_reason.rewards import REWARDS, load_reward_fn, make_reward

        unknown = [n for n in self.eval_reward if n not in REWARDS or n == "overlong"]
        if unknown:
            raise ValueError(f"unknown --eval-reward {unknown[0]!r}; built-in: "
                             f"{', '.join(sorted(set(REWARDS) - {'overlong'}))}")
        answer = {"answer_field": self.eval_answer_field}
        kwargs = {"exact_match": {**answer, "require": "tag"}, "math_verify": {**answer, "require": "tag"},
                  "wrong_label": {}}
        fns = [make_reward(n, **kwargs.get(n, {})) for n in self.eval_reward]
        fns += [load_reward_fn(ref) for ref in self.eval_reward_fn]
        if not fns:
            raise ValueError("--eval-data needs at least one --eval-reward or --eval-reward-fn")
        return fns


def heldout_file(spec: EvalFile, tokenizer: Tokenizer, fmt, max_prompt_len: int, grpo) -> FileEval | None:
    """``spec``'s eval file prepared for ``train`` (None without ``--eval-data``): rows rendered with ``fmt`` (None:
    ``<bos>`` + the prompt, as the tasks' raw prompts), those over ``max_prompt_len`` tokens dropped and counted;
    ``grpo`` (``GRPOConfig``): new tokens, the pass@k samples' temperature and filters, the seed."""
    if spec.eval_data is None:
        return None
    from jaxrl_reason.data import PromptFormat
    from jaxrl_reason.models.lm.sampler import SamplerConfig

    fns = spec.reward_fns()
    answers = any(getattr(fn, "answer_field", None) == spec.eval_answer_field for fn in fns)
    sampler = SamplerConfig(grpo.max_new_tokens, temperature=grpo.temperature, top_k=grpo.top_k, top_p=grpo.top_p,
                            min_p=grpo.min_p)
    ev = FileEval(tokenizer, spec.eval_data, fns, grpo.max_new_tokens, prompt_field=spec.eval_prompt_field,
                  fmt=fmt or PromptFormat("plain", template=tokenizer.bos + "{prompt}"),
                  max_prompt_len=max_prompt_len, required_fields=(spec.eval_answer_field,) * answers,
                  answer_field=spec.eval_answer_field, n_samples=spec.eval_samples, sampler=sampler, seed=grpo.seed)
    print(f"[eval_data] a row of {spec.eval_data} is correct by {ev.correct_by}", flush=True)
    return ev


def evaluate_only(run_dir: RunDir, model, heldout_file: FileEval, desc: str) -> dict:
    """An evaluation-only run (``--rl-steps 0`` with ``--eval-data``): ``heldout_file``'s evaluation of ``model`` (the
    experiment's start) logged at step 0 as ``eval_data/...``, its first completions in ``eval_samples.jsonl``,
    ``eval.png`` and a results table -> the summary {"eval_data": the evaluation, "accuracy", "se", "n",
    "correct_by", "run_dir"}."""
    res = heldout_file(model, on_samples=lambda rows: run_dir.log_table("eval_samples", 0, rows))
    run_dir.log(0, {f"eval_data/{k}": v for k, v in res.items()})
    plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", prefix="eval_data/",
              title=f"{desc}: {heldout_file.dataset.source}")
    print(run_dir.write_table("results", [{"model": "start", **res}]))
    return {"eval_data": res, "accuracy": res["accuracy"], "se": res["se"], "n": res["n"],
            "correct_by": heldout_file.correct_by, "run_dir": str(run_dir.path)}


PROMPT_MARGIN = 8  # tokens of room a sized prompt length keeps over the longest probed prompt
PROBE_PROBLEMS = 2048  # problems drawn to size the prompt length


def longest_prompt(tasks: Sequence, tokenizer: Tokenizer, fmt, seed: int, weights=None,
                   n: int = PROBE_PROBLEMS) -> int:
    """Tokens of the longest of ``n`` problems' prompts (their own seed stream) as the agent encodes them
    (``tasks.base.prompt_ids``: ``<bos>`` + text, or rendered with ``fmt``)."""
    rng = np.random.default_rng([seed, *PROBE_STREAM])
    problems = sample_problems(list(tasks), np.ones(len(tasks)) if weights is None else weights, rng, n)[0]
    distinct = {p.prompt: p for p in problems}.values()
    return max(len(prompt_ids(tokenizer, p, fmt)) for p in distinct)


@dataclasses.dataclass
class Policy:
    """What ``setup_policy`` returns: the policy LM, its tokenizer and prompt format (None: raw prompts), the
    prompt length of the task prompts and the ``--eval-data`` file prepared (None without one)."""

    model: Transformer
    tokenizer: Tokenizer
    fmt: object
    prompt_len: int
    heldout_file: FileEval | None = None


def setup_policy(source: PolicySource, lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, *,
                 prompt_len: int | None, raw_prompt_len: int, grpo, eval_file: EvalFile | None = None,
                 weights=None) -> Policy:
    """``load_policy`` with the prompt length and the eval file settled first. ``prompt_len`` None: for a
    checkpoint the longest probed prompt through its template (``longest_prompt``) + ``PROMPT_MARGIN``, capped by
    the window ``source.max_seq_len`` minus ``grpo.max_new_tokens``; else ``raw_prompt_len`` (the presets' raw
    ``<bos>`` + problem length). A given ``prompt_len`` shorter than the longest probed prompt is one ValueError
    naming ``--prompt-len`` and the length needed. A checkpoint's / arch's window is then the longest prompt (the
    tasks' or the eval file's) + ``grpo.max_new_tokens``; the tiny LM's stays ``lm.max_seq_len``."""
    tok, fmt = policy_tokenizer(source)
    new = grpo.max_new_tokens
    cap = (lm.max_seq_len if source.model is None and source.arch is None else source.max_seq_len) - new
    where = "through the checkpoint's chat template" if fmt is not None else "(<bos> + the problem text)"
    if prompt_len is None and fmt is None:
        prompt_len = raw_prompt_len
    need = longest_prompt(tasks, tok, fmt, seed, weights)
    if prompt_len is None:
        if need > cap:
            raise ValueError(f"the task prompts {where} need {need} tokens, but the window ({cap + new}) leaves "
                             f"{cap} besides --grpo.max-new-tokens {new}")
        prompt_len = min(need + PROMPT_MARGIN, cap)
    elif prompt_len < need:
        raise ValueError(f"--prompt-len {prompt_len} is too short: the task prompts {where} need {need} tokens "
                         f"(give --prompt-len {need + PROMPT_MARGIN}, or leave it unset with --model to size it)")
    elif prompt_len > cap:
        raise ValueError(f"--prompt-len {prompt_len} + --grpo.max-new-tokens {new} exceed the model's window "
                         f"({cap + new} tokens)")
    held = heldout_file(eval_file or EvalFile(), tok, fmt, cap, grpo)
    if source.model is not None or source.arch is not None:
        window = max(prompt_len, held.dataset.prompt_len if held is not None else 0) + new
        source = dataclasses.replace(source, max_seq_len=window)
    return Policy(_build_policy(source, lm, ws, tasks, seed, tok, weights), tok, fmt, prompt_len, held)


@dataclasses.dataclass
class TaskStart:
    """What ``task_start`` returns: the ``Policy`` and the held-out problems, or (``summary`` not None) the summary
    of an evaluation-only run, which the experiment returns as it is."""

    policy: Policy
    held: object = None
    summary: dict | None = None


def task_start(config, run_dir: RunDir, tasks: Sequence, *, raw_prompt_len: int, n_heldout: int, desc: str,
               steps: int, weights=None) -> TaskStart:
    """The task experiments' ``run()`` opening (r1_zero, prorl, spurious_rewards, lora): ``setup_policy`` from the
    config's ``model``, ``arch``, ``lm``, ``warm_start``, ``seed``, ``prompt_len``, ``grpo`` and ``eval_file``; with
    ``steps`` 0 and ``--eval-data`` the evaluation-only run (``evaluate_only``, its summary in ``.summary``); else
    ``n_heldout`` held-out problems (``heldout``: the config's ``answer_len``, the policy's prompt length and
    format)."""
    policy = setup_policy(PolicySource(config.model, config.arch), config.lm, config.warm_start, tasks, config.seed,
                          prompt_len=config.prompt_len, raw_prompt_len=raw_prompt_len, grpo=config.grpo,
                          eval_file=config.eval_file, weights=weights)
    if not steps and policy.heldout_file is not None:  # --rl-steps 0 --eval-data F: evaluate F only
        return TaskStart(policy, summary=evaluate_only(run_dir, policy.model, policy.heldout_file, desc))
    held = heldout(tasks, n_heldout, config.seed, policy.prompt_len, config.answer_len, policy.tokenizer,
                   weights=weights, fmt=policy.fmt)
    return TaskStart(policy, held)


#: the task experiments' "gpu" preset model (r1_zero, prorl, spurious_rewards)
GPU_LM = TinyLM(d_model=256, n_layers=4, n_heads=8, d_ff=1024, max_seq_len=128)


def gpu_preset(config, **changes):
    """The task experiments' "gpu" preset: ``config`` with its ``grpo`` at the papers' scale (128 prompts x 16
    samples, 512 new tokens, lr 1e-6, 8 minibatches), prompts of 256 tokens and answers of 16, then ``changes``."""
    grpo = dataclasses.replace(config.grpo, prompts_per_step=128, group_size=16, max_new_tokens=512, lr=1e-6,
                               minibatches=8)
    return dataclasses.replace(config, **{"grpo": grpo, "prompt_len": 256, "answer_len": 16, **changes})


def sft_problems(tasks: Sequence, n: int, seed: int, weights=None):
    rng = np.random.default_rng([seed, *SFT_STREAM])
    return sample_problems(list(tasks), np.ones(len(tasks)) if weights is None else weights, rng, n)[0]


def heldout(tasks: Sequence, n: int, seed: int, prompt_len: int, answer_len: int, tokenizer: Tokenizer,
            weights=None, fmt=None):
    """The held-out problems (their own seed stream), prompts encoded with ``tokenizer`` (and ``fmt``)."""
    return make_batch(list(tasks), np.random.default_rng([seed, *HELDOUT_STREAM]), n, prompt_len, answer_len, weights,
                      tokenizer=tokenizer, fmt=fmt)


def warm_started_model(lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, tokenizer: Tokenizer,
                       weights=None) -> Transformer:
    return warm_start(build_model(lm, seed, tokenizer), ws, tasks, seed, tokenizer, weights)


def warm_start(model, ws: WarmStart, tasks: Sequence, seed: int, tokenizer: Tokenizer, weights=None):
    """``model`` after the partial SFT warm start on ``tasks`` (updated in place and returned)."""
    sft_warm_start(model, sft_problems(tasks, ws.problems, seed, weights), ws.steps, ws.batch_size, ws.seq_len,
                   ws.lr, seed=seed, tokenizer=tokenizer)
    return model


def train(run_dir: RunDir, learner: Learner, agent: GRPOAgent, state, num_steps: int, eval_every: int,
          evaluate: Callable[[object], dict] | None = None, desc: str = "grpo", *,
          heldout_file: FileEval | None = None):
    """GRPO for ``num_steps`` (``rl.base.run_steps``: ``eval_every`` need not divide it); ``evaluate(model) -> {name:
    scalar}`` is logged (prefixed "eval/") before the first step, after every ``eval_every``-th step (0: none in
    between) and after the last, whatever the interval; so is ``heldout_file``'s evaluation (``setup_policy`` /
    ``heldout_file``: prefixed "eval_data/", its first completions in ``eval_samples.jsonl``, drawn in
    ``eval.png``). Resumes exactly."""
    def evals(state) -> dict:
        model, out = learner.model(state), {}
        if evaluate is not None:
            out |= {f"eval/{k}": v for k, v in evaluate(model).items()}
        if heldout_file is not None:
            step = int(state.step)
            res = heldout_file(model, on_samples=lambda rows: run_dir.log_table("eval_samples", step, rows))
            out |= {f"eval_data/{k}": v for k, v in res.items()}
        return out

    state = run_steps(run_dir, learner.step_fn(agent), state, num_steps, eval_every,
                      evals if evaluate is not None or heldout_file is not None else None, desc=desc)
    if heldout_file is not None:
        plot_eval(run_dir.read_metrics(), run_dir.path / "eval.png", prefix="eval_data/",
                  title=f"{desc}: {heldout_file.dataset.source}")
    run_dir.close()
    return state


def series(run_dir: RunDir, key: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of one metric from a run's metrics.jsonl."""
    pts = [(r["step"], r[key]) for r in run_dir.read_metrics() if key in r]
    return (np.array([p[0] for p in pts]), np.array([p[1] for p in pts])) if pts else (np.zeros(0), np.zeros(0))


def plot_curves(path, panels: dict[str, dict[str, tuple]], title: str = "", marks: dict[str, Sequence] | None = None):
    """panels: {panel title: {curve label: (x, y)}} -> one PNG; ``marks`` draws vertical lines per panel.
    In a multi-process run only process 0 draws (the others return the path)."""
    if not distributed.is_primary():
        return path
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels), 3.4), squeeze=False)
    for ax, (name, curves) in zip(axes[0], panels.items()):
        for label, (x, y) in curves.items():
            ax.plot(x, y, label=label, marker="." if len(x) < 40 else None)
        for x in (marks or {}).get(name, ()):
            ax.axvline(x, color="grey", lw=0.6, ls=":")
        ax.set_title(name)
        ax.set_xlabel("RL step")
        if len(curves) > 1:
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
