"""A reader for XLA's HLO text (as printed by :func:`libarena.analyze.xla_cost.module_text`).

jaxlib exposes no per-instruction accessors for shapes, attributes or metadata, so the operator table is
built from the module's text. The printer's format is regular: computations in post-order (callees
first, ``ENTRY`` last), one instruction per line::

    [ROOT ]%name = SHAPE opcode(SHAPE %operand, ...), attr=value, ..., metadata={op_name="..." ...}

Only what the analysis needs is parsed: names, shapes, opcode, operands, the called computations, the
attribute text (to rebuild the instruction in a probe module) and the metadata's ``op_name``.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from dataclasses import dataclass, field

from libarena.errors import ArenaError

_INSTRUCTION = re.compile(r"^\s+(ROOT )?%([^\s=]+) = ")
_COMPUTATION = re.compile(r"^(ENTRY )?%([^\s(]+) ")
_OPCODE = re.compile(r"([a-z][a-z0-9\-]*)\(")
_OP_NAME = re.compile(r'op_name="((?:[^"\\]|\\.)*)"')
_REFERENCE = re.compile(r"%([\w.\-]+)")
_ARRAY_SHAPE = re.compile(r"^([a-z][a-z0-9]*)\[([0-9,]*)\]")
#: Attributes that name other instructions: meaningless (and unparsable) in a one-instruction probe.
_DROPPED_ATTRIBUTES = ("metadata", "control-predecessors")

@dataclass
class Instruction:
    name: str
    shape: str
    opcode: str
    #: (shape, name) per operand, in order.
    operands: list[tuple[str, str]]
    #: The text between the parentheses when it is not a list of operands (constant literal, parameter number).
    literal: str
    #: Attribute text (``, a=b, c=d``) without the metadata and control dependencies.
    attributes: str
    op_name: str
    called: list[str]
    is_root: bool

    def probe_line(self) -> str:
        """The instruction as XLA parses it, without metadata (probe modules carry no stack frames)."""
        args = ", ".join(f"{shape} %{name}" for shape, name in self.operands) if self.operands else self.literal
        return f"  {'ROOT ' if self.is_root else ''}%{self.name} = {self.shape} {self.opcode}({args}){self.attributes}"


@dataclass
class Computation:
    name: str
    is_entry: bool
    instructions: list[Instruction] = field(default_factory=list)
    #: The computation's header line as printed (``%name (params) -> shape {``).
    header: str = ""

    @property
    def root(self) -> Instruction:
        for instr in self.instructions:
            if instr.is_root:
                return instr
        return self.instructions[-1]


@dataclass
class HloModuleText:
    computations: dict[str, Computation]
    #: Computation names in module (post-)order.
    order: list[str]
    entry: str

    def entry_computation(self) -> Computation:
        return self.computations[self.entry]


_STRING_BODY = re.compile(r'[^"\\]*(?:\\.[^"\\]*)*')
# The characters the scanners below act on; everything between them is skipped by the regex engine
# (HLO lines are long and mostly names, shapes and metadata strings).
_BRACKETS = re.compile(r'"|/\*|[()\[\]{}]')
_BRACKETS_AND_COMMAS = re.compile(r'"|/\*|[()\[\]{},]')


def _closing_quote(text: str, start: int) -> int:
    """Index of the quote that closes the string opened at ``start`` (``len(text)`` if none; escapes skipped)."""
    return min(_STRING_BODY.match(text, start + 1).end(), len(text))


def _tokens(text: str, pattern: re.Pattern[str], pos: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of every match of ``pattern`` (one of the two above) from ``pos``, outside
    quoted strings and comments."""
    n = len(text)
    while True:
        found = pattern.search(text, pos)
        if found is None:
            return
        i, token = found.start(), found.group()
        if token == '"':
            pos = _closing_quote(text, i) + 1
        elif token == "/*":
            end = text.find("*/", i + 2)
            pos = n if end < 0 else end + 2
        else:
            yield i, token
            pos = i + 1


def _match_close(text: str, start: int) -> int:
    """Index just past the bracket that closes the one at ``start`` (quotes and nesting respected)."""
    depth = 0
    for i, token in _tokens(text, _BRACKETS, start):
        if token in "([{":
            depth += 1
        else:
            depth -= 1
            if depth == 0:
                return i + 1
    raise ValueError(f"unbalanced brackets in {text[start:start + 80]!r}")


def split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets, quotes and ``/*...*/`` comments."""
    parts, depth, start = [], 0, 0
    for i, token in _tokens(text, _BRACKETS_AND_COMMAS):
        if token in "([{":
            depth += 1
        elif token in ")]}":
            depth -= 1
        elif depth == 0:
            parts.append(text[start:i])
            start = i + 1
    tail = text[start:]
    if tail.strip():
        parts.append(tail)
    return [p.strip() for p in parts]


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/", "", text)


#: Where a tuple result shape ends: ``) opcode(`` (inside a shape a ``)`` is followed by ``,`` or ``)``).
_TUPLE_SHAPE_END = re.compile(r"\) (?=[a-z][a-z0-9\-]*\()")
#: The start of an operand (an array or tuple shape) right after ``opcode(``; anything else is a literal.
_OPERAND_START = re.compile(r"\(|[a-z][a-z0-9]*\[")
_OPERAND_NAME = re.compile(r"[\w.\-]+")


def _operands(line: str, start: int) -> tuple[list[tuple[str, str]], int] | None:
    """``SHAPE %name, SHAPE %name)`` from ``start``: (operands, index past the closing parenthesis), or
    None when the text is not that. Shapes never contain ``%``, so each operand ends at the next ``%name``
    and the list ends at the first name followed by ``)``: the long tuple shapes are never scanned."""
    operands = []
    pos = start
    while True:
        mark = line.find(" %", pos)
        if mark < 0:
            return None
        name = _OPERAND_NAME.match(line, mark + 2)
        if name is None:
            return None
        shape = line[pos:mark].strip()
        operands.append((_strip_comments(shape) if "/*" in shape else shape, name.group()))
        after = name.end()
        follow = line[after : after + 1]
        if follow == ")":
            return operands, after + 1
        if follow != ",":
            return None
        pos = after + 1


def parse_instruction(line: str, computation_names: set[str] | frozenset[str] = frozenset()) -> Instruction:
    head = _INSTRUCTION.match(line)
    if head is None:
        raise ValueError("not an instruction line")
    pos = head.end()
    if line[pos] == "(":
        found = _TUPLE_SHAPE_END.search(line, pos)
        end = found.end() - 1 if found is not None else _match_close(line, pos)
        shape = _strip_comments(line[pos:end])
        pos = end + 1
    else:
        end = line.index(" ", pos)
        shape = line[pos:end]
        pos = end + 1
    op = _OPCODE.match(line, pos)
    if op is None:
        raise ValueError(f"no opcode after the shape of %{head.group(2)}")
    opcode = op.group(1)
    open_paren = op.end() - 1
    operands: list[tuple[str, str]] = []
    literal = ""
    listed = _operands(line, open_paren + 1) if _OPERAND_START.match(line, open_paren + 1) else None
    if listed is not None:
        operands, close = listed
    else:
        close = _match_close(line, open_paren)
        inner = line[open_paren + 1 : close - 1]
        if "%" in inner:
            for part in split_top_level(inner):
                shape_text, _, name = part.rpartition(" %")
                operands.append((_strip_comments(shape_text), name))
        else:
            literal = inner
    op_name = ""
    kept = []
    for attr in split_top_level(line[close:]):
        key = attr.partition("=")[0]
        if not attr:
            continue
        if key == "metadata":
            found = _OP_NAME.search(attr)
            op_name = found.group(1).replace('\\"', '"').replace("\\'", "'") if found else ""
        elif key not in _DROPPED_ATTRIBUTES:
            kept.append(attr)
    attributes = "".join(", " + a for a in kept)
    called = [name for name in _REFERENCE.findall(attributes) if name in computation_names]
    return Instruction(head.group(2), shape, opcode, operands, literal, attributes, op_name, called, bool(head.group(1)))


def parse_module(text: str) -> HloModuleText:
    """Parse a whole module. Raises ArenaError naming the line when the text is not what XLA prints."""
    lines = text.splitlines()
    # First pass: computation names (attributes refer to computations defined earlier, but a name set
    # up front keeps the parser independent of the printing order).
    names = set()
    for line in lines:
        if line and not line[0].isspace() and line.endswith("{"):
            found = _COMPUTATION.match(line)
            if found:
                names.add(found.group(2))
    computations: dict[str, Computation] = {}
    order: list[str] = []
    entry = ""
    current: Computation | None = None
    for number, line in enumerate(lines, 1):
        if current is None:
            if line and not line[0].isspace() and line.endswith("{"):
                found = _COMPUTATION.match(line)
                if found:
                    current = Computation(found.group(2), bool(found.group(1)), header=line)
            continue
        if line == "}":
            computations[current.name] = current
            order.append(current.name)
            if current.is_entry:
                entry = current.name
            current = None
            continue
        if not line.strip():
            continue
        try:
            current.instructions.append(parse_instruction(line, names))
        except ValueError as exc:
            raise ArenaError(f"HLO text line {number}: cannot read instruction ({exc}): {line.strip()[:120]}") from None
    if not entry:
        raise ArenaError("HLO text has no ENTRY computation")
    return HloModuleText(computations, order, entry)


# --------------------------------------------------------------------------------------------------
# Shapes


@functools.lru_cache(maxsize=4096)  # shapes repeat across layers and rows
def element_type(shape: str) -> str:
    """Element type of an array shape; ``tuple`` for tuples."""
    shape = shape.strip()
    if shape.startswith("("):
        return "tuple"
    found = _ARRAY_SHAPE.match(shape)
    return found.group(1) if found else shape.partition("[")[0]


#: bytes per element of XLA's primitive types (fp8 variants: one byte)
_ELEMENT_BYTES = {"pred": 1, "s4": 1, "u4": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                  "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16}


@functools.lru_cache(maxsize=4096)  # shapes repeat across layers and rows
def array_bytes(shape: str) -> int | None:
    """Bytes of an array shape (``f32[256,1024]{0,1}`` -> 1,048,576), whatever its layout; None for a tuple or
    an element type not known here."""
    found = _ARRAY_SHAPE.match(shape.strip())
    if found is None:
        return None
    kind = found.group(1)
    size = _ELEMENT_BYTES.get(kind, 1 if kind.startswith("f8") else None)
    if size is None:
        return None
    count = 1
    for dim in filter(None, found.group(2).split(",")):
        count *= int(dim)
    return count * size


@functools.lru_cache(maxsize=4096)  # shapes repeat across layers and rows
def without_layout(shape: str) -> str:
    """``bf16[8,1024]{1,0}`` -> ``bf16[8,1024]`` (also inside tuples)."""
    return re.sub(r"\{[^{}]*\}", "", shape)
