"""The instruction stream: opcodes, the 32-word int32 instruction format, counters.

The planner emits one int32 tensor [N, 32]; the CPU interpreter (mk.vm) and the megakernel execute
the same bytes. The header words below are fixed: the megakernel's controller reads them without
knowing the opcode. Opcode-specific arguments live in words ARG0..ARG_LAST and are named by each
instruction family in mk/instructions/.

Counters are int32 slots in one array per rank. An instruction waits until counter[c] >= target for
each of its (c, target) pairs, runs, then adds 1 to its signal counter (on its own rank, on one
named peer rank, or on every rank, see SignalScope) after its stores are visible.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch

INSTR_WORDS = 32
MAX_WAITS = 4
NO_COUNTER = -1

# Header words -------------------------------------------------------------------------------------
W_OPCODE = 0
W_LAYER = 1
W_ROW0 = 2          # first token row of the step's flattened token dimension
W_ROWS = 3          # number of token rows
W_COL0 = 4          # first output column (or head, for attention) of the tile
W_COLS = 5          # number of output columns (or heads)
W_WAIT0 = 6         # MAX_WAITS pairs (counter, target): words 6..13
W_SIGNAL = 14       # counter to signal, NO_COUNTER for none
W_SIGNAL_SCOPE = 15 # SignalScope
W_SIGNAL_RANK = 16  # the peer rank for SignalScope.PEER
W_SIGNAL_COUNT = 17 # how much to add (normally 1)
ARG0 = 18           # opcode-specific arguments: words 18..31
ARG_LAST = INSTR_WORDS - 1
NUM_ARGS = INSTR_WORDS - ARG0


class SignalScope(IntEnum):
    LOCAL = 0   # this rank's counter
    PEER = 1    # rank W_SIGNAL_RANK's counter (through symmetric memory on the GPU)
    ALL = 2     # every rank's counter, this one included


@dataclass
class Instruction:
    """One decoded instruction. `args` has NUM_ARGS words, meaning given by the opcode's family."""

    opcode: int
    layer: int = 0
    row0: int = 0
    rows: int = 0
    col0: int = 0
    cols: int = 0
    waits: list[tuple[int, int]] = field(default_factory=list)
    signal: int = NO_COUNTER
    signal_scope: int = SignalScope.LOCAL
    signal_rank: int = 0
    signal_count: int = 1
    args: list[int] = field(default_factory=lambda: [0] * NUM_ARGS)

    def encode(self) -> list[int]:
        if len(self.waits) > MAX_WAITS:
            raise ValueError(f"instruction has {len(self.waits)} waits, the format holds {MAX_WAITS}")
        if len(self.args) > NUM_ARGS:
            raise ValueError(f"instruction has {len(self.args)} args, the format holds {NUM_ARGS}")
        w = [0] * INSTR_WORDS
        w[W_OPCODE] = int(self.opcode)
        w[W_LAYER] = self.layer
        w[W_ROW0], w[W_ROWS], w[W_COL0], w[W_COLS] = self.row0, self.rows, self.col0, self.cols
        for i in range(MAX_WAITS):
            c, t = self.waits[i] if i < len(self.waits) else (NO_COUNTER, 0)
            w[W_WAIT0 + 2 * i], w[W_WAIT0 + 2 * i + 1] = c, t
        w[W_SIGNAL], w[W_SIGNAL_SCOPE] = self.signal, int(self.signal_scope)
        w[W_SIGNAL_RANK], w[W_SIGNAL_COUNT] = self.signal_rank, self.signal_count
        w[ARG0:ARG0 + len(self.args)] = [int(a) for a in self.args]
        return w

    @classmethod
    def decode(cls, words) -> "Instruction":
        w = [int(x) for x in words]
        waits = [(w[W_WAIT0 + 2 * i], w[W_WAIT0 + 2 * i + 1]) for i in range(MAX_WAITS)
                 if w[W_WAIT0 + 2 * i] != NO_COUNTER]
        return cls(opcode=w[W_OPCODE], layer=w[W_LAYER], row0=w[W_ROW0], rows=w[W_ROWS],
                   col0=w[W_COL0], cols=w[W_COLS], waits=waits, signal=w[W_SIGNAL],
                   signal_scope=w[W_SIGNAL_SCOPE], signal_rank=w[W_SIGNAL_RANK],
                   signal_count=w[W_SIGNAL_COUNT], args=w[ARG0:])


def serialize(instrs: list[Instruction]) -> torch.Tensor:
    """Instructions -> one contiguous int32 tensor [N, INSTR_WORDS]."""
    return torch.tensor([i.encode() for i in instrs], dtype=torch.int32).reshape(-1, INSTR_WORDS)


def deserialize(stream: torch.Tensor) -> list[Instruction]:
    if stream.dtype != torch.int32 or stream.dim() != 2 or stream.shape[1] != INSTR_WORDS:
        raise ValueError(f"an instruction stream is int32 [N, {INSTR_WORDS}], got "
                         f"{stream.dtype} {list(stream.shape)}")
    return [Instruction.decode(row) for row in stream.tolist()]


class Op(IntEnum):
    """The opcode table. Each opcode's three faces live in one file of mk/instructions/.

    Opcode -> family file; the argument words of each opcode are documented in its family file.
    """

    NOOP = 0            # rows.py       does nothing but wait and signal (also: dependency joins)
    COPY = 1            # rows.py       dst rows <- src rows
    RMSNORM = 2         # rows.py       dst rows <- rmsnorm(src rows) * weight[layer]
    RESIDUAL_ADD = 3    # rows.py       dst rows <- dst rows + src rows
    # The model's instructions, numbered from 8 up.
    EMBED = 8           # embed.py      hidden rows <- embed[token ids] (vocab shard; TP: scatter)
    QKV_ROPE = 9        # qkv.py        GEMM tile of qkv; RoPE on q/k; q -> Q, k/v -> KV cache pages
    ATTENTION = 10      # attention.py  causal attention of one sequence's rows x KV heads x KV split
    ATTN_REDUCE = 11    # attention.py  combine the KV splits of one segment (log-sum-exp weights)
    O_PROJ = 12         # matmul.py     GEMM tile of o_proj; epilogue: += residual, or TP scatter
    GATE_UP = 13        # matmul.py     GEMM tile of gate and up; epilogue silu(gate) * up
    DOWN = 14           # matmul.py     GEMM tile of down_proj; epilogue: += residual, or TP scatter
    TP_REDUCE = 15      # comm.py       sum n partials in rank order (+ residual), write all ranks
    LM_NORM = 16        # lm.py         gather each sequence's last row, final rmsnorm
    LM_HEAD = 17        # matmul.py     GEMM tile of lm_head -> float32 logits (vocab shard)
    SPLITK_REDUCE = 18  # splitk.py     sum a split-K tile's float32 partials, then the op's epilogue
    L2_PREFETCH = 19    # prefetch.py   bring a range of one layer's GEMM weights into L2 (no output)


def op_name(opcode: int) -> str:
    try:
        return Op(opcode).name
    except ValueError:
        return f"OP{opcode}"


# Readable dump ------------------------------------------------------------------------------------
def format_instruction(instr: "Instruction | list[int]", index: int | None = None,
                       arg_names: tuple[str, ...] | None = None) -> str:
    """One line: index, opcode, layer, rows, cols, waits, signal, named (or raw) args."""
    if not isinstance(instr, Instruction):
        instr = Instruction.decode(instr)
    if arg_names is None:
        arg_names = _arg_names(instr.opcode)
    waits = " ".join(f"c{c}>={t}" for c, t in instr.waits) or "-"
    if instr.signal == NO_COUNTER:
        sig = "-"
    else:
        where = f"@r{instr.signal_rank}" if instr.signal_scope == SignalScope.PEER else (
            "@all" if instr.signal_scope == SignalScope.ALL else "")
        sig = f"c{instr.signal}+={instr.signal_count}{where}"
    last = max([i + 1 for i, a in enumerate(instr.args) if a] + [len(arg_names)])
    args = " ".join(f"{arg_names[i] if i < len(arg_names) else i}={instr.args[i]}"
                    for i in range(min(last, NUM_ARGS)))
    head = f"{index:7d} " if index is not None else ""
    return (f"{head}{op_name(instr.opcode):<12} L{instr.layer:<3} rows[{instr.row0}:+{instr.rows}] "
            f"cols[{instr.col0}:+{instr.cols}] wait[{waits}] sig[{sig}] {args}").rstrip()


def _arg_names(opcode: int) -> tuple[str, ...]:
    """Argument names from the opcode's family (ARG_NAMES: {Op: names}), if it declares them."""
    try:
        from mk.instructions.base import family_of
        fam = family_of(opcode)
    except (ImportError, ValueError):
        return ()
    names = getattr(fam, "ARG_NAMES", {}).get(int(opcode))
    if names is None:
        names = _ROWS_ARG_NAMES.get(int(opcode), ())
    return tuple(names)


_ROWS_ARG_NAMES = {1: ("src", "dst"), 2: ("src", "dst", "norm"), 3: ("src", "dst")}


def dump(stream: torch.Tensor, start: int = 0, stop: int | None = None, opcode: int | None = None,
         layer: int | None = None) -> str:
    """Readable text of the rows [start, stop) of a stream, optionally one opcode / layer only."""
    if stream.dtype != torch.int32 or stream.dim() != 2 or stream.shape[1] != INSTR_WORDS:
        raise ValueError(f"an instruction stream is int32 [N, {INSTR_WORDS}], got "
                         f"{stream.dtype} {list(stream.shape)}")
    rows = stream.tolist()
    stop = len(rows) if stop is None else min(stop, len(rows))
    lines = []
    for i in range(start, stop):
        w = rows[i]
        if opcode is not None and w[W_OPCODE] != opcode:
            continue
        if layer is not None and w[W_LAYER] != layer:
            continue
        lines.append(format_instruction(w, i))
    return "\n".join(lines)


def summary(stream: torch.Tensor) -> str:
    """Counts per opcode."""
    import collections
    cnt = collections.Counter(stream[:, W_OPCODE].tolist())
    return ", ".join(f"{op_name(k)}={v}" for k, v in sorted(cnt.items()))


def load_stream(path) -> torch.Tensor:
    """An int32 [N, 32] tensor saved with torch.save, or a dict holding one under 'instrs'/'stream'
    (a saved StepPlan's dict, for example)."""
    obj = torch.load(path, map_location="cpu", weights_only=True)
    if isinstance(obj, dict):
        for key in ("instrs", "stream", "instructions"):
            if key in obj:
                obj = obj[key]
                break
        else:
            raise ValueError(f"{path}: a dict without an 'instrs' / 'stream' entry: {sorted(obj)}")
    if not isinstance(obj, torch.Tensor):
        raise ValueError(f"{path}: holds a {type(obj).__name__}, not an instruction tensor")
    return obj


def main(argv=None) -> int:
    import argparse
    import sys
    p = argparse.ArgumentParser(prog="python -m mk.ir", description="Inspect instruction streams.")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="print a stream saved with torch.save (int32 [N, 32])")
    d.add_argument("file")
    d.add_argument("--start", type=int, default=0)
    d.add_argument("--stop", type=int, default=None)
    d.add_argument("--op", default=None, help="only this opcode (name or number)")
    d.add_argument("--layer", type=int, default=None)
    d.add_argument("--summary", action="store_true", help="only the counts per opcode")
    args = p.parse_args(argv)
    try:
        stream = load_stream(args.file)
    except (OSError, ValueError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    op = None
    if args.op is not None:
        op = int(args.op) if args.op.isdigit() else int(Op[args.op.upper()])
    print(f"# {stream.shape[0]} instructions: {summary(stream)}")
    if not args.summary:
        print(dump(stream, args.start, args.stop, op, args.layer))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
