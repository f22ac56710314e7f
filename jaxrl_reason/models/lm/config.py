"""`LMConfig`: one frozen, validated configuration for the whole decoder family.

Dense Llama/Qwen2/Qwen3/Mistral (GQA, optional QKV bias, q/k norm, llama3 RoPE scaling, sliding window,
tied embeddings), DeepSeek MLA attention, DeepSeekMoE
feed-forward, multi-token prediction and FP8 matmuls are all switches of this one dataclass.
Every combination that cannot work raises one ``ValueError`` at construction, i.e. before any
compilation.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from jaxrl_reason.utils.validation import NONNEGATIVE, VALID, at_least, check_hyperparameters, one_of, or_none, require

_DTYPES = ("float32", "bfloat16", "float16")
#: rope_scaling types `layers.rope` implements -> their required keys
ROPE_SCALING_KEYS = {"llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
                     # optional: beta_fast, beta_slow, mscale, mscale_all_dim, attention_factor, truncate
                     "yarn": ("factor", "original_max_position_embeddings")}


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Decoder-only LM configuration (all fields static / hashable).

    attention: "gqa" (n_kv_heads groups; n_kv_heads == n_heads is MHA) or "mla".
    mla_rope_interleave: HF DeepSeek's ``rope_interleave``: the MLA rope dims are rotated in adjacent
      pairs and come out in rotate-half order ([even; odd]), as HF's apply_rotary_pos_emb_interleave.
      With rope_scaling of type "yarn" MLA also multiplies the softmax scale by yarn_mscale(factor,
      mscale_all_dim)^2 (HF DeepseekV3Attention).
    mla_absorbed: MLA computes attention in the latent space (W_uk folded into the query, W_uv
      applied after attention); the cache is the compressed (c_kv, k_rope) one in both modes.
    n_routed_experts: 0 means a dense SwiGLU MLP in every layer; > 0 makes every layer DeepSeekMoE
      except the first `moe_first_dense` ones (dense SwiGLU of width d_ff, DeepSeek-V3's first_k_dense_replace).
    moe_capacity_factor: None = dropless (capacity = tokens per sequence); else tokens routed past
      ceil(factor * T * top_k / E) slots of an expert in one sequence are dropped (their expert
      contribution is zero; the shared experts and the residual still carry them).
    moe_dispatch: how routed experts run under a mesh with an "expert" axis (see moe.py):
      "all_to_all" = explicit shard_map all-to-all expert parallelism, "constraint" = sharding
      constraints only (XLA picks the collectives).
    fp8: Linear layers (attention/MLA projections, dense and shared-expert SwiGLU, MTP projection,
      an untied lm_head) and the routed-expert GEMMs run E4M3 matmuls (fp8.py). Kept in
      cfg.dtype as in DeepSeek-V3: embedding, tied head, router, attention scores/values and the
      absorbed-MLA W_uk/W_uv einsums.
    """

    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    n_kv_heads: int = 2
    head_dim: int | None = None  # default d_model // n_heads
    d_ff: int = 128
    qkv_bias: bool = False
    qk_norm: bool = False  # Qwen3: per-head RMSNorm of q and k (over head_dim) before RoPE
    tie_embeddings: bool = False
    rope_theta: float = 10000.0
    # RoPE frequency scaling as sorted (key, value) pairs of HF's rope_scaling dict (hashable), None = plain.
    # ("rope_type", "llama3") with factor, low_freq_factor, high_freq_factor, original_max_position_embeddings;
    # ("rope_type", "yarn") with factor, original_max_position_embeddings (+ optional keys, see layers.py).
    rope_scaling: tuple | None = None
    sliding_window: int | None = None  # GQA (Mistral): a query at p sees keys at (p - window, p]; None = all
    norm_eps: float = 1e-6
    max_seq_len: int = 512
    init_std: float = 0.02
    # attention type
    attention: str = "gqa"
    # MLA (DeepSeek-V2/V3)
    kv_lora_rank: int = 32  # d_c
    q_lora_rank: int = 0  # 0: full-rank query projection
    qk_nope_dim: int = 16
    qk_rope_dim: int = 8
    v_head_dim: int = 16
    mla_absorbed: bool = True
    mla_rope_interleave: bool = False  # DeepSeek/HF rope_interleave: RoPE pairs (x0, x1), (x2, x3), ... of q/k rope dims
    # DeepSeekMoE
    n_routed_experts: int = 0
    n_shared_experts: int = 1
    moe_top_k: int = 2
    moe_d_ff: int = 32
    moe_score: str = "sigmoid"  # or "softmax"
    moe_n_groups: int = 1
    moe_topk_groups: int = 1
    moe_norm_topk: bool = True
    moe_route_scale: float = 1.0
    # a step size and a loss weight, not a probability / EMA rate: >= 0 (not the [0, 1] of "*_rate", "*_alpha")
    moe_bias_update_rate: float = dataclasses.field(default=1e-3, metadata={VALID: NONNEGATIVE})  # 0: off
    moe_seq_aux_alpha: float = dataclasses.field(default=0.0, metadata={VALID: NONNEGATIVE})  # DeepSeek-V3: ~1e-4
    moe_capacity_factor: float | None = None
    moe_dispatch: str = "all_to_all"  # expert parallelism: "all_to_all" (shard_map) or "constraint"
    moe_first_dense: int = 0  # DeepSeek-V3 first_k_dense_replace: layers 0..k-1 use the dense SwiGLU (d_ff)

    # multi-token prediction
    mtp_depth: int = 0  # 0 or 1 extra depth module
    mtp_loss_weight: float = 0.3
    mtp_layout: str = "native"  # "native" (ours) or "deepseek" (HF DeepSeek-V3 layer N; see model.MTP)

    # numerics
    dtype: str = "float32"  # activation / matmul dtype
    param_dtype: str = "float32"
    fp8: bool = False  # E4M3 matmuls with 1 x block activation tiles, block x block weight blocks
    fp8_block: int = 128
    # compilation
    remat: bool = False
    scan_layers: bool = True  # False: the layer scan is fully unrolled (compile time grows with depth)

    # rules of one field (utils.validation); the rules between fields, in __post_init__
    CHECKS = ((("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len", "fp8_block"), at_least(1)),
              ("attention", one_of(("gqa", "mla"))),
              (("dtype", "param_dtype"), one_of(_DTYPES)),
              ("sliding_window", or_none(at_least(1), "attention over all positions")),
              ("n_routed_experts", at_least(0), "0: a dense MLP"),
              ("mtp_depth", one_of((0, 1))),
              ("mtp_layout", one_of(("native", "deepseek"))))

    def __post_init__(self):
        check_hyperparameters(self)
        if self.attention == "gqa":
            require(self, self.n_kv_heads > 0, f"n_kv_heads must be > 0, got {self.n_kv_heads}")
            require(self, self.n_heads % self.n_kv_heads == 0,
                    f"n_heads ({self.n_heads}) must be a multiple of n_kv_heads ({self.n_kv_heads})")
            if self.head_dim is None:
                require(self, self.d_model % self.n_heads == 0, f"d_model ({self.d_model}) must be divisible by "
                        f"n_heads ({self.n_heads}) when head_dim is not given")
            else:
                require(self, self.head_dim > 0, "head_dim must be > 0")
            require(self, self.hd % 2 == 0, f"head_dim ({self.hd}) must be even for RoPE")
        else:
            require(self, self.kv_lora_rank > 0, "MLA needs kv_lora_rank > 0")
            require(self, self.q_lora_rank >= 0, "q_lora_rank must be >= 0")
            require(self, self.qk_nope_dim > 0 and self.v_head_dim > 0, "MLA needs qk_nope_dim, v_head_dim > 0")
            require(self, self.qk_rope_dim > 0 and self.qk_rope_dim % 2 == 0, "MLA qk_rope_dim must be even and > 0")
        if self.n_routed_experts:
            e = self.n_routed_experts
            require(self, 1 <= self.moe_top_k <= e,
                    f"moe_top_k ({self.moe_top_k}) must be in [1, n_routed_experts={e}]")
            require(self, self.moe_d_ff > 0 and self.n_shared_experts >= 0, "moe_d_ff > 0, n_shared_experts >= 0")
            require(self, self.moe_score in ("sigmoid", "softmax"),
                    f"moe_score must be sigmoid/softmax, got {self.moe_score!r}")
            require(self, self.moe_n_groups >= 1 and e % self.moe_n_groups == 0,
                    f"n_routed_experts ({e}) must be divisible by moe_n_groups ({self.moe_n_groups})")
            require(self, 1 <= self.moe_topk_groups <= self.moe_n_groups,
                    f"moe_topk_groups ({self.moe_topk_groups}) must be in [1, moe_n_groups={self.moe_n_groups}]")
            require(self, self.moe_topk_groups * (e // self.moe_n_groups) >= self.moe_top_k,
                    f"moe_topk_groups*experts_per_group ({self.moe_topk_groups * (e // self.moe_n_groups)}) "
                    f"< moe_top_k ({self.moe_top_k}): not enough experts left to choose from")
            require(self, self.moe_capacity_factor is None or self.moe_capacity_factor > 0,
                    "moe_capacity_factor must be None (dropless) or > 0")
            require(self, self.moe_dispatch in ("all_to_all", "constraint"),
                    f"moe_dispatch must be 'all_to_all' or 'constraint', got {self.moe_dispatch!r}")
            require(self, 0 <= self.moe_first_dense < self.n_layers,
                    f"moe_first_dense ({self.moe_first_dense}) must be in [0, n_layers={self.n_layers})")
        else:
            require(self, self.moe_first_dense == 0, "moe_first_dense needs n_routed_experts > 0")
        if self.rope_scaling is not None:
            rs = dict(self.rope_scaling)
            require(self, isinstance(self.rope_scaling, tuple) and rs.get("rope_type") in ROPE_SCALING_KEYS,
                    f"rope_scaling must be a tuple of (key, value) pairs with rope_type in "
                    f"{tuple(ROPE_SCALING_KEYS)}, got {self.rope_scaling!r}")
            missing = [k for k in ROPE_SCALING_KEYS[rs["rope_type"]] if k not in rs]
            require(self, not missing, f"rope_scaling of type {rs['rope_type']!r} lacks {missing}")

    # ---- derived quantities
    @property
    def hd(self) -> int:
        """GQA head dim."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_routed_experts > 0

    @property
    def jdtype(self):
        return jnp.dtype(self.dtype)

    @property
    def jparam_dtype(self):
        return jnp.dtype(self.param_dtype)

    def cache_values_per_token(self) -> int:
        """Number of cached values per token summed over layers (K+V for GQA, c_kv + k_rope for MLA)."""
        per_layer = 2 * self.n_kv_heads * self.hd if self.attention == "gqa" else self.kv_lora_rank + self.qk_rope_dim
        return self.n_layers * per_layer

    def check_cache(self, prompt_len: int, max_new_tokens: int, cache_len: int) -> None:
        """Raise before compilation if a cache cannot hold prompt + generation."""
        if prompt_len + max_new_tokens > cache_len:
            raise ValueError(
                f"KV cache too short: prompt length {prompt_len} + max_new_tokens {max_new_tokens} "
                f"= {prompt_len + max_new_tokens} > cache length {cache_len}"
            )
        if cache_len > self.max_seq_len:
            raise ValueError(f"cache length {cache_len} exceeds max_seq_len {self.max_seq_len}")
