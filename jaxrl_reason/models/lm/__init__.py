"""DeepSeek-style decoder LM stack: config, model, sampler, training utilities (`train`, the SFT loop `sft`), sequence
helpers (`sequences`), id-level prompt templates (`prompts`), HF import/export (llama.cpp GGUF import, PEFT adapter
export), sharding."""

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.gguf_import import gguf_tokenizer, load_gguf_model
from jaxrl_reason.models.lm.hf_export import save_hf_model
from jaxrl_reason.models.lm.hf_import import HFImportError, load_hf_model
from jaxrl_reason.models.lm.model import Transformer, cache_bytes_per_token, init_cache, param_count
from jaxrl_reason.models.lm.packaged import PACKAGED, resolve_checkpoint
from jaxrl_reason.models.lm.peft_export import save_peft_adapter
from jaxrl_reason.models.lm.pretrained import load_model, load_tokenizer

__all__ = ["LMConfig", "Transformer", "init_cache", "cache_bytes_per_token", "param_count", "load_hf_model",
           "save_hf_model", "save_peft_adapter", "HFImportError", "load_gguf_model", "gguf_tokenizer",
           "PACKAGED", "resolve_checkpoint", "load_model", "load_tokenizer"]
