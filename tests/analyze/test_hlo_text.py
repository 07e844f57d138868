"""Reading XLA's HLO text: instructions, tuple shapes, quoted metadata, called computations."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from libarena.analyze import hlo_text
from libarena.errors import ArenaError

MODULE = """HloModule jit_f, entry_computation_layout={(f32[8,4]{1,0})->(f32[8]{0}, s32[8]{0})}

%region_0.1 (a.1: f32[], b.1: f32[]) -> f32[] {
  %a.1 = f32[] parameter(0), metadata={op_name="reduce_sum"}
  %b.1 = f32[] parameter(1), metadata={op_name="reduce_sum"}
  ROOT %add.1 = f32[] add(f32[] %a.1, f32[] %b.1), metadata={op_name="reduce_sum"}
}

ENTRY %main.2 (x.1: f32[8,4]) -> (f32[8], s32[8]) {
  %x.1 = f32[8,4]{1,0} parameter(0), metadata={op_name="x"}
  %c.1 = f32[] constant(0)
  %r.1 = f32[8]{0} reduce(f32[8,4]{1,0} %x.1, f32[] %c.1), dimensions={1}, to_apply=%region_0.1, metadata={op_name="jit(f)/jvp(block_01)/bsh,hknd->kbsnd/reduce_sum" stack_frame_id=3}
  %i.1 = s32[8]{0} iota(), iota_dimension=0
  ROOT %t.1 = (f32[8]{0}, /*index=1*/s32[8]{0}) tuple(f32[8]{0} %r.1, s32[8]{0} %i.1)
}
"""


def test_parse_module_reads_computations_and_instructions():
    module = hlo_text.parse_module(MODULE)
    assert module.order == ["region_0.1", "main.2"] and module.entry == "main.2"
    entry = module.entry_computation()
    assert [i.opcode for i in entry.instructions] == ["parameter", "constant", "reduce", "iota", "tuple"]
    reduce = entry.instructions[2]
    assert reduce.operands == [("f32[8,4]{1,0}", "x.1"), ("f32[]", "c.1")]
    assert reduce.called == ["region_0.1"]
    # A comma inside the quoted op_name must not split the attributes.
    assert reduce.op_name == "jit(f)/jvp(block_01)/bsh,hknd->kbsnd/reduce_sum"
    assert "metadata" not in reduce.attributes and "to_apply=%region_0.1" in reduce.attributes
    assert entry.instructions[1].literal == "0" and entry.instructions[0].literal == "0"
    root = entry.root
    assert root.is_root and root.shape == "(f32[8]{0}, s32[8]{0})"
    assert module.computations["region_0.1"].root.name == "add.1"


def test_probe_line_is_parseable_without_metadata():
    entry = hlo_text.parse_module(MODULE).entry_computation()
    line = entry.instructions[2].probe_line()
    assert line.startswith("  %r.1 = f32[8]{0} reduce(") and "stack_frame_id" not in line


def test_shapes():
    assert hlo_text.element_type("bf16[2]{0}") == "bf16" and hlo_text.element_type("(f32[], f32[])") == "tuple"
    assert hlo_text.without_layout("(f32[8,4]{1,0}, s32[])") == "(f32[8,4], s32[])"
    assert hlo_text.split_top_level('a={1,2}, b="x,y", c=(1, 2)') == ["a={1,2}", 'b="x,y"', "c=(1, 2)"]


def test_garbage_is_an_arena_error_naming_the_line():
    bad = "HloModule m\n\nENTRY %e {\n  %x = f32[] \n}\n"
    with pytest.raises(ArenaError, match="line 4"):
        hlo_text.parse_module(bad)
    with pytest.raises(ArenaError, match="no ENTRY"):
        hlo_text.parse_module("HloModule m\n")


def _split_char_by_char(text: str) -> list[str]:
    """The plain definition split_top_level implements with a token regex: commas at depth 0, outside
    quoted strings (backslash escapes) and /*...*/ comments."""
    parts, depth, start, i, n = [], 0, 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
        i += 1
    if text[start:].strip():
        parts.append(text[start:])
    return [p.strip() for p in parts]


@given(st.lists(st.sampled_from(['a', ' ', ',', '(', ')', '[', ']', '{', '}', '"', '\\', '/*', '*/', '=', 'x,y']), max_size=40))
@settings(max_examples=400, deadline=None)
def test_split_top_level_matches_the_character_scan(tokens):
    text = "".join(tokens)
    assert hlo_text.split_top_level(text) == _split_char_by_char(text)


def test_match_close_skips_quoted_brackets_and_escapes():
    line = 'f(a, "b)\\")", {c, (d)}) tail'
    assert line[: hlo_text._match_close(line, 1)] == 'f(a, "b)\\")", {c, (d)})'
    with pytest.raises(ValueError, match="unbalanced"):
        hlo_text._match_close("(a, (b)", 0)
