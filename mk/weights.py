"""Hugging Face Llama safetensors checkpoints -> one rank's weights, stacked per kind.

INTERFACE (fixed):

    load_rank_weights(model_dir, parallel=ParallelConfig(), dtype=torch.bfloat16,
                      device="cpu", progress=True) -> RankWeights

RankWeights holds, for rank r of TP size n (Megatron layout, see ParallelConfig):
    config            ModelConfig
    parallel          ParallelConfig
    embed             [V/n, H]              rows [r*V/n, (r+1)*V/n) of embed_tokens
    lm_head           [V/n, H]              same rows of lm_head (or of embed_tokens when tied)
    attn_norm         [L, H]                input_layernorm
    mlp_norm          [L, H]                post_attention_layernorm
    final_norm        [H]
    qkv               [L, (hq + 2*hkv)*D, H]  q rows of this rank's hq heads, then k rows, then v
                                            rows of its hkv KV heads (hkv = 1 when replicated)
    o                 [L, H, hq*D]          o_proj input columns of this rank's q heads
    gate_up           [L, 2*I/n, H]         gate rows of this rank's slice, then up rows
    down              [L, H, I/n]           down_proj input columns of this rank's slice

Every tensor is contiguous, K-major (the last dim is the reduction dim), 16-byte aligned.

q/k rows stay in the HF checkpoint's "rotate_half" RoPE layout (no permutation back to Meta's
interleaved layout): apply RoPE the way transformers does.
"""

from __future__ import annotations

import json
import os
import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from mk.config import ModelConfig, ParallelConfig


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the file and the tensor."""


@dataclass
class RankWeights:
    config: ModelConfig
    parallel: ParallelConfig
    embed: torch.Tensor
    lm_head: torch.Tensor
    attn_norm: torch.Tensor
    mlp_norm: torch.Tensor
    final_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    # True: attn_norm / mlp_norm are folded into qkv / gate_up (fold_norms): the norms are ones
    norms_folded: bool = False

    @property
    def dtype(self) -> torch.dtype:
        return self.qkv.dtype


def fold_norms(weights: RankWeights, inplace: bool = False) -> RankWeights:
    """The same model with each layer's attention / MLP RMSNorm weight g folded into the GEMM
    after the norm: qkv * g_attn and gate_up * g_mlp over their input (K) columns, in float32,
    rounded once to the weights' dtype; those norm weights become ones (the final norm stays).
    rmsnorm(h, g) @ W^T = (h * r) @ (W * g)^T with r = rsqrt(mean(h^2) + eps), so every backend
    runs the folded weights as the same model; PlanConfig.norm_fold needs them (its GEMMs run on
    h and scale their rows by r). By default new tensors: the caller's weights are left as they
    are (at the 70B TP8 rank the copy is ~11 GB of qkv and gate_up while both are held).
    inplace: fold the caller's tensors themselves, a layer at a time (no copy), and mark
    `weights` folded; for a caller that owns them (every later user of this RankWeights then
    runs the folded model, within bf16 rounding of the unfolded one, not bitwise)."""
    if weights.norms_folded:
        return weights

    def fold(w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        out = w if inplace else torch.empty_like(w)
        for layer in range(w.shape[0]):     # a layer at a time: float32 temporaries stay small
            out[layer].copy_(w[layer].float() * g[layer].float()[None, :])
        return out
    if inplace:
        fold(weights.qkv, weights.attn_norm)
        fold(weights.gate_up, weights.mlp_norm)
        weights.attn_norm.fill_(1)
        weights.mlp_norm.fill_(1)
        weights.norms_folded = True
        return weights
    return dataclasses.replace(
        weights, qkv=fold(weights.qkv, weights.attn_norm),
        gate_up=fold(weights.gate_up, weights.mlp_norm),
        attn_norm=torch.ones_like(weights.attn_norm), mlp_norm=torch.ones_like(weights.mlp_norm),
        norms_folded=True)


# ------------------------------------------------------------------------------------------------
# Implementation
# ------------------------------------------------------------------------------------------------

_ACCEPTED_DTYPES = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
_TARGET_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def _layer_names(i: int) -> dict[str, str]:
    p = f"model.layers.{i}."
    return {
        "q": p + "self_attn.q_proj.weight",
        "k": p + "self_attn.k_proj.weight",
        "v": p + "self_attn.v_proj.weight",
        "o": p + "self_attn.o_proj.weight",
        "gate": p + "mlp.gate_proj.weight",
        "up": p + "mlp.up_proj.weight",
        "down": p + "mlp.down_proj.weight",
        "attn_norm": p + "input_layernorm.weight",
        "mlp_norm": p + "post_attention_layernorm.weight",
    }


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor name of a full (unsharded) HF Llama checkpoint and its shape.

    `lm_head.weight` is included even when the embeddings are tied (it is then optional).
    """
    H, D, I, V = config.hidden_size, config.head_dim, config.intermediate_size, config.vocab_size
    hq, hkv = config.num_heads, config.num_kv_heads
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (V, H),
        "model.norm.weight": (H,),
        "lm_head.weight": (V, H),
    }
    for i in range(config.num_layers):
        n = _layer_names(i)
        shapes.update({
            n["q"]: (hq * D, H), n["k"]: (hkv * D, H), n["v"]: (hkv * D, H), n["o"]: (H, hq * D),
            n["gate"]: (I, H), n["up"]: (I, H), n["down"]: (H, I),
            n["attn_norm"]: (H,), n["mlp_norm"]: (H,),
        })
    return shapes


class _Checkpoint:
    """The safetensors files of a checkpoint directory: tensor name -> file, lazily opened handles."""

    def __init__(self, model_dir: Path):
        self.dir = model_dir
        self._handles: dict[Path, object] = {}
        index_path = model_dir / INDEX_FILE
        single_path = model_dir / SINGLE_FILE
        if index_path.is_file():
            self.source = index_path
            try:
                index = json.loads(index_path.read_text())
                weight_map = index["weight_map"]
                if not isinstance(weight_map, dict):
                    raise TypeError("weight_map is not an object")
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index_path}: not a valid safetensors index ({e!r})") from None
            self.files: dict[str, Path] = {}
            for name, fname in weight_map.items():
                path = model_dir / fname
                self.files[name] = path
            for path in sorted(set(self.files.values())):
                if not path.is_file():
                    users = sorted(n for n, p in self.files.items() if p == path)
                    raise CheckpointError(
                        f"{index_path}: names shard file {path.name!r}, which does not exist in "
                        f"{model_dir} (it should hold {len(users)} tensors, e.g. {users[0]!r})")
            # The index must agree with the shard headers.
            for path in sorted(set(self.files.values())):
                keys = set(self._open(path).keys())
                for name, p in self.files.items():
                    if p == path and name not in keys:
                        raise CheckpointError(
                            f"{path}: tensor {name!r} is listed in {INDEX_FILE} for this shard but "
                            f"the shard does not hold it")
        elif single_path.is_file():
            self.source = single_path
            self.files = {name: single_path for name in self._open(single_path).keys()}
        else:
            found = sorted(p.name for p in model_dir.glob("*.safetensors"))
            raise CheckpointError(
                f"{model_dir}: no {SINGLE_FILE} or {INDEX_FILE} in the checkpoint directory"
                + (f" (found {found}; only Hugging Face safetensors layouts are supported)" if found
                   else " (only Hugging Face safetensors checkpoints are supported)"))

    def _open(self, path: Path):
        h = self._handles.get(path)
        if h is None:
            try:
                h = safe_open(str(path), framework="pt", device="cpu")
            except (SafetensorError, OSError, ValueError) as e:
                raise CheckpointError(
                    f"{path}: truncated or corrupt safetensors file ({e})") from None
            self._handles[path] = h
        return h

    def slice(self, name: str):
        path = self.files[name]
        try:
            return self._open(path).get_slice(name)
        except SafetensorError as e:
            raise CheckpointError(f"{path}: cannot read tensor {name!r} ({e})") from None

    def read(self, name: str, rows: tuple[int, int] | None = None,
             cols: tuple[int, int] | None = None) -> torch.Tensor:
        """Only the requested rows / columns of `name` (never the whole tensor unless asked)."""
        sl = self.slice(name)
        try:
            if cols is not None:
                return sl[:, cols[0]:cols[1]]
            if rows is not None:
                return sl[rows[0]:rows[1]]
            return sl[:]
        except Exception as e:  # noqa: BLE001  safetensors raises various types on bad data
            raise CheckpointError(f"{self.files[name]}: cannot read tensor {name!r} ({e})") from None

    def close(self) -> None:
        self._handles.clear()


def _check_tensors(ckpt: _Checkpoint, config: ModelConfig) -> None:
    """Missing, unexpected, wrong-shape or wrong-dtype tensors -> CheckpointError, before any read."""
    expected = expected_shapes(config)
    optional = {"lm_head.weight"} if config.tie_word_embeddings else set()
    present = set(ckpt.files)
    unexpected = sorted(n for n in present - set(expected) if not n.endswith(_IGNORED_SUFFIXES))
    if unexpected:
        show = ", ".join(repr(n) for n in unexpected[:5])
        more = f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""
        raise CheckpointError(
            f"{ckpt.files[unexpected[0]]}: unexpected tensor {show}{more} (not part of a "
            f"{config.num_layers}-layer Llama checkpoint as described by config.json)")
    missing = [n for n in expected if n not in present and n not in optional]
    if missing:
        show = ", ".join(repr(n) for n in missing[:5])
        more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
        raise CheckpointError(f"{ckpt.source}: missing tensor {show}{more}")
    for name in expected:
        if name not in present:
            continue
        sl = ckpt.slice(name)
        dt = sl.get_dtype()
        if dt not in _ACCEPTED_DTYPES:
            raise CheckpointError(
                f"{ckpt.files[name]}: tensor {name!r} has unsupported dtype {dt} (mk loads F32, F16 "
                f"or BF16 checkpoints; quantized or other dtypes are not supported)")
        shape = tuple(sl.get_shape())
        if shape != expected[name]:
            raise CheckpointError(
                f"{ckpt.files[name]}: tensor {name!r} has shape {list(shape)}, expected "
                f"{list(expected[name])} from config.json")


def _empty(shape, dtype, device) -> torch.Tensor:
    t = torch.empty(shape, dtype=dtype, device=device)
    assert t.is_contiguous() and t.data_ptr() % 16 == 0, "allocation is not 16-byte aligned"
    return t


def load_rank_weights(model_dir, parallel: ParallelConfig = ParallelConfig(),
                      dtype: torch.dtype = torch.bfloat16, device="cpu",
                      progress: bool = True) -> RankWeights:
    """Load rank `parallel.rank`'s shard of a Hugging Face Llama safetensors checkpoint.

    model_dir holds config.json and either model.safetensors or model.safetensors.index.json with
    its shard files. Only this rank's slices are read from the (memory-mapped) files, converted to
    `dtype` and copied into tensors preallocated on `device`, one per weight kind, stacked over
    layers (see the module docstring for the shapes).

    Layout: q_proj / k_proj rows are kept exactly as stored in the HF checkpoint, i.e. in the HF
    "rotate_half" RoPE layout (transformers' conversion script permutes Meta's interleaved rows
    into it). No permutation is applied; consumers must apply RoPE the HF way (rotate_half: the
    first D/2 and last D/2 dims of a head form the rotation pairs).

    Errors: CheckpointError naming the file and the tensor (missing, unexpected, wrong shape,
    unsupported dtype, corrupt or truncated file, index naming a missing shard, no config.json);
    ConfigError from mk.config for configurations mk does not run or TP sizes that do not divide
    heads / intermediate / vocab. A progress bar over layers is shown on rank 0 when `progress` is
    true, unless MK_NO_PROGRESS=1.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: checkpoint directory does not exist")
    if not (model_dir / "config.json").is_file():
        raise CheckpointError(f"{model_dir / 'config.json'}: missing config.json in the checkpoint "
                              f"directory {model_dir}")
    if dtype not in _TARGET_DTYPES:
        raise ValueError(f"load_rank_weights: unsupported dtype {dtype} (float32, float16 or bfloat16)")
    config = ModelConfig.from_pretrained(model_dir)
    parallel.validate_for(config)
    device = torch.device(device)

    ckpt = _Checkpoint(model_dir)
    try:
        _check_tensors(ckpt, config)
        return _load(ckpt, config, parallel, dtype, device, progress)
    finally:
        ckpt.close()


def _load(ckpt: _Checkpoint, config: ModelConfig, parallel: ParallelConfig, dtype, device,
          progress: bool) -> RankWeights:
    r = parallel.rank
    L, H, D = config.num_layers, config.hidden_size, config.head_dim
    hq, hkv = parallel.heads_local(config), parallel.kv_heads_local(config)
    kv0 = parallel.kv_head_start(config)
    Il, Vl = parallel.intermediate_local(config), parallel.vocab_local(config)
    q_rows = (r * hq * D, (r + 1) * hq * D)
    kv_rows = (kv0 * D, (kv0 + hkv) * D)
    i_rows = (r * Il, (r + 1) * Il)
    v_rows = (r * Vl, (r + 1) * Vl)

    embed = _empty((Vl, H), dtype, device)
    lm_head = _empty((Vl, H), dtype, device)
    attn_norm = _empty((L, H), dtype, device)
    mlp_norm = _empty((L, H), dtype, device)
    final_norm = _empty((H,), dtype, device)
    qkv = _empty((L, (hq + 2 * hkv) * D, H), dtype, device)
    o = _empty((L, H, hq * D), dtype, device)
    gate_up = _empty((L, 2 * Il, H), dtype, device)
    down = _empty((L, H, Il), dtype, device)

    embed.copy_(ckpt.read("model.embed_tokens.weight", rows=v_rows))
    tied = config.tie_word_embeddings
    if tied:
        # As transformers does: tied embeddings mean lm_head *is* embed_tokens (a stored
        # lm_head.weight, if any, is ignored).
        lm_head.copy_(embed)
    else:
        lm_head.copy_(ckpt.read("lm_head.weight", rows=v_rows))
    final_norm.copy_(ckpt.read("model.norm.weight"))

    show = progress and r == 0 and os.environ.get("MK_NO_PROGRESS", "") not in ("1", "true", "yes")
    q_end, k_end = hq * D, (hq + hkv) * D
    for i in tqdm(range(L), desc=f"loading {ckpt.dir.name}", unit="layer", disable=not show,
                  leave=False):
        n = _layer_names(i)
        qkv[i, :q_end].copy_(ckpt.read(n["q"], rows=q_rows))
        qkv[i, q_end:k_end].copy_(ckpt.read(n["k"], rows=kv_rows))
        qkv[i, k_end:].copy_(ckpt.read(n["v"], rows=kv_rows))
        o[i].copy_(ckpt.read(n["o"], cols=q_rows))
        gate_up[i, :Il].copy_(ckpt.read(n["gate"], rows=i_rows))
        gate_up[i, Il:].copy_(ckpt.read(n["up"], rows=i_rows))
        down[i].copy_(ckpt.read(n["down"], cols=i_rows))
        attn_norm[i].copy_(ckpt.read(n["attn_norm"]))
        mlp_norm[i].copy_(ckpt.read(n["mlp_norm"]))

    return RankWeights(config=config, parallel=parallel, embed=embed, lm_head=lm_head,
                       attn_norm=attn_norm, mlp_norm=mlp_norm, final_norm=final_norm, qkv=qkv, o=o,
                       gate_up=gate_up, down=down)
