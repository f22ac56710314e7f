"""transformers as the reference the benchmarks measure against (``experiments/bench_hf_decode.py``,
``experiments/bench_multiturn.py``): a random checkpoint made with transformers (imported into ours with
``hf_import.load_hf_model``: both sides hold the same weights), and the multi-turn loop of TRL's tool use, which
re-sends the whole conversation to ``generate`` every turn.

    random_hf_checkpoint("ckpt/", "qwen2", vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2,
                         d_ff=128, max_len=256)
    turns = hf_multiturn_generate(hf_model, prompts, prompt_lens, obs, turns=4, turn_tokens=16)   # [B, T, N]

torch and transformers are imported inside the functions (the ``hf`` extra).
"""

from __future__ import annotations

import pathlib

import numpy as np


def random_hf_checkpoint(path, family: str, *, vocab_size: int, d_model: int, n_layers: int, n_heads: int,
                         n_kv_heads: int, d_ff: int, max_len: int, head_dim: int | None = None,
                         seed: int = 0) -> pathlib.Path:
    """A randomly initialised transformers model of ``family`` ("qwen2", "qwen3" or "llama"; tied embeddings,
    ``torch.manual_seed(seed)``) saved as safetensors in ``path``; ``head_dim`` (qwen3 only; qwen2 and llama use
    d_model / n_heads). -> the path."""
    classes = {"qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "qwen3": ("Qwen3Config", "Qwen3ForCausalLM"),
               "llama": ("LlamaConfig", "LlamaForCausalLM")}
    if family not in classes:
        raise ValueError(f"random_hf_checkpoint: family must be one of {sorted(classes)}, got {family!r}")
    import torch
    import transformers

    kw = dict(vocab_size=vocab_size, hidden_size=d_model, intermediate_size=d_ff, num_hidden_layers=n_layers,
              num_attention_heads=n_heads, num_key_value_heads=n_kv_heads, tie_word_embeddings=True,
              max_position_embeddings=max_len)
    if family == "qwen3" and head_dim is not None:
        kw["head_dim"] = head_dim
    cfg_cls, model_cls = (getattr(transformers, name) for name in classes[family])
    torch.manual_seed(seed)
    model_cls(cfg_cls(**kw)).eval().save_pretrained(path, safe_serialization=True)
    return pathlib.Path(path)


def left_pad(prompts, prompt_lens, pad_id: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded prompts [B, P] (``prompt_lens`` [B]) -> (left-padded ids [B, P], attention mask [B, P]): the
    batch layout of transformers ``generate``."""
    prompts, lens = np.asarray(prompts), np.asarray(prompt_lens)
    b, p = prompts.shape
    cols = np.arange(p)[None] - (p - lens)[:, None]  # the source column of each output slot (< 0: padding)
    mask = cols >= 0
    ids = np.where(mask, np.take_along_axis(prompts, np.clip(cols, 0, p - 1), axis=1), pad_id)
    return ids.astype(np.int64), mask.astype(np.int64)


def hf_multiturn_generate(model, prompts, prompt_lens, obs, turns: int, turn_tokens: int,
                          pad_id: int = 0) -> np.ndarray:
    """TRL's tool loop on a transformers causal LM: each of ``turns`` turns calls ``model.generate`` (greedy,
    exactly ``turn_tokens`` new tokens) on the whole conversation so far (left-padded, with its attention mask),
    then appends the observation ``obs`` [O] to every row (not after the last turn). Prompts: right-padded
    [B, P] with ``prompt_lens`` [B]. -> the model's turns [B, T, N] (numpy int64).

    Every turn is N tokens, as our rollout with no stop tokens: the model's ``generation_config.eos_token_id`` is
    unset (a change to ``model``), since with an EOS ``min_new_tokens`` would mask it out of the greedy argmax."""
    import torch

    ids, mask = (torch.from_numpy(x) for x in left_pad(prompts, prompt_lens, pad_id))
    b = ids.shape[0]
    obs_ids = torch.as_tensor(np.asarray(obs, np.int64))[None].expand(b, -1)
    model.generation_config.eos_token_id = None
    out = []
    with torch.no_grad():
        for t in range(turns):
            seq = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=turn_tokens,
                                 min_new_tokens=turn_tokens, do_sample=False, pad_token_id=pad_id)
            out.append(seq[:, ids.shape[1]:])
            ids, mask = seq, torch.cat([mask, torch.ones_like(out[-1])], 1)
            if t < turns - 1:
                ids, mask = torch.cat([ids, obs_ids], 1), torch.cat([mask, torch.ones_like(obs_ids)], 1)
    return torch.stack(out, 1).numpy()


__all__ = ["hf_multiturn_generate", "left_pad", "random_hf_checkpoint"]
