"""Tests for harness.hlo: finding shardings in HLO text by role, not by SSA name."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.hlo import (
    COLLECTIVE_OPCODES,
    HloModule,
    HloParseError,
    assert_every_sharding_call_annotated,
    count_collectives,
    entry_parameters,
    instructions_naming,
    output_sharding,
    parameter_shardings,
    parse_hlo,
    root_instruction,
    sharding_custom_calls,
    split_hlo_modules,
    stablehlo_shardings,
)
from harness.sharding import (
    Maximal,
    NoSharding,
    Replicated,
    ShardingParseError,
    Tiled,
    TupleSharding,
    parse_sharding,
)

pytestmark = pytest.mark.selftest

ROWS_4 = Tiled((4, 1), (0, 1, 2, 3))

# Modelled on `_get_xla_tensors_hlo([v])` after `mark_sharding` on a healthy (2.7+) build:
# parameters with explicit and iota shardings, one unannotated parameter, and a reducer
# computation whose own parameters must not be mistaken for the entry's.
ANNOTATED_HLO = """\
HloModule IrToHlo.9, entry_computation_layout={(f32[16,32]{1,0}, f32[32]{0}, f32[]{:T(128)})->(f32[4,32]{1,0})}

%add_F32.1 (x.2: f32[], y.3: f32[]) -> f32[] {
  %x.2 = f32[] parameter(0)
  %y.3 = f32[] parameter(1)
  ROOT %add.4 = f32[] add(f32[] %x.2, f32[] %y.3)
}

ENTRY %IrToHlo.9 (p0.1: f32[16,32], p1.2: f32[32], p2.3: f32[]) -> (f32[4,32]) {
  %p2.3 = f32[] parameter(2)
  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}
  %p1.2 = f32[32]{0} parameter(1), sharding={replicated}
  %reshape.2 = f32[4,128]{1,0} reshape(f32[16,32]{1,0} %p0.1)
  %slice.5 = f32[4,32]{1,0} slice(f32[4,128]{1,0} %reshape.2), slice={[0:4], [0:32]}
  %custom-call.3 = f32[4,32]{1,0} custom-call(f32[4,32]{1,0} %slice.5), custom_call_target="Sharding", sharding={devices=[4,1]0,1,2,3}, metadata={op_type="xla__custom_sharding" op_name="xla__custom_sharding"}
  ROOT %tuple.6 = (f32[4,32]{1,0}) tuple(f32[4,32]{1,0} %custom-call.3)
}
"""

# Bug 2a as 2.6.0 prints it: mark_sharding on a view leaves a Sharding custom-call with no
# `sharding=`. Its backend_config and metadata mention "sharding={...}" inside strings (one
# after a comma at the top level), which must not count as the attribute.
VIEW_BUG_HLO = """\
HloModule IrToHlo.7, entry_computation_layout={(f32[8,16]{1,0})->(f32[4,32]{1,0})}

ENTRY %IrToHlo.7 (p0.1: f32[8,16]) -> (f32[4,32]) {
  %p0.1 = f32[8,16]{1,0} parameter(0)
  %constant.2 = f32[] constant(1)
  %broadcast.3 = f32[8,16]{1,0} broadcast(f32[] %constant.2), dimensions={}
  %multiply.4 = f32[8,16]{1,0} multiply(f32[8,16]{1,0} %p0.1, f32[8,16]{1,0} %broadcast.3)
  %reshape.5 = f32[4,32]{1,0} reshape(f32[8,16]{1,0} %multiply.4)
  %custom-call.6 = f32[4,32]{1,0} custom-call(f32[4,32]{1,0} %reshape.5), custom_call_target="Sharding", backend_config="mode=1, sharding={replicated}", metadata={op_type="xla__custom_sharding" op_name="mark sharding={devices=[4,1]0,1,2,3}"}
  %custom-call.7 = f32[8,16]{1,0} custom-call(f32[8,16]{1,0} %multiply.4), custom_call_target="Sharding", sharding={devices=[4,1]0,1,2,3}
  ROOT %tuple.8 = (f32[4,32]{1,0}, f32[8,16]{1,0}) tuple(f32[4,32]{1,0} %custom-call.6, f32[8,16]{1,0} %custom-call.7)
}
"""

# Modelled on an `*after_optimizations.txt` dump: TPU layouts with tiling parentheses, async
# collective pairs, a collective inside a while body, a tuple-shaped annotated ROOT, and metadata
# whose op_name mentions a collective that is not one.
PARTITIONED_HLO = """\
HloModule SyncTensorsGraph.30, is_scheduled=true, entry_computation_layout={(f32[4,32]{1,0:T(8,128)})->(f32[8,16]{1,0}, s32[])}, num_partitions=4

%sum.1 (a.1: f32[], b.1: f32[]) -> f32[] {
  %a.1 = f32[] parameter(0)
  %b.1 = f32[] parameter(1)
  ROOT %add.1 = f32[] add(%a.1, %b.1)
}

%body.2 (state.1: (s32[], f32[8,16])) -> (s32[], f32[8,16]) {
  %state.1 = (s32[], f32[8,16]{1,0}) parameter(0)
  %gte.1 = f32[8,16]{1,0} get-tuple-element(%state.1), index=1
  %all-reduce.9 = f32[8,16]{1,0} all-reduce(%gte.1), channel_id=3, replica_groups={{0,1,2,3}}, to_apply=%sum.1
  %gte.2 = s32[] get-tuple-element(%state.1), index=0
  ROOT %tuple.2 = (s32[], f32[8,16]{1,0}) tuple(%gte.2, %all-reduce.9)
}

ENTRY %SyncTensorsGraph.30 (param.0: f32[4,32]) -> (f32[8,16], s32[]) {
  %param.0 = f32[4,32]{1,0:T(8,128)} parameter(0), sharding={devices=[4,1]<=[4]}, metadata={op_name="all-gather(input)"}
  %all-gather-start.1 = (f32[4,32]{1,0}, f32[16,32]{1,0}) all-gather-start(%param.0), channel_id=1, replica_groups=[1,4]<=[4], dimensions={0}, use_global_device_ids=true
  %all-gather-done.1 = f32[16,32]{1,0} all-gather-done(%all-gather-start.1)
  %reduce-scatter.2 = f32[4,32]{1,0} reduce-scatter(%all-gather-done.1), channel_id=2, replica_groups={{0,1,2,3}}, dimensions={0}, to_apply=%sum.1
  %all-to-all.3 = f32[4,32]{1,0} all-to-all(%reduce-scatter.2), channel_id=4, replica_groups={{0,1,2,3}}, dimensions={1}
  %collective-permute.4 = f32[4,32]{1,0} collective-permute(%all-to-all.3), channel_id=5, source_target_pairs={{0,1},{1,2},{2,3},{3,0}}
  %all-reduce-start.5 = f32[4,32]{1,0} all-reduce-start(%collective-permute.4), channel_id=6, replica_groups={{0,1,2,3}}, to_apply=%sum.1
  %all-reduce-done.5 = f32[4,32]{1,0} all-reduce-done(%all-reduce-start.5)
  %reshape.6 = f32[8,16]{1,0} reshape(%all-reduce-done.5)
  %zero.7 = s32[] constant(0)
  %init.8 = (s32[], f32[8,16]{1,0}) tuple(%zero.7, %reshape.6)
  %while.9 = (s32[], f32[8,16]{1,0}) while(%init.8), condition=%cond.3, body=%body.2
  %gte.10 = f32[8,16]{1,0} get-tuple-element(%while.9), index=1
  ROOT %tuple.11 = (f32[8,16]{1,0}, s32[]) tuple(%gte.10, %zero.7), sharding={{devices=[2,1,2]<=[4] last_tile_dim_replicate metadata={op_name="out"}}, {maximal device=0}}
}
"""


# --------------------------------------------------------------------------------------------
# Parameters
# --------------------------------------------------------------------------------------------


def test_parameter_shardings_by_number_in_the_entry_only() -> None:
    # The reducer's parameter(0)/parameter(1) belong to another computation and must not leak in.
    assert parameter_shardings(ANNOTATED_HLO) == {0: ROWS_4, 1: Replicated(), 2: NoSharding()}


def test_entry_parameters_are_ordered_by_number_with_shapes() -> None:
    parameters = entry_parameters(ANNOTATED_HLO)
    assert [(p.parameter_number, p.shape) for p in parameters] == [
        (0, "f32[16,32]{1,0}"),
        (1, "f32[32]{0}"),
        (2, "f32[]"),
    ]


def test_parameter_with_tpu_layout_and_metadata() -> None:
    # The layout holds parentheses and the metadata names a collective; neither confuses the reader.
    (parameter,) = entry_parameters(PARTITIONED_HLO)
    assert parameter.shape == "f32[4,32]{1,0:T(8,128)}"
    assert parameter.sharding == ROWS_4


# --------------------------------------------------------------------------------------------
# Sharding custom-calls (bug 2a detector)
# --------------------------------------------------------------------------------------------

SHARDING_CALLS = [
    # (HLO, has_sharding of each Sharding custom-call in text order)
    pytest.param(ANNOTATED_HLO, [True], id="healthy"),
    # The first call is the view: the bug.
    pytest.param(VIEW_BUG_HLO, [False, True], id="view-bug"),
    pytest.param(PARTITIONED_HLO, [], id="none-after-partitioning"),
]


@pytest.mark.parametrize(("hlo", "annotated"), SHARDING_CALLS)
def test_sharding_custom_calls_found_by_target(hlo: str, annotated: list[bool]) -> None:
    calls = sharding_custom_calls(hlo)
    assert [c.has_sharding for c in calls] == annotated
    assert all(c.custom_call_target == "Sharding" for c in calls)


def test_unannotated_call_reads_as_no_sharding_despite_strings_mentioning_it() -> None:
    unannotated, annotated = sharding_custom_calls(VIEW_BUG_HLO)
    assert unannotated.sharding == NoSharding()
    assert unannotated.attribute("backend_config") == '"mode=1, sharding={replicated}"'
    assert annotated.sharding == ROWS_4


def test_assert_every_sharding_call_annotated_passes_on_healthy_hlo() -> None:
    assert_every_sharding_call_annotated(ANNOTATED_HLO)


def test_assert_every_sharding_call_annotated_names_the_offending_line() -> None:
    with pytest.raises(AssertionError) as caught:
        assert_every_sharding_call_annotated(VIEW_BUG_HLO)
    message = str(caught.value)
    assert message.startswith(
        'Sharding custom-call without a sharding: 1 of 2 custom-call(s) with custom_call_target="Sharding" have no sharding= attribute'
    )
    assert "line 9: %custom-call.6 = f32[4,32]{1,0} custom-call(" in message
    assert "%custom-call.7" not in message  # the healthy call is not blamed


def test_assert_every_sharding_call_annotated_fails_when_there_is_nothing_to_check() -> None:
    # A graph where mark_sharding left no trace must not pass vacuously.
    with pytest.raises(AssertionError, match=r"expected at least 1 .* found 0"):
        assert_every_sharding_call_annotated(PARTITIONED_HLO)
    assert_every_sharding_call_annotated(PARTITIONED_HLO, min_calls=0)


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------

OUTPUTS = [
    # Unannotated ROOT tuple: the shardings its operands carry.
    pytest.param(ANNOTATED_HLO, TupleSharding((ROWS_4,)), id="root-tuple-of-annotated-call"),
    # One operand without a sharding makes the whole answer "no annotation".
    pytest.param(VIEW_BUG_HLO, NoSharding(), id="root-tuple-with-unannotated-operand"),
    # The ROOT's own tuple sharding, nested braces, metadata and all.
    pytest.param(
        PARTITIONED_HLO,
        TupleSharding((Tiled((2, 1, 2), (0, 1, 2, 3), ("replicated",)), Maximal(0))),
        id="annotated-root",
    ),
    # A non-tuple ROOT without an annotation.
    pytest.param(
        "ENTRY %e (p: f32[2]) -> f32[2] {\n  %p = f32[2]{0} parameter(0)\n  ROOT %n = f32[2]{0} negate(%p)\n}\n",
        NoSharding(),
        id="unannotated-root",
    ),
]


@pytest.mark.parametrize(("hlo", "expected"), OUTPUTS)
def test_output_sharding(hlo: str, expected) -> None:
    assert output_sharding(hlo) == expected


def test_root_instruction_is_the_entry_root_not_another_computations() -> None:
    root = root_instruction(PARTITIONED_HLO)
    assert root.opcode == "tuple"
    assert root.shape == "(f32[8,16]{1,0}, s32[])"
    assert root.operand_names == ("gte.10", "zero.7")


def test_brief_example_lines_without_a_computation_header() -> None:
    # The lines quoted in the brief, pasted as a fragment: they form an implicit entry computation.
    fragment = (
        "  %p0.1 = f32[16,32]{1,0} parameter(0), sharding={devices=[4,1]<=[4]}\n"
        '  %custom-call.3 = f32[4,32]{1,0} custom-call(f32[4,32]{1,0} %reshape.2), custom_call_target="Sharding", sharding={devices=[4,1]0,1,2,3}\n'
        '  %custom-call.4 = f32[4,32]{1,0} custom-call(f32[4,32]{1,0} %reshape.2), custom_call_target="Sharding"\n'
        "  ROOT %tuple.5 = (f32[8,16]{1,0}) tuple(f32[8,16]{1,0} %add.4)\n"
    )
    assert parameter_shardings(fragment) == {0: ROWS_4}
    assert [c.has_sharding for c in sharding_custom_calls(fragment)] == [True, False]
    assert root_instruction(fragment).operand_names == ("add.4",)
    # %add.4 is not in the fragment: its sharding is unknown, hence no annotation.
    assert output_sharding(fragment) == NoSharding()


# --------------------------------------------------------------------------------------------
# Collectives
# --------------------------------------------------------------------------------------------

COLLECTIVE_COUNTS = [
    # (HLO, expected non-zero counts; every other collective must be 0)
    # Async start/done pairs count once; the while body's all-reduce counts; metadata does not.
    pytest.param(
        PARTITIONED_HLO,
        {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1, "collective-permute": 1},
        id="partitioned",
    ),
    # Pre-partitioning HLO has no collectives.
    pytest.param(ANNOTATED_HLO, {}, id="before-partitioning"),
]


@pytest.mark.parametrize(("hlo", "nonzero"), COLLECTIVE_COUNTS)
def test_count_collectives(hlo: str, nonzero: dict[str, int]) -> None:
    expected = dict.fromkeys(COLLECTIVE_OPCODES, 0) | nonzero
    assert count_collectives(hlo) == expected


# --------------------------------------------------------------------------------------------
# Name independence
# --------------------------------------------------------------------------------------------


def _renumber_names(hlo: str, offset: int) -> str:
    """Give every `%name.N` a different N, as another graph of the same model would."""
    return re.sub(r"%([A-Za-z_][\w\-]*)\.(\d+)", lambda m: f"%{m.group(1)}.{int(m.group(2)) + offset}", hlo)


@given(st.sampled_from([ANNOTATED_HLO, VIEW_BUG_HLO, PARTITIONED_HLO]), st.integers(1, 10_000))
def test_answers_do_not_depend_on_ssa_names(hlo: str, offset: int) -> None:
    renamed = _renumber_names(hlo, offset)
    assert renamed != hlo  # the renaming really happened
    assert parameter_shardings(renamed) == parameter_shardings(hlo)
    assert output_sharding(renamed) == output_sharding(hlo)
    assert count_collectives(renamed) == count_collectives(hlo)
    assert [c.has_sharding for c in sharding_custom_calls(renamed)] == [
        c.has_sharding for c in sharding_custom_calls(hlo)
    ]


# --------------------------------------------------------------------------------------------
# Instruction anatomy and robustness
# --------------------------------------------------------------------------------------------


def test_instruction_parts() -> None:
    call = sharding_custom_calls(ANNOTATED_HLO)[0]
    assert (call.name, call.shape, call.opcode) == ("custom-call.3", "f32[4,32]{1,0}", "custom-call")
    assert call.operand_names == ("slice.5",)
    assert [name for name, _ in call.attributes] == ["custom_call_target", "sharding", "metadata"]
    assert call.line_number == 15
    assert not call.is_root


def test_escaped_quotes_inside_strings_do_not_end_them() -> None:
    # Read naively, the string would end at \" and expose a fake top-level sharding= attribute.
    line = r'  %cc.1 = f32[4]{0} custom-call(f32[4]{0} %p.0), custom_call_target="Sharding", backend_config="a\", sharding={replicated}, b=\""'
    (call,) = sharding_custom_calls(line)
    assert not call.has_sharding
    assert call.attribute("backend_config") == r'"a\", sharding={replicated}, b=\""'


def test_unmarked_root_is_the_last_instruction() -> None:
    # XLA's rule when no instruction says ROOT (hand-written HLO may omit it).
    hlo = "ENTRY %e (p: f32[2]) -> f32[2] {\n  %p = f32[2]{0} parameter(0)\n  %n = f32[2]{0} negate(%p), sharding={maximal device=1}\n}\n"
    assert root_instruction(hlo).opcode == "negate"
    assert output_sharding(hlo) == Maximal(1)


def test_names_without_percent_signs() -> None:
    # Newer XLA can print instruction names without '%'.
    hlo = "ENTRY main {\n  p = f32[8]{0} parameter(0), sharding={devices=[2]0,1}\n  ROOT n = f32[8]{0} negate(p), sharding={replicated}\n}\n"
    assert parameter_shardings(hlo) == {0: Tiled((2,), (0, 1))}
    assert output_sharding(hlo) == Replicated()


def test_module_and_computation_names() -> None:
    module = parse_hlo(PARTITIONED_HLO)
    assert isinstance(module, HloModule)
    assert module.name == "SyncTensorsGraph.30"
    assert [(c.name, c.is_entry) for c in module.computations] == [
        ("sum.1", False),
        ("body.2", False),
        ("SyncTensorsGraph.30", True),
    ]


def test_a_parsed_module_can_be_passed_instead_of_text() -> None:
    module = parse_hlo(ANNOTATED_HLO)
    assert parameter_shardings(module) == parameter_shardings(ANNOTATED_HLO)


def test_two_entry_computations_is_an_error_that_points_to_split() -> None:
    with pytest.raises(HloParseError, match="split_hlo_modules"):
        parameter_shardings(ANNOTATED_HLO + VIEW_BUG_HLO)


def test_computations_without_entry_is_an_error() -> None:
    hlo = "%f (x: f32[]) -> f32[] {\n  ROOT %x = f32[] parameter(0)\n}\n"
    with pytest.raises(HloParseError, match="found 0"):
        output_sharding(hlo)


def test_bad_sharding_in_hlo_names_the_line() -> None:
    hlo = "ENTRY %e (p: f32[4]) -> f32[4] {\n  ROOT %p = f32[4]{0} parameter(0), sharding={devices=[4]0,1}\n}\n"
    with pytest.raises(ShardingParseError, match=r"^line 2 of the HLO: .*has 4 tiles but 2 device ids"):
        parameter_shardings(hlo)


def test_split_hlo_modules_cuts_at_each_module_line() -> None:
    # XLA_SAVE_TENSORS_FILE style: marker lines between graphs.
    saved = "## BEGIN_GRAPH\n" + ANNOTATED_HLO + "## END_GRAPH\n\n## BEGIN_GRAPH\n" + VIEW_BUG_HLO + "## END_GRAPH\n"
    pieces = split_hlo_modules(saved)
    assert len(pieces) == 3  # the leading marker line is a piece of its own
    assert parameter_shardings(pieces[1])[0] == ROWS_4
    assert [c.has_sharding for c in sharding_custom_calls(pieces[2])] == [False, True]
    assert split_hlo_modules(VIEW_BUG_HLO) == [VIEW_BUG_HLO]


# --------------------------------------------------------------------------------------------
# StableHLO
# --------------------------------------------------------------------------------------------

STABLEHLO = r"""
module @IrToHlo.8 attributes {mhlo.cross_program_prefetches = [], mhlo.is_dynamic = false} {
  func.func @main(%arg0: tensor<16x32xf32> {mhlo.sharding = "{devices=[4,1]<=[4]}"}, %arg1: tensor<32xf32> {mhlo.sharding = ""}) -> tensor<16x32xf32> {
    %0 = stablehlo.custom_call @Sharding(%arg0) {mhlo.sharding = "{devices=[4,1]0,1,2,3 metadata={op_name=\22mark\22}}"} : (tensor<16x32xf32>) -> tensor<16x32xf32>
    %1 = stablehlo.custom_call @Sharding(%arg1) {mhlo.sharding = "{replicated}"} : (tensor<32xf32>) -> tensor<32xf32>
    return %0 : tensor<16x32xf32>
  }
}
"""


def test_stablehlo_shardings_in_order_with_escapes() -> None:
    assert stablehlo_shardings(STABLEHLO) == [ROWS_4, NoSharding(), ROWS_4, Replicated()]


def test_stablehlo_serialized_proto_is_a_parse_error_with_its_line() -> None:
    text = 'func.func @main(%arg0: tensor<4xf32> {mhlo.sharding = "\\08\\03\\1A\\01\\02"})'
    with pytest.raises(ShardingParseError, match="^line 1 of the StableHLO"):
        stablehlo_shardings(text)


def test_parse_sharding_accepts_an_attribute_copied_from_hlo() -> None:
    # What a case does when it keeps the raw attribute: both spellings agree.
    call = sharding_custom_calls(ANNOTATED_HLO)[0]
    assert parse_sharding("sharding=" + call.attribute("sharding")) == call.sharding


def _named_instructions(instructions) -> list[tuple[int, str, str]]:
    return [
        (i.line_number, i.name, i.opcode) for i in instructions if i.opcode.removesuffix("-start") in COLLECTIVE_OPCODES
    ]


@pytest.mark.parametrize(
    "hlo", [ANNOTATED_HLO, VIEW_BUG_HLO, PARTITIONED_HLO], ids=["annotated", "view-bug", "partitioned"]
)
def test_reading_only_the_lines_that_name_a_collective_finds_what_the_whole_parse_finds(hlo: str) -> None:
    whole = _named_instructions(parse_hlo(hlo).instructions)
    assert _named_instructions(instructions_naming(hlo, COLLECTIVE_OPCODES)) == whole


_FIXTURE_LINES = [line for text in (ANNOTATED_HLO, VIEW_BUG_HLO, PARTITIONED_HLO) for line in text.splitlines()]
_HEADERS = [line for line in _FIXTURE_LINES if line.rstrip().endswith("{") and "=" not in line.split("(", 1)[0]]
_BODY_LINES = [line for line in _FIXTURE_LINES if line not in _HEADERS and line.strip() not in ("}", "")]


@given(st.lists(st.tuples(st.sampled_from(_HEADERS), st.lists(st.sampled_from(_BODY_LINES), max_size=12)), max_size=4))
def test_any_module_of_these_lines_gives_the_same_collectives_both_ways(computations) -> None:
    """Computations of any of the fixtures' lines (metadata naming a collective, HloModule lines,
    async pairs, in any order): the same collective instructions (line, name, opcode) as parsing
    the whole text, as a multiset."""
    text = "\n".join(line for header, body in computations for line in (header, *body, "}"))
    whole = sorted(_named_instructions(parse_hlo(text).instructions))
    assert sorted(_named_instructions(instructions_naming(text, COLLECTIVE_OPCODES))) == whole


def test_a_modules_donations_and_entry_parameters_are_read_from_its_header_alone():
    from harness.hlo import donated_parameters, entry_parameter_count

    header = (
        "HloModule S, input_output_alias={ {1}: (1, {}, may-alias), {2}: (0, {1}, may-alias) }, "
        "buffer_donor={ (3, {}) }, entry_computation_layout={(f32[2]{0}, (f32[], s32[]), f32[2,32]{1,0}, "
        "f32[])->(f32[], f32[32,2]{1,0})}"
    )
    assert donated_parameters(header + "\nENTRY ...") == {(1, ""), (0, "1"), (3, "")}
    assert entry_parameter_count(header) == 4  # the tuple parameter counts once
    assert entry_parameter_count("HloModule m, entry_computation_layout={()->f32[]}") == 0
    assert entry_parameter_count("HloModule m") is None  # not said: not guessed
    with pytest.raises(HloParseError, match="not closed"):
        entry_parameter_count("HloModule m, entry_computation_layout={(f32[2]{0}, f32[]")
