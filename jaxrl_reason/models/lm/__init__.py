"""DeepSeek-style decoder LM stack: config, model, sampler, training utilities, HF import, sharding."""

from jaxrl_reason.models.lm.config import LMConfig
from jaxrl_reason.models.lm.model import Transformer, cache_bytes_per_token, init_cache, param_count

__all__ = ["LMConfig", "Transformer", "init_cache", "cache_bytes_per_token", "param_count"]
