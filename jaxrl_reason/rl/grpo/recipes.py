"""Shared pieces of the small-scale GRPO studies (r1_zero, prorl, spurious_rewards, the notebook):
a tiny LM sized for a tokenizer (the presets use ``CharTokenizer``), seeded data splits, the partial
SFT warm start and a GRPO run with periodic held-out evaluation (``rl.base.run_steps``: checkpoints + exact
resume).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np
from flax import nnx

from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.tokenizer import Tokenizer
from jaxrl_reason.parallel import distributed
from jaxrl_reason.rl.base import run_steps
from jaxrl_reason.rl.grpo.sft import sft_warm_start
from jaxrl_reason.rl.grpo.trainer import GRPOTrainer
from jaxrl_reason.tasks.base import make_batch, sample_problems
from jaxrl_reason.utils.experiment import RunDir
from jaxrl_reason.utils.validation import check_hyperparameters

# seed streams: the trainer draws step s from default_rng([seed, s]); these 3-element seeds never collide
SFT_STREAM, HELDOUT_STREAM = (2**31 - 1, 11), (2**31 - 1, 13)


@dataclasses.dataclass(frozen=True)
class TinyLM:
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 256
    max_seq_len: int = 96
    dtype: str = "float32"  # activations / matmuls (parameters stay float32)
    scan_layers: bool = True  # False: unrolled; the sampler then keeps per-layer weights and cache

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


def load_policy(source: PolicySource, lm: TinyLM, ws: WarmStart, tasks: Sequence, seed: int, weights=None):
    """-> (model, tokenizer, prompt format): a checkpoint as is with a chat-template prompt (R1 system
    message), or an ``arch`` / tiny model warm-started on ``tasks`` with ``CharTokenizer`` and raw prompts."""
    from jaxrl_reason.data import PromptFormat
    from jaxrl_reason.models.lm.pretrained import load_tokenizer
    from jaxrl_reason.models.tokenizer import R1_SYSTEM, CharTokenizer

    if source.model is not None:
        tok = load_tokenizer(source.model)
        fmt = PromptFormat("chat", system=R1_SYSTEM) if tok.chat_template else PromptFormat(
            "plain", template=R1_SYSTEM + " User: {prompt} Assistant: <think>")
        return source.build(None, seed), tok, fmt
    tok = CharTokenizer()
    return warm_start(source.build(lm.config(tok.vocab_size), seed), ws, tasks, seed, tok, weights), tok, None


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


def train(run_dir: RunDir, trainer: GRPOTrainer, state, num_steps: int, eval_every: int,
          evaluate: Callable[[object], dict] | None = None, desc: str = "grpo"):
    """GRPO for ``num_steps`` (``rl.base.run_steps``: ``eval_every`` need not divide it); ``evaluate(model) -> {name:
    scalar}`` is logged (prefixed "eval/") before the first step, after every ``eval_every``-th step (0: none in
    between) and after the last, whatever the interval. Resumes exactly."""
    evals = None if evaluate is None else (
        lambda state: {f"eval/{k}": v for k, v in evaluate(trainer.model(state)).items()})
    state = run_steps(run_dir, trainer.step, state, num_steps, eval_every, evals, desc=desc)
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
