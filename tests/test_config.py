"""mk.config: reading HF config.json, refusing what mk cannot run, TP layout helpers."""

from __future__ import annotations

import json

import pytest

from conftest import GQA_LLAMA3, TIED_HEADDIM, TINY_MHA
from mk.config import ConfigError, KernelConfig, ModelConfig, ParallelConfig, RopeConfig

BASE = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
    "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "vocab_size": 256, "hidden_act": "silu", "rms_norm_eps": 1e-5,
}


def cfg_with(**kv):
    d = json.loads(json.dumps(BASE))
    for k, v in kv.items():
        if v is _DROP:
            d.pop(k, None)
        else:
            d[k] = v
    return d


_DROP = object()


def test_base_config():
    c = ModelConfig.from_dict(BASE)
    assert (c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == \
        (64, 2, 4, 2, 16, 256)
    assert c.q_per_kv == 2 and c.rope == RopeConfig() and not c.tie_word_embeddings


@pytest.mark.parametrize("cfg", [TINY_MHA, GQA_LLAMA3, TIED_HEADDIM], ids=["mha", "gqa", "tied"])
def test_reads_configs_written_by_transformers(tmp_path, cfg):
    from transformers import LlamaConfig
    LlamaConfig(**cfg, architectures=["LlamaForCausalLM"]).save_pretrained(tmp_path)
    c = ModelConfig.from_pretrained(tmp_path)
    assert c.hidden_size == cfg["hidden_size"] and c.num_layers == cfg["num_hidden_layers"]
    assert c.num_heads == cfg["num_attention_heads"] and c.num_kv_heads == cfg["num_key_value_heads"]
    assert c.head_dim == cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"])
    assert c.tie_word_embeddings == cfg["tie_word_embeddings"]
    if "rope_scaling" in cfg:
        rs = cfg["rope_scaling"]
        assert c.rope == RopeConfig(theta=cfg["rope_theta"], scaling_type="llama3", factor=rs["factor"],
                                    low_freq_factor=rs["low_freq_factor"],
                                    high_freq_factor=rs["high_freq_factor"],
                                    original_max_position_embeddings=rs["original_max_position_embeddings"])
    else:
        assert c.rope.scaling_type is None and c.rope.theta == 10000.0
    # and back: our own config.json describes the same model
    assert ModelConfig.from_dict(c.to_hf_dict()) == c


def test_legacy_rope_scaling_and_rope_parameters():
    legacy = cfg_with(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192})
    new = cfg_with(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})
    a, b = ModelConfig.from_dict(legacy), ModelConfig.from_dict(new)
    assert a == b and a.rope.factor == 32.0 and a.rope.theta == 500000.0
    assert ModelConfig.from_dict(cfg_with(rope_scaling={"type": "default"})).rope.scaling_type is None


def test_eos_forms():
    assert ModelConfig.from_dict(cfg_with(eos_token_id=[128001, 128009])).eos_token_id == (128001, 128009)
    assert ModelConfig.from_dict(cfg_with(eos_token_id=2)).eos_token_id == (2,)
    assert ModelConfig.from_dict(BASE).eos_token_id == ()


@pytest.mark.parametrize("over,field", [
    (dict(architectures=["MistralForCausalLM"]), "architecture"),
    (dict(model_type="mistral"), "model_type"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}), "rope_scaling"),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), "rope_scaling"),
    (dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}), "rope_scaling"),
    (dict(hidden_act="gelu"), "hidden_act"),
    (dict(attention_bias=True), "attention_bias"),
    (dict(mlp_bias=True), "mlp_bias"),
    (dict(quantization_config={"quant_method": "fp8"}), "quantization_config"),
    (dict(sliding_window=4096), "sliding_window"),
    (dict(rope_scaling={"rope_type": "llama3", "factor": 8.0}), "low_freq_factor"),
])
def test_refusals_name_the_field(over, field):
    with pytest.raises(ConfigError, match=field) as e:
        ModelConfig.from_dict(cfg_with(**over), source="/ckpt/config.json")
    assert "/ckpt/config.json" in str(e.value)


@pytest.mark.parametrize("field", ["hidden_size", "intermediate_size", "num_hidden_layers",
                                   "num_attention_heads", "vocab_size"])
def test_missing_field(field):
    with pytest.raises(ConfigError, match=f"missing required field '{field}'"):
        ModelConfig.from_dict(cfg_with(**{field: _DROP}))


@pytest.mark.parametrize("over,field", [
    (dict(hidden_size=0), "hidden_size"),
    (dict(num_hidden_layers=-1), "num_layers"),
    (dict(vocab_size="256"), "vocab_size"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(head_dim=15), "head_dim"),
    (dict(hidden_size=66, head_dim=_DROP), "hidden_size"),
])
def test_invalid_values_name_the_field(over, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_dict(cfg_with(**over))


def test_from_pretrained_errors(tmp_path):
    with pytest.raises(ConfigError, match="config.json"):
        ModelConfig.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{oops")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_pretrained(tmp_path)


# ParallelConfig ----------------------------------------------------------------------------------

def _model(heads=8, kv=2, inter=256, vocab=320):
    return ModelConfig(hidden_size=128, intermediate_size=inter, num_layers=1, num_heads=heads,
                       num_kv_heads=kv, head_dim=16, vocab_size=vocab)


def test_parallel_helpers_split_and_replicate():
    m = _model()
    for n in (1, 2, 4, 8):
        hq = [ParallelConfig(n, r).heads_local(m) for r in range(n)]
        assert hq == [8 // n] * n
        assert ParallelConfig(n).intermediate_local(m) * n == 256
        assert ParallelConfig(n).vocab_local(m) * n == 320
    # split: kv 2 over tp 2
    assert [ParallelConfig(2, r).kv_head_start(m) for r in range(2)] == [0, 1]
    assert ParallelConfig(2).kv_heads_local(m) == 1 and not ParallelConfig(2).kv_replicated(m)
    # replicated: tp 4 and 8, each rank's q heads share one KV head
    for n in (4, 8):
        for r in range(n):
            p = ParallelConfig(n, r)
            assert p.kv_replicated(m) and p.kv_heads_local(m) == 1
            hl = p.heads_local(m)
            assert {(r * hl + j) // m.q_per_kv for j in range(hl)} == {p.kv_head_start(m)}
    assert [ParallelConfig(8, r).kv_head_start(m) for r in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]


@pytest.mark.parametrize("model,tp,field", [
    (dict(heads=8), 3, "num_attention_heads"),
    (dict(heads=12, kv=3), 4, "num_key_value_heads"),
    (dict(inter=252), 8, "intermediate_size"),
    (dict(vocab=322), 4, "vocab_size"),
])
def test_parallel_refusals_name_the_field(model, tp, field):
    with pytest.raises(ConfigError, match=field):
        ParallelConfig(tp).validate_for(_model(**model))


def test_parallel_invalid_rank():
    with pytest.raises(ConfigError, match="rank"):
        ParallelConfig(2, 2)
    with pytest.raises(ConfigError):
        ParallelConfig(0, 0)


def test_kernel_config():
    k = KernelConfig(page_size=16, max_seqs=4, max_context=100)
    assert k.kv_pages == 4 * 7
    with pytest.raises(ConfigError, match="token_block"):
        KernelConfig(token_block=96)
    with pytest.raises(ConfigError, match="page_size"):
        KernelConfig(page_size=0)
