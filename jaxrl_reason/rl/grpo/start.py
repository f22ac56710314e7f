"""A pretrained-style starting checkpoint made on CPU with nothing downloaded: a byte-level BPE
tokenizer trained on the synthetic tasks' text (R1 tags and ChatML markers as special tokens, a
ChatML chat template), a Qwen3-architecture model (q/k RMSNorm) SFT'd on chat-formatted worked
traces, written as a Hugging Face checkpoint directory. It is the start ``experiments/grpo.py`` uses
when no ``--model`` is given, so the synthetic preset runs the same path a real checkpoint does.

    path = make_start_checkpoint("runs/start", StartConfig())   # config, generation config, weights, tokenizer
    model, tok = load_hf_model(path), HFTokenizer.from_pretrained(path)
"""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
from flax import nnx

from jaxrl_reason.data import PromptFormat, render_prompt
from jaxrl_reason.models.lm import LMConfig, Transformer
from jaxrl_reason.models.lm.hf_export import save_hf_model
from jaxrl_reason.models.lm.sft import fit, sft_examples
from jaxrl_reason.models.tokenizer import DEFAULT_SPECIAL, HFTokenizer
from jaxrl_reason.tasks.base import response_ids, sample_problems
from jaxrl_reason.tasks.dataset import task_rows
from jaxrl_reason.tasks.random_calculation import RandomCalculation
from jaxrl_reason.utils.validation import check_hyperparameters

CHATML = (  # Qwen's template without tools: an optional system turn, then <|im_start|>role\ncontent<|im_end|>\n
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
SPECIAL = DEFAULT_SPECIAL + ("<|im_start|>", "<|im_end|>")
SFT_STREAM = (2**31 - 1, 19)  # sft problems: default_rng([seed, *SFT_STREAM]), apart from tasks.task_rows' stream


@dataclasses.dataclass(frozen=True)
class StartConfig:
    seed: int = 0
    # three-step +- problems over operands 0-3: ~7,500 distinct problems built from 224 step facts, so problems
    # held out whole share every step with the trained ones (one-step problems over 0-9 are 300 separate facts)
    task: RandomCalculation = RandomCalculation(min_difficulty=3, max_difficulty=3, max_operand=3, ops="+-")
    vocab_size: int = 320  # BPE target (the corpus may yield fewer)
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int = 16
    d_ff: int = 256
    max_seq_len: int = 96
    # deliberately partial SFT (the R1-Zero presets' "small SFT start"): the format is learned, the
    # arithmetic only partly, so RL has headroom
    sft_problems: int = 4096
    sft_steps: int = 200  # held-out greedy accuracy 0.43 (150 steps: 0.23, 300: 0.93: the curve is steep)
    batch_size: int = 32
    lr: float = 3e-3
    seq_len: int = 64
    tokenizer_corpus: int = 2000  # problems whose text trains the BPE tokenizer

    def __post_init__(self):
        check_hyperparameters(self)


def start_tokenizer(cfg: StartConfig) -> HFTokenizer:
    """Byte-level BPE trained on prompts, traces and answers of ``cfg.task``; eos = ``<|im_end|>`` (ChatML's end of
    turn: where the sampler stops, and the eos ids of the exported config.json / generation_config.json)."""
    rows = task_rows([cfg.task], cfg.tokenizer_corpus, cfg.seed)
    texts = [t for r in rows for t in (r["prompt"], r["trace"], r["answer"])]
    return HFTokenizer.train_bpe(texts, cfg.vocab_size, SPECIAL, eos="<|im_end|>", pad="<pad>", bos="<bos>",
                                 chat_template=CHATML)


def start_model_config(cfg: StartConfig, vocab_size: int) -> LMConfig:
    """A Qwen3-architecture LMConfig (q/k norm, explicit head_dim, no qkv bias): exports as model_type qwen3."""
    return LMConfig(vocab_size=vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
                    n_kv_heads=cfg.n_kv_heads, head_dim=cfg.head_dim, d_ff=cfg.d_ff, max_seq_len=cfg.max_seq_len,
                    qk_norm=True, rope_theta=1e6)


def sft_data(tokenizer: HFTokenizer, problems, seq_len: int, fmt: PromptFormat = PromptFormat("chat")) -> dict:
    """Chat-formatted SFT examples: the rendered user turn, then ``<think>trace</think><answer>answer</answer>``
    and eos as the assistant's reply (loss on the reply)."""
    prompts = [render_prompt(tokenizer, {"prompt": p.prompt}, "prompt", fmt)[1] for p in problems]
    replies = [response_ids(tokenizer, p) + [tokenizer.eos_id] for p in problems]
    return sft_examples(prompts, replies, seq_len, tokenizer)


def sft_problems(cfg: StartConfig, exclude_prompts=frozenset()) -> list:
    """The ``cfg.sft_problems`` SFT problems of ``cfg.seed``, less those whose prompt is in ``exclude_prompts``."""
    problems, _ = sample_problems([cfg.task], np.ones(1), np.random.default_rng([cfg.seed, *SFT_STREAM]),
                                  cfg.sft_problems)
    return [p for p in problems if p.prompt not in exclude_prompts]


def make_start_checkpoint(path, cfg: StartConfig = StartConfig(), overwrite: bool = False,
                          exclude_prompts=frozenset()) -> pathlib.Path:
    """Tokenizer + Qwen3-architecture model + partial SFT -> a HF checkpoint directory at ``path``.
    SFT problems whose prompt is in ``exclude_prompts`` (e.g. a held-out set) are left out."""
    tok = start_tokenizer(cfg)
    model = Transformer(start_model_config(cfg, tok.vocab_size), rngs=nnx.Rngs(cfg.seed))
    problems = sft_problems(cfg, exclude_prompts)
    fit(model, sft_data(tok, problems, cfg.seq_len), cfg.sft_steps, cfg.batch_size, cfg.lr, cfg.seed, name="sft_train")
    return save_hf_model(model, path, tok, overwrite=overwrite)
