"""mk.weights: loading, TP sharding and stacking of HF Llama checkpoints; mk.tiny."""

from __future__ import annotations

import json
import logging
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import mk.weights as W
from conftest import GQA_LLAMA3, TIED_HEADDIM, TINY_MHA, make_hf_checkpoint
from mk.config import ConfigError, ModelConfig, ParallelConfig, RopeConfig
from mk.tiny import TINY_CONFIG, tiny_checkpoint, tiny_state_dict, write_checkpoint
from mk.weights import CheckpointError, load_rank_weights

FIELDS = ("embed", "lm_head", "attn_norm", "mlp_norm", "final_norm", "qkv", "o", "gate_up", "down")
CONFIGS = {"TINY_MHA": TINY_MHA, "GQA_LLAMA3": GQA_LLAMA3, "TIED_HEADDIM": TIED_HEADDIM}


@pytest.fixture(scope="module")
def hf_ckpts(tmp_path_factory):
    """One single-file checkpoint per named configuration, plus its HF state dict."""
    out = {}
    for name, cfg in CONFIGS.items():
        d, model = make_hf_checkpoint(tmp_path_factory.mktemp(name), **cfg)
        out[name] = (d, {k: v.detach().clone() for k, v in model.state_dict().items()})
    return out


def _tp_sizes(cfg: ModelConfig):
    return [n for n in (1, 2, 4, 8) if cfg.num_heads % n == 0]


def _reassemble_and_check(ckpt_dir: Path, sd: dict, tp: int):
    cfg = ModelConfig.from_pretrained(ckpt_dir)
    L, H, D = cfg.num_layers, cfg.hidden_size, cfg.head_dim
    ranks = [load_rank_weights(ckpt_dir, ParallelConfig(tp, r), dtype=torch.float32, progress=False)
             for r in range(tp)]
    par = ranks[0].parallel
    hq, hkv = par.heads_local(cfg), par.kv_heads_local(cfg)
    Il, Vl = par.intermediate_local(cfg), par.vocab_local(cfg)

    def layers(kind):
        return torch.stack([sd[f"model.layers.{i}.{kind}.weight"] for i in range(L)])

    for w in ranks:
        assert w.config == cfg and w.dtype == torch.float32
        shapes = dict(embed=(Vl, H), lm_head=(Vl, H), attn_norm=(L, H), mlp_norm=(L, H),
                      final_norm=(H,), qkv=(L, (hq + 2 * hkv) * D, H), o=(L, H, hq * D),
                      gate_up=(L, 2 * Il, H), down=(L, H, Il))
        for f in FIELDS:
            t = getattr(w, f)
            assert tuple(t.shape) == shapes[f], f
            assert t.is_contiguous() and t.data_ptr() % 16 == 0, f
            assert t.device.type == "cpu"

    cat = torch.cat
    assert torch.equal(cat([w.embed for w in ranks]), sd["model.embed_tokens.weight"])
    lm_full = sd["model.embed_tokens.weight"] if cfg.tie_word_embeddings else sd["lm_head.weight"]
    assert torch.equal(cat([w.lm_head for w in ranks]), lm_full)
    for w in ranks:
        assert torch.equal(w.final_norm, sd["model.norm.weight"])
        assert torch.equal(w.attn_norm, layers("input_layernorm"))
        assert torch.equal(w.mlp_norm, layers("post_attention_layernorm"))
    assert torch.equal(cat([w.qkv[:, :hq * D] for w in ranks], 1), layers("self_attn.q_proj"))
    assert torch.equal(cat([w.o for w in ranks], 2), layers("self_attn.o_proj"))
    assert torch.equal(cat([w.gate_up[:, :Il] for w in ranks], 1), layers("mlp.gate_proj"))
    assert torch.equal(cat([w.gate_up[:, Il:] for w in ranks], 1), layers("mlp.up_proj"))
    assert torch.equal(cat([w.down for w in ranks], 2), layers("mlp.down_proj"))
    k_full, v_full = layers("self_attn.k_proj"), layers("self_attn.v_proj")
    ks = [w.qkv[:, hq * D:(hq + hkv) * D] for w in ranks]
    vs = [w.qkv[:, (hq + hkv) * D:] for w in ranks]
    if par.kv_replicated(cfg):
        assert hkv == 1 and tp > cfg.num_kv_heads
        for r, w in enumerate(ranks):
            kv = w.parallel.kv_head_start(cfg)
            # every q head of this rank uses KV head `kv`
            assert {(r * hq + j) // cfg.q_per_kv for j in range(hq)} == {kv}
            assert torch.equal(ks[r], k_full[:, kv * D:(kv + 1) * D])
            assert torch.equal(vs[r], v_full[:, kv * D:(kv + 1) * D])
        assert torch.equal(cat(ks[::tp // cfg.num_kv_heads], 1), k_full)
    else:
        assert torch.equal(cat(ks, 1), k_full)
        assert torch.equal(cat(vs, 1), v_full)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_ranks_reassemble_to_hf_weights(hf_ckpts, name):
    d, sd = hf_ckpts[name]
    cfg = ModelConfig.from_pretrained(d)
    for tp in _tp_sizes(cfg):
        _reassemble_and_check(d, sd, tp)


def test_kv_replication_cases_are_covered(hf_ckpts):
    cfg = ModelConfig.from_pretrained(hf_ckpts["GQA_LLAMA3"][0])
    assert [ParallelConfig(n).kv_replicated(cfg) for n in (1, 2, 4, 8)] == [False, False, True, True]
    cfg = ModelConfig.from_pretrained(hf_ckpts["TIED_HEADDIM"][0])
    assert cfg.head_dim == 32 and cfg.head_dim * cfg.num_heads != cfg.hidden_size
    assert cfg.tie_word_embeddings and ParallelConfig(4).kv_replicated(cfg)


def test_sharded_and_single_file_load_identically(tmp_path):
    single, m1 = make_hf_checkpoint(tmp_path, **GQA_LLAMA3, seed=3)
    sharded, m2 = make_hf_checkpoint(tmp_path, **GQA_LLAMA3, seed=3, shard=True)
    assert (sharded / "model.safetensors.index.json").is_file()
    assert not (sharded / "model.safetensors").exists()
    assert len(list(sharded.glob("model-*.safetensors"))) > 3
    assert (single / "model.safetensors").is_file()
    for tp, r in ((1, 0), (2, 1), (8, 5)):
        a = load_rank_weights(single, ParallelConfig(tp, r), progress=False)
        b = load_rank_weights(sharded, ParallelConfig(tp, r), progress=False)
        for f in FIELDS:
            assert torch.equal(getattr(a, f), getattr(b, f)), (tp, r, f)
    sd = {k: v.detach() for k, v in m2.state_dict().items()}
    _reassemble_and_check(sharded, sd, 4)


class _SpySlice:
    def __init__(self, sl, log, name):
        self._sl, self._log, self._name = sl, log, name

    def __getitem__(self, idx):
        t = self._sl[idx]
        self._log.append((self._name, t.numel()))
        return t

    def get_shape(self):
        return self._sl.get_shape()

    def get_dtype(self):
        return self._sl.get_dtype()


class _SpyHandle:
    def __init__(self, h, log):
        self._h, self._log = h, log

    def keys(self):
        return self._h.keys()

    def get_slice(self, name):
        return _SpySlice(self._h.get_slice(name), self._log, name)

    def get_tensor(self, name):  # pragma: no cover - failing is the point
        raise AssertionError(f"get_tensor({name!r}) reads a whole tensor")


@pytest.mark.parametrize("name,tp,rank", [("GQA_LLAMA3", 4, 3), ("TIED_HEADDIM", 2, 1),
                                          ("TINY_MHA", 1, 0)])
def test_reads_only_this_ranks_slices(hf_ckpts, monkeypatch, name, tp, rank):
    d, sd = hf_ckpts[name]
    log = []
    real = W.safe_open
    monkeypatch.setattr(W, "safe_open", lambda *a, **k: _SpyHandle(real(*a, **k), log))
    w = load_rank_weights(d, ParallelConfig(tp, rank), dtype=torch.float32, progress=False)
    read = sum(n for _, n in log)
    held = sum(getattr(w, f).numel() for f in FIELDS)
    if w.config.tie_word_embeddings:
        held -= w.lm_head.numel()  # copied from embed, not read again
    assert read == held
    total = sum(v.numel() for v in sd.values())
    if tp > 1:
        assert read < total * (1.5 / tp)
    # every tensor read exactly once
    names = [n for n, _ in log]
    assert len(names) == len(set(names))


def test_dtype_conversion_and_bf16_checkpoint(tmp_path):
    d, m = make_hf_checkpoint(tmp_path, **TINY_MHA, dtype=torch.bfloat16)
    sd = m.state_dict()
    w32 = load_rank_weights(d, dtype=torch.float32, progress=False)
    assert torch.equal(w32.embed, sd["model.embed_tokens.weight"].float())
    w16 = load_rank_weights(d, dtype=torch.bfloat16, progress=False)
    assert w16.dtype == torch.bfloat16 and all(getattr(w16, f).dtype == torch.bfloat16 for f in FIELDS)
    assert torch.equal(w16.qkv[0, :64], sd["model.layers.0.self_attn.q_proj.weight"])
    wh = load_rank_weights(d, dtype=torch.float16, progress=False)
    assert torch.equal(wh.down.float(), w32.down.half().float())
    with pytest.raises(ValueError, match="dtype"):
        load_rank_weights(d, dtype=torch.int8, progress=False)


def test_tied_checkpoint_ignores_stored_lm_head(tmp_path):
    d, m = make_hf_checkpoint(tmp_path, **TIED_HEADDIM)
    assert "lm_head.weight" not in load_file(d / "model.safetensors")
    sd = load_file(d / "model.safetensors")
    sd["lm_head.weight"] = torch.zeros_like(sd["model.embed_tokens.weight"])
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
    w = load_rank_weights(d, ParallelConfig(2, 1), dtype=torch.float32, progress=False)
    assert torch.equal(w.lm_head, w.embed)
    assert torch.equal(w.embed, m.state_dict()["model.embed_tokens.weight"][128:])


def test_progress_bar(tmp_path, capsys, monkeypatch):
    d, _ = make_hf_checkpoint(tmp_path, **TINY_MHA)
    capsys.readouterr()
    monkeypatch.delenv("MK_NO_PROGRESS", raising=False)
    load_rank_weights(d, progress=True)
    assert "layer" in capsys.readouterr().err
    load_rank_weights(d, ParallelConfig(2, 1), progress=True)   # rank 1: silent
    load_rank_weights(d, progress=False)
    assert capsys.readouterr().err == ""
    monkeypatch.setenv("MK_NO_PROGRESS", "1")
    load_rank_weights(d, progress=True)
    assert capsys.readouterr().err == ""


# ------------------------------------------------------------------------------------------------
# Bad checkpoints
# ------------------------------------------------------------------------------------------------

SMALL = ModelConfig(hidden_size=32, intermediate_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                    head_dim=8, vocab_size=64)


def _write(d: Path, sd: dict, cfg: ModelConfig = SMALL) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    write_checkpoint(d, cfg, sd)
    return d


@pytest.fixture
def good(tmp_path):
    return _write(tmp_path / "ck", tiny_state_dict(SMALL, seed=0))


def _edit(d: Path, fn) -> None:
    sd = load_file(d / "model.safetensors")
    fn(sd)
    save_file(sd, d / "model.safetensors", metadata={"format": "pt"})


def _shard(d: Path, parts: int = 3) -> list[Path]:
    """Split model.safetensors into `parts` shards with an index, HF style."""
    sd = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(sd)
    weight_map, files = {}, []
    for p in range(parts):
        fname = f"model-{p + 1:05d}-of-{parts:05d}.safetensors"
        chunk = {n: sd[n] for n in names[p::parts]}
        save_file(chunk, d / fname, metadata={"format": "pt"})
        weight_map.update({n: fname for n in chunk})
        files.append(d / fname)
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return files


def test_good_small_checkpoint_loads(good):
    w = load_rank_weights(good, ParallelConfig(2, 0), progress=False)
    assert w.qkv.shape == (2, (2 + 2) * 8, 32)


def test_missing_tensor(good):
    _edit(good, lambda sd: sd.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.1\.mlp\.up_proj\.weight'") as e:
        load_rank_weights(good, progress=False)
    assert "model.safetensors" in str(e.value)


def test_missing_lm_head_untied(good):
    _edit(good, lambda sd: sd.pop("lm_head.weight"))
    with pytest.raises(CheckpointError, match="lm_head.weight"):
        load_rank_weights(good, progress=False)


@pytest.mark.parametrize("extra", ["model.layers.99.mlp.up_proj.weight", "model.foo.weight",
                                   "model.layers.0.self_attn.q_proj.bias"])
def test_unexpected_tensor(good, extra):
    _edit(good, lambda sd: sd.__setitem__(extra, torch.zeros(4)))
    with pytest.raises(CheckpointError, match="unexpected tensor") as e:
        load_rank_weights(good, progress=False)
    assert repr(extra) in str(e.value) and "model.safetensors" in str(e.value)


def test_rotary_inv_freq_buffers_are_ignored(good):
    _edit(good, lambda sd: sd.__setitem__("model.layers.0.self_attn.rotary_emb.inv_freq", torch.ones(4)))
    load_rank_weights(good, progress=False)


def test_wrong_shape(good):
    _edit(good, lambda sd: sd.__setitem__("model.layers.1.self_attn.k_proj.weight",
                                          torch.zeros(24, 32, dtype=torch.bfloat16)))
    with pytest.raises(CheckpointError) as e:
        load_rank_weights(good, progress=False)
    msg = str(e.value)
    assert "'model.layers.1.self_attn.k_proj.weight'" in msg and "model.safetensors" in msg
    assert "[24, 32]" in msg and "expected [16, 32]" in msg


@pytest.mark.parametrize("dt,tag", [(torch.int8, "I8"), (torch.float64, "F64"),
                                    (torch.float8_e4m3fn, "F8_E4M3")])
def test_unsupported_dtype(good, dt, tag):
    _edit(good, lambda sd: sd.__setitem__("model.layers.0.mlp.gate_proj.weight",
                                          torch.zeros(64, 32).to(dt)))
    with pytest.raises(CheckpointError, match="unsupported dtype") as e:
        load_rank_weights(good, progress=False)
    assert "'model.layers.0.mlp.gate_proj.weight'" in str(e.value) and tag in str(e.value)


def test_mixed_checkpoint_dtypes_are_accepted(good):
    _edit(good, lambda sd: sd.__setitem__("model.norm.weight", sd["model.norm.weight"].float()))
    _edit(good, lambda sd: sd.__setitem__("lm_head.weight", sd["lm_head.weight"].half()))
    w = load_rank_weights(good, dtype=torch.float32, progress=False)
    assert w.final_norm.dtype == torch.float32


@pytest.mark.parametrize("tp,field", [(3, "num_attention_heads"), (8, "num_attention_heads")])
def test_tp_not_dividing_heads(good, tp, field):
    with pytest.raises(ConfigError, match=field):
        load_rank_weights(good, ParallelConfig(tp, 0), progress=False)


def test_tp_refusals_name_the_field(tmp_path):
    cases = [(dict(vocab_size=66), 4, "vocab_size"), (dict(intermediate_size=36), 8, "intermediate_size"),
             (dict(num_heads=12, num_kv_heads=3), 4, "num_key_value_heads")]
    for i, (over, tp, field) in enumerate(cases):
        base = dict(hidden_size=32, intermediate_size=64, num_layers=1, num_heads=8, num_kv_heads=8,
                    head_dim=8, vocab_size=64)
        base.update(over)
        cfg = ModelConfig(**base)
        d = _write(tmp_path / f"c{i}", tiny_state_dict(cfg), cfg)
        with pytest.raises(ConfigError, match=field):
            load_rank_weights(d, ParallelConfig(tp, 0), progress=False)


def test_truncated_file(good):
    p = good / "model.safetensors"
    data = p.read_bytes()
    p.write_bytes(data[:len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as e:
        load_rank_weights(good, progress=False)
    assert str(p) in str(e.value)


def test_garbage_file(good):
    (good / "model.safetensors").write_bytes(b"\x00\x01 not a safetensors file" * 4)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_rank_weights(good, progress=False)


def test_sharded_checkpoint_loads_and_truncated_shard(good):
    ref = load_rank_weights(good, ParallelConfig(2, 1), progress=False)
    files = _shard(good)
    w = load_rank_weights(good, ParallelConfig(2, 1), progress=False)
    for f in FIELDS:
        assert torch.equal(getattr(w, f), getattr(ref, f))
    data = files[1].read_bytes()
    files[1].write_bytes(data[:-10])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as e:
        load_rank_weights(good, progress=False)
    assert files[1].name in str(e.value)


def test_index_names_missing_shard(good):
    files = _shard(good)
    files[2].unlink()
    with pytest.raises(CheckpointError) as e:
        load_rank_weights(good, progress=False)
    msg = str(e.value)
    assert files[2].name in msg and "model.safetensors.index.json" in msg and "does not exist" in msg


def test_index_lists_tensor_missing_from_shard(good):
    files = _shard(good)
    idx = json.loads((good / "model.safetensors.index.json").read_text())
    idx["weight_map"]["model.norm.weight"] = files[0].name
    owner = [n for n, f in idx["weight_map"].items() if f == files[0].name]
    sd = load_file(files[0])
    if "model.norm.weight" in sd:   # make sure the shard really lacks it
        sd.pop("model.norm.weight")
        save_file(sd, files[0])
    (good / "model.safetensors.index.json").write_text(json.dumps(idx))
    assert "model.norm.weight" in owner
    with pytest.raises(CheckpointError, match=r"'model\.norm\.weight'") as e:
        load_rank_weights(good, progress=False)
    assert files[0].name in str(e.value)


def test_bad_index_json(good):
    _shard(good)
    (good / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="model.safetensors.index.json"):
        load_rank_weights(good, progress=False)


def test_missing_config_json(good):
    (good / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json") as e:
        load_rank_weights(good, progress=False)
    assert str(good) in str(e.value)


def test_no_weights_files(good, tmp_path):
    (good / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors") as e:
        load_rank_weights(good, progress=False)
    assert str(good) in str(e.value)
    with pytest.raises(CheckpointError, match="does not exist"):
        load_rank_weights(tmp_path / "nowhere", progress=False)


def test_config_errors_propagate(good):
    cfg = json.loads((good / "config.json").read_text())
    cfg["hidden_act"] = "gelu"
    (good / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ConfigError, match="hidden_act"):
        load_rank_weights(good, progress=False)


# ------------------------------------------------------------------------------------------------
# The embedded tiny checkpoint
# ------------------------------------------------------------------------------------------------

def test_tiny_checkpoint_is_deterministic_and_cached(tmp_path):
    a = tiny_checkpoint(0, cache_dir=tmp_path / "a")
    b = tiny_checkpoint(0, cache_dir=tmp_path / "b")
    c = tiny_checkpoint(1, cache_dir=tmp_path / "a")
    assert a.name == b.name and a.name.startswith("tiny-0-") and c.name.startswith("tiny-1-")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    sa, sc = load_file(a / "model.safetensors"), load_file(c / "model.safetensors")
    assert set(sa) == set(sc)
    assert all(v.dtype == torch.bfloat16 for v in sa.values())
    assert all(not torch.equal(sa[k], sc[k]) for k in sa)
    assert not torch.equal(sa["model.layers.0.self_attn.q_proj.weight"],
                           sc["model.layers.0.self_attn.q_proj.weight"])
    # cached: a second call does not rewrite
    mtime = (a / "model.safetensors").stat().st_mtime_ns
    assert tiny_checkpoint(0, cache_dir=tmp_path / "a") == a
    assert (a / "model.safetensors").stat().st_mtime_ns == mtime
    assert ModelConfig.from_pretrained(a) == TINY_CONFIG
    assert [p.name for p in (tmp_path / "a").iterdir() if p.name.startswith(".")] == []


def test_tiny_checkpoint_env_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("MK_CACHE_DIR", str(tmp_path / "env"))
    p = tiny_checkpoint(2)
    assert p.parent == tmp_path / "env"


def test_tiny_checkpoint_concurrent_writers(tmp_path):
    with ThreadPoolExecutor(4) as ex:
        paths = list(ex.map(lambda _: tiny_checkpoint(5, cache_dir=tmp_path), range(4)))
    assert len(set(paths)) == 1
    assert [p.name for p in tmp_path.iterdir()] == [paths[0].name]
    load_file(paths[0] / "model.safetensors")


def test_tiny_checkpoint_custom_config(tmp_path):
    cfg = ModelConfig(hidden_size=64, intermediate_size=128, num_layers=1, num_heads=4, num_kv_heads=1,
                      head_dim=16, vocab_size=128, tie_word_embeddings=True,
                      rope=RopeConfig(theta=10000.0))
    p = tiny_checkpoint(0, cache_dir=tmp_path, config=cfg)
    assert p != tiny_checkpoint(0, cache_dir=tmp_path)
    assert "lm_head.weight" not in load_file(p / "model.safetensors")
    w = load_rank_weights(p, ParallelConfig(4, 3), progress=False)
    assert torch.equal(w.lm_head, w.embed)


def test_tiny_loads_with_mk_at_every_tp(tmp_path):
    p = tiny_checkpoint(0, cache_dir=tmp_path)
    sd = load_file(p / "model.safetensors")
    for tp in (1, 2, 4, 8):
        _reassemble_and_check(p, {k: v.float() for k, v in sd.items()}, tp)
    w = load_rank_weights(p, progress=False)
    assert w.dtype == torch.bfloat16 and torch.equal(w.embed, sd["model.embed_tokens.weight"])


def test_tiny_loads_in_transformers_and_generates_varied_tokens(tmp_path):
    from transformers import LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    p = tiny_checkpoint(0, cache_dir=tmp_path)
    records = []

    class _Grab(logging.Handler):
        def emit(self, record):
            records.append(record)

    handler = _Grab(level=logging.WARNING)
    hf_logger = hf_logging.get_logger("transformers")
    hf_logger.addHandler(handler)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model, info = LlamaForCausalLM.from_pretrained(p, output_loading_info=True,
                                                           dtype=torch.float32)
    finally:
        hf_logger.removeHandler(handler)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    msgs = [r.getMessage() for r in records] + [str(w.message) for w in caught]
    assert not [m for m in msgs if "missing" in m.lower() or "newly initialized" in m.lower()
                or "not used" in m.lower()], msgs
    assert model.config.rope_parameters["rope_type"] == "llama3"
    assert model.config.head_dim == 32 and model.config.num_key_value_heads == 2

    model.eval()
    for prompt in ([1, 17, 300, 42], [1, 5]):
        ids = torch.tensor([prompt])
        out = []
        with torch.no_grad():
            for _ in range(32):
                nxt = int(model(ids).logits[0, -1].argmax())
                out.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
        assert len(set(out)) >= 12, out
        assert len(set(out[16:])) >= 4, out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_norms_copy_and_in_place_agree(hf_ckpts, dtype):
    """mk.weights.fold_norms: qkv / gate_up times the attention / MLP norm weights over their K
    columns (float32, one rounding), those norms ones, the rest untouched; the copy leaves the
    caller's weights as they were, inplace=True folds the caller's tensors themselves (the same
    storage, bitwise the copy's values) and marks them folded; folding folded weights is a no-op."""
    ckpt = hf_ckpts["GQA_LLAMA3"][0]
    w = load_rank_weights(ckpt, ParallelConfig(1, 0), dtype=dtype, progress=False)
    before = {k: getattr(w, k).clone() for k in ("qkv", "gate_up", "attn_norm", "mlp_norm", "o")}
    folded = W.fold_norms(w)
    assert folded.norms_folded and not w.norms_folded
    for k, v in before.items():
        assert torch.equal(getattr(w, k), v), k                   # the copy left w alone
    want = (before["qkv"].float() * before["attn_norm"].float()[:, None, :]).to(dtype)
    assert torch.equal(folded.qkv, want)
    assert torch.equal(folded.attn_norm, torch.ones_like(before["attn_norm"]))
    assert folded.o is w.o
    ptr = w.qkv.data_ptr()
    same = W.fold_norms(w, inplace=True)
    assert same is w and w.norms_folded and w.qkv.data_ptr() == ptr
    for k in ("qkv", "gate_up", "attn_norm", "mlp_norm"):
        assert torch.equal(getattr(w, k), getattr(folded, k)), k
    assert W.fold_norms(w) is w and W.fold_norms(w, inplace=True) is w
