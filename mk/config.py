"""Model, parallel and kernel configuration.

Everything is validated once, here, at the edge; the rest of mk trusts these dataclasses.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path


def cache_root(env=None) -> Path:
    """mk's cache on this machine (the tiny checkpoints, compiled kernels): $MK_CACHE_DIR, else
    ~/.cache/mk."""
    env = os.environ if env is None else env
    return Path(env.get("MK_CACHE_DIR") or Path.home() / ".cache" / "mk")


class ConfigError(ValueError):
    """A checkpoint configuration or a parallel layout that mk cannot run."""


SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM",)


@dataclass(frozen=True)
class RopeConfig:
    theta: float = 10000.0
    # llama3 scaling (Llama 3.1 / 3.3); None means plain RoPE
    scaling_type: str | None = None
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192


@dataclass(frozen=True)
class ModelConfig:
    """A Llama-family decoder, as read from a Hugging Face config.json."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-6  # HF LlamaConfig default
    tie_word_embeddings: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    max_position_embeddings: int = 8192
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "vocab_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or v <= 0:
                raise ConfigError(f"config field {name} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) is not a multiple of num_key_value_heads "
                f"({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for RoPE, got {self.head_dim}")

    @property
    def q_per_kv(self) -> int:
        return self.num_heads // self.num_kv_heads

    @classmethod
    def from_dict(cls, cfg: dict, source: str = "config.json") -> "ModelConfig":
        archs = cfg.get("architectures") or ["LlamaForCausalLM"]
        if cfg.get("model_type", "llama") != "llama" or any(a not in SUPPORTED_ARCHITECTURES for a in archs):
            raise ConfigError(
                f"{source}: unsupported architecture {archs} / model_type {cfg.get('model_type')!r}; "
                f"mk runs {', '.join(SUPPORTED_ARCHITECTURES)} (model_type 'llama')")
        for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "vocab_size"):
            if key not in cfg:
                raise ConfigError(f"{source}: missing required field {key!r}")
        act = cfg.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{source}: unsupported field hidden_act={act!r} (only 'silu')")
        for flag in ("attention_bias", "mlp_bias"):
            if cfg.get(flag):
                raise ConfigError(f"{source}: unsupported field {flag}=true (Llama has no biases)")
        if "quantization_config" in cfg:
            raise ConfigError(f"{source}: unsupported field quantization_config (quantized "
                              f"checkpoints are not supported; use a bf16/fp16/fp32 checkpoint)")
        if cfg.get("sliding_window"):
            raise ConfigError(f"{source}: unsupported field sliding_window={cfg['sliding_window']}")
        rope = _rope_from_dict(cfg, source)
        num_heads = cfg["num_attention_heads"]
        hidden = cfg["hidden_size"]
        head_dim = cfg.get("head_dim")
        if not head_dim:
            if not isinstance(hidden, int) or not isinstance(num_heads, int) or num_heads <= 0 \
                    or hidden % num_heads:
                raise ConfigError(f"{source}: hidden_size ({hidden}) is not a multiple of "
                                  f"num_attention_heads ({num_heads}) and no head_dim is given")
            head_dim = hidden // num_heads
        eos = cfg.get("eos_token_id")
        eos_t = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
        return cls(
            hidden_size=hidden,
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=cfg.get("num_key_value_heads") or num_heads,
            head_dim=head_dim,
            vocab_size=cfg["vocab_size"],
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            rope=rope,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 8192)),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_id=eos_t,
        )

    @classmethod
    def from_pretrained(cls, model_dir: str | Path) -> "ModelConfig":
        path = Path(model_dir) / "config.json"
        if not path.is_file():
            raise ConfigError(f"{path}: no config.json in the checkpoint directory {model_dir}")
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ConfigError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(cfg, source=str(path))

    def to_hf_dict(self) -> dict:
        """The config.json that describes this model (used to write checkpoints)."""
        d = {
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "rope_theta": self.rope.theta,
            "max_position_embeddings": self.max_position_embeddings,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
        }
        if self.rope.scaling_type == "llama3":
            d["rope_scaling"] = {
                "rope_type": "llama3",
                "factor": self.rope.factor,
                "low_freq_factor": self.rope.low_freq_factor,
                "high_freq_factor": self.rope.high_freq_factor,
                "original_max_position_embeddings": self.rope.original_max_position_embeddings,
            }
        if self.bos_token_id is not None:
            d["bos_token_id"] = self.bos_token_id
        if self.eos_token_id:
            d["eos_token_id"] = list(self.eos_token_id) if len(self.eos_token_id) > 1 else self.eos_token_id[0]
        return d


def _rope_from_dict(cfg: dict, source: str) -> RopeConfig:
    # transformers >= 5 may write rope_parameters instead of rope_theta/rope_scaling.
    params = cfg.get("rope_parameters") or {}
    theta = float(cfg.get("rope_theta", params.get("rope_theta", 10000.0)))
    scaling = cfg.get("rope_scaling")
    if scaling is None and params.get("rope_type", "default") != "default":
        scaling = params
    if not scaling:
        return RopeConfig(theta=theta)
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind in (None, "default"):
        return RopeConfig(theta=theta)
    if kind != "llama3":
        raise ConfigError(f"{source}: unsupported field rope_scaling type {kind!r} (only 'llama3')")
    try:
        return RopeConfig(
            theta=theta,
            scaling_type="llama3",
            factor=float(scaling["factor"]),
            low_freq_factor=float(scaling["low_freq_factor"]),
            high_freq_factor=float(scaling["high_freq_factor"]),
            original_max_position_embeddings=int(scaling["original_max_position_embeddings"]),
        )
    except KeyError as e:
        raise ConfigError(f"{source}: rope_scaling of type llama3 lacks field {e.args[0]!r}") from None


@dataclass(frozen=True)
class ParallelConfig:
    """Tensor parallelism: this process is rank `rank` of `tp_size`.

    Megatron layout: q heads, gate/up rows and vocabulary split across ranks, o/down split by input
    columns. KV heads: split when tp_size divides num_kv_heads; replicated (each rank keeps the one
    KV head its q heads use) when num_kv_heads divides tp_size.
    """

    tp_size: int = 1
    rank: int = 0

    def __post_init__(self):
        if self.tp_size < 1 or not (0 <= self.rank < self.tp_size):
            raise ConfigError(f"invalid TP rank {self.rank} of size {self.tp_size}")

    def validate_for(self, model: ModelConfig) -> None:
        n = self.tp_size
        if model.num_heads % n:
            raise ConfigError(f"TP size {n} does not divide num_attention_heads ({model.num_heads})")
        if model.num_kv_heads % n and n % model.num_kv_heads:
            raise ConfigError(
                f"TP size {n} neither divides num_key_value_heads ({model.num_kv_heads}) nor is a "
                f"multiple of it (KV replication needs tp_size % num_kv_heads == 0)")
        if model.intermediate_size % n:
            raise ConfigError(f"TP size {n} does not divide intermediate_size ({model.intermediate_size})")
        if model.vocab_size % n:
            raise ConfigError(f"TP size {n} does not divide vocab_size ({model.vocab_size})")

    # Shard sizes and offsets --------------------------------------------------------------------
    def heads_local(self, model: ModelConfig) -> int:
        return model.num_heads // self.tp_size

    def kv_heads_local(self, model: ModelConfig) -> int:
        return max(1, model.num_kv_heads // self.tp_size)

    def kv_replicated(self, model: ModelConfig) -> bool:
        return self.tp_size > model.num_kv_heads

    def kv_head_start(self, model: ModelConfig) -> int:
        """First global KV head held by this rank."""
        if self.kv_replicated(model):
            # rank r holds q heads [r*hl, (r+1)*hl); they all use one KV head.
            return (self.rank * self.heads_local(model)) // model.q_per_kv
        return self.rank * self.kv_heads_local(model)

    def intermediate_local(self, model: ModelConfig) -> int:
        return model.intermediate_size // self.tp_size

    def vocab_local(self, model: ModelConfig) -> int:
        return model.vocab_size // self.tp_size


@dataclass(frozen=True)
class KernelConfig:
    """Shapes the step is planned and compiled for."""

    token_block: int = 128          # rows per tile in the token dimension
    page_size: int = 16             # KV cache tokens per page
    max_batch_tokens: int = 4096    # tokens of one step (decode tokens + prefill chunk tokens)
    max_seqs: int = 256
    max_context: int = 4096
    num_kv_pages: int = 0           # 0: enough for max_seqs x max_context

    def __post_init__(self):
        for name in ("token_block", "page_size", "max_batch_tokens", "max_seqs", "max_context"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"KernelConfig.{name} must be positive")
        if self.token_block & (self.token_block - 1):
            raise ConfigError(f"KernelConfig.token_block must be a power of two, got {self.token_block}")

    @property
    def kv_pages(self) -> int:
        return self.num_kv_pages or self.max_seqs * math.ceil(self.max_context / self.page_size)
