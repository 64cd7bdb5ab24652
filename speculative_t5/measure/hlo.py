"""HBM bytes of a compiled program, instruction by instruction, read off its optimised HLO.

XLA's cost analysis ('bytes accessed') adds up every instruction's operands and outputs in
any memory: on a TPU v4 the compiler prefetches weights into on-chip memory (async
`copy-start` / `slice-start` into memory space S(n), n > 0) and the matmuls read that copy,
so a weight read once from HBM is counted two or three times. Here a byte counts when it
moves to or from HBM (memory space 0: a shape whose layout carries no S(n)):

- `copy-start` / `slice-start`: what it reads from HBM (the slice only) and writes there;
- a fusion: its HBM operands, except one read only through a `dynamic-slice` or a gather
  inside the fusion (then the slice's bytes), and its output if it lands in HBM;
- `dynamic-update-slice` on a buffer in HBM, and a fusion whose root scatters into one of
  its parameters (a cache's new keys written at per-row slots): the update only (in place:
  the output is the parameter's buffer);
- `*-done`, `bitcast`, `get-tuple-element`, `tuple`, `parameter`, `constant`: nothing.

A parameter lives in HBM. The result, grouped by what the bytes are, is what `compile`
sets against the ideal step (the weights it needs, each shard read once, and the caches).
"""
from __future__ import annotations

import collections
import re
from typing import Dict, List, NamedTuple, Optional, Tuple

ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "bf16": 2, "f16": 2, "s16": 2, "u16": 2, "f32": 4,
            "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
# one array shape: dtype[dims] and an optional {layout}, whose S(n) names its memory space
SHAPE = re.compile(r"\b(" + "|".join(ITEMSIZE) + r")\[([0-9,]*)\](\{[^}]*\})?")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
FREE = {"while", "conditional", "call", "bitcast", "get-tuple-element", "tuple", "parameter", "constant", "copy-done",
        "slice-done", "all-reduce-done", "all-gather-done", "collective-permute-done",
        "after-all", "partition-id", "replica-id", "iota"}
SLICING = ("dynamic-slice", "gather", "slice")


class Array(NamedTuple):
    nbytes: int
    hbm: bool      # memory space 0


class Instruction(NamedTuple):
    name: str
    opcode: str
    hbm_read: int
    hbm_written: int
    text: str


def arrays(shape_text: str) -> List[Array]:
    """The arrays of a (tuple) shape, in order."""
    out = []
    for dtype, dims, layout in SHAPE.findall(shape_text):
        n = ITEMSIZE[dtype]
        for d in filter(None, dims.split(",")):
            n *= int(d)
        out.append(Array(n, "S(" not in layout or "S(0)" in layout))
    return out


def _operands(args: str) -> List[str]:
    depth, end = 0, len(args)
    for i, ch in enumerate(args):  # the operand list ends at its closing parenthesis
        depth += ch == "("
        if ch == ")":
            if depth == 0:
                end = i
                break
            depth -= 1
    return re.findall(r"%([\w.\-]+)", args[:end])


def _computations(text: str) -> Dict[str, List[str]]:
    """Each computation's instruction lines by name."""
    out, name = {}, None
    for line in text.splitlines():
        head = re.match(r"^(?:ENTRY )?%([\w.\-]+) \(", line)
        if head and line.rstrip().endswith("{"):
            name = head.group(1)
            out[name] = []
            if line.startswith("ENTRY"):
                out["__entry__"] = out[name]
        elif line.startswith("}"):
            name = None
        elif name is not None:
            out[name].append(line)
    return out


def _sliced_params(lines: List[str]) -> Dict[int, int]:
    """A fused computation's parameters read only through slices -> the bytes they read."""
    params, uses, sliced = {}, collections.defaultdict(list), collections.defaultdict(int)
    for line in lines:
        m = INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, opcode, args = m.groups()
        if opcode == "parameter":
            params[name] = int(re.match(r"(\d+)", args).group(1))
            continue
        for i, operand in enumerate(_operands(args)):
            uses[operand].append(opcode)
            if opcode in SLICING and i == 0:
                sliced[operand] += sum(a.nbytes for a in arrays(shape))
    return {index: sliced[name] for name, index in params.items()
            if uses[name] and all(op in SLICING for op in uses[name])}


def _scatters_in_place(lines: List[str]) -> Optional[Tuple[int, int]]:
    """A fused computation whose root scatters into a parameter -> (that parameter's index,
    the bytes of the updates it writes); None for any other fusion."""
    params, shapes = {}, {}
    for line in lines:
        m = INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, opcode, args = m.groups()
        shapes[name] = sum(a.nbytes for a in arrays(shape))
        if opcode == "parameter":
            params[name] = int(re.match(r"(\d+)", args).group(1))
        if line.lstrip().startswith("ROOT"):
            operands = _operands(args)
            if opcode != "scatter" or operands[0] not in params:
                return None
            return params[operands[0]], shapes.get(operands[-1], 0)
    return None


def hbm_instructions(hlo_text: str, computation: str = "__entry__",
                     comps: Optional[Dict[str, List[str]]] = None) -> List[Instruction]:
    """Every top-level instruction of one computation (default: the entry) with its HBM
    bytes; a while loop's body is not entered (`loop_bytes` does that)."""
    comps = _computations(hlo_text) if comps is None else comps
    shapes: Dict[str, List[Array]] = {}
    out = []
    for line in comps[computation]:
        m = INSTRUCTION.match(line)
        if not m:
            continue
        name, shape, opcode, args = m.groups()
        shapes[name] = arrays(shape)
        if opcode == "parameter":
            shapes[name] = [a._replace(hbm=True) for a in shapes[name]]
        if opcode in FREE:
            continue
        operands = _operands(args)
        results = shapes[name]
        if opcode in ("copy-start", "slice-start"):
            # copy-start: (destination, source, context); slice-start: ((source), destination,
            # context)
            source = shapes.get(operands[0], [Array(0, False)])[0]
            dest = results[0 if opcode == "copy-start" else 1]
            read = dest.nbytes if source.hbm else 0
            out.append(Instruction(name, opcode, read, dest.nbytes if dest.hbm else 0, line))
            continue
        if opcode == "dynamic-update-slice":
            update = shapes.get(operands[1], [Array(0, False)])[0]
            hbm = results[0].hbm
            out.append(Instruction(name, opcode, update.nbytes if hbm else 0,
                                   update.nbytes if hbm else 0, line))
            continue
        sliced, in_place = {}, None
        called = re.search(r"calls=%([\w.\-]+)", line)
        if opcode == "fusion" and called:
            sliced = _sliced_params(comps.get(called.group(1), []))
            in_place = _scatters_in_place(comps.get(called.group(1), []))
        if in_place:
            into_hbm = shapes.get(operands[in_place[0]], [Array(0, False)])[0].hbm
            if not (results[0].hbm and into_hbm):
                in_place = None  # a scatter from or into on-chip memory: its output counts whole
        read = 0
        for i, operand in enumerate(operands):
            if in_place and i == in_place[0]:
                continue
            for a in shapes.get(operand, []):
                if a.hbm:
                    read += min(sliced.get(i, a.nbytes), a.nbytes)
        written = in_place[1] if in_place else sum(a.nbytes for a in results if a.hbm)
        out.append(Instruction(name, opcode, read, written, line))
    return out


def hbm_bytes(hlo_text: str) -> Dict[str, int]:
    """{'read', 'written', 'total'} HBM bytes of one run of the entry computation (a while
    loop's body counted once, as XLA counts it)."""
    rows = hbm_instructions(hlo_text)
    read, written = sum(r.hbm_read for r in rows), sum(r.hbm_written for r in rows)
    return {"read": read, "written": written, "total": read + written}


def _loops(line: str) -> Optional[Tuple[str, Optional[int]]]:
    """A while instruction's body and its known trip count (None: data-dependent)."""
    m = INSTRUCTION.match(line)
    if not m or m.group(3) != "while":
        return None
    body = re.search(r"body=%([\w.\-]+)", line).group(1)
    trips = re.search(r'"known_trip_count":\{"n":"(\d+)"', line)
    return body, int(trips.group(1)) if trips else None


def _total(hlo_text: str, comps, computation: str) -> Tuple[int, int, int]:
    """(HBM bytes of one run of `computation` with its loops of known trip count, the
    largest of its loops of unknown trip count per iteration, the HBM bytes of the copies
    that write an array to HBM (copy, copy-start), e.g. in another layout)."""
    rows = hbm_instructions(hlo_text, computation, comps)
    total = sum(r.hbm_read + r.hbm_written for r in rows)
    copies = sum(r.hbm_read + r.hbm_written for r in rows
                 if r.opcode in ("copy", "copy-start") and r.hbm_written)
    inner = 0
    for line in comps[computation]:
        loop = _loops(line)
        if loop:
            t, i, c = _total(hlo_text, comps, loop[0])
            if loop[1] is None:
                inner = max(inner, t)
            else:
                total, copies = total + loop[1] * t, copies + loop[1] * c
            inner = max(inner, i)
    return total, inner, copies


def loop_bytes(hlo_text: str) -> Dict[str, int]:
    """HBM bytes of a decode program: 'outside' its loops (set-up, once); 'per_iteration' of
    its outermost data-dependent loop (a plain step, or a speculative round without its
    draft steps), 'inner_per_iteration' of the data-dependent loop inside it (a draft step);
    'copies_per_iteration': the HBM bytes of copies into HBM in the outer loop (their reads
    from on-chip memory count nothing; a cache-sized carry copied each round would show
    here; prefetches into on-chip memory do not count);
    'copies_outside': the same outside the loops (arrays laid out anew once per decode)."""
    comps = _computations(hlo_text)
    outside, _, copies_outside = _total(hlo_text, comps, "__entry__")
    out = {"outside": outside, "copies_outside": copies_outside, "per_iteration": 0,
           "inner_per_iteration": 0, "copies_per_iteration": 0}
    for line in comps["__entry__"]:
        loop = _loops(line)
        if loop and loop[1] is None:
            t, inner, copies = _total(hlo_text, comps, loop[0])
            if t > out["per_iteration"]:
                out.update(per_iteration=t, inner_per_iteration=inner,
                           copies_per_iteration=copies)
    return out
