"""Tests for harness.sharding: parsing, formatting and comparing HLO sharding text."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.sharding import (
    SUBGROUP_TYPES,
    Manual,
    Maximal,
    NoSharding,
    Replicated,
    Sharding,
    ShardingParseError,
    Tiled,
    TupleSharding,
    Unknown,
    as_sharding,
    assert_sharding_equal,
    assert_tiled_along,
    canonical_text,
    format_sharding,
    iota_device_ids,
    is_replicated,
    is_tiled_along,
    num_shards,
    parse_sharding,
    tiled_dims,
)

pytestmark = pytest.mark.selftest


# --------------------------------------------------------------------------------------------
# Parsing: text -> value
# --------------------------------------------------------------------------------------------

PARSE_CASES = [
    # torch_xla's spec for a tensor nobody annotated.
    pytest.param("", NoSharding(), id="empty-spec"),
    pytest.param("{replicated}", Replicated(), id="replicated"),
    pytest.param("{manual}", Manual(), id="manual"),
    pytest.param("{unknown}", Unknown(), id="unknown"),
    pytest.param("{maximal device=3}", Maximal(3), id="maximal"),
    # FSDPv2 on 4 devices: rows split, columns whole.
    pytest.param("{devices=[4,1]0,1,2,3}", Tiled((4, 1), (0, 1, 2, 3)), id="tiled-rows"),
    # A 1-D tensor: torch_xla prints a single tile dimension.
    pytest.param("{devices=[4]0,1,2,3}", Tiled((4,), (0, 1, 2, 3)), id="tiled-1d"),
    # Device order is part of the sharding, not sorted away.
    pytest.param("{devices=[1,4]3,2,1,0}", Tiled((1, 4), (3, 2, 1, 0)), id="tiled-reversed-devices"),
    # Two row tiles, each replicated on a pair of devices.
    pytest.param(
        "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
        Tiled((2, 1, 2), (0, 1, 2, 3), ("replicated",)),
        id="partial-replication",
    ),
    # XLA canonicalises last_tile_dims={replicated} to last_tile_dim_replicate; so do we.
    pytest.param(
        "{devices=[2,1,2]0,1,2,3 last_tile_dims={replicated}}",
        Tiled((2, 1, 2), (0, 1, 2, 3), ("replicated",)),
        id="last-tile-dims-replicated-only",
    ),
    # shard_map style: a manual subgroup and a replicated one.
    pytest.param(
        "{devices=[1,1,2,2]0,1,2,3 last_tile_dims={manual, replicated}}",
        Tiled((1, 1, 2, 2), (0, 1, 2, 3), ("manual", "replicated")),
        id="subgroups-manual-replicated",
    ),
    # Iota form without transpose is just 0..n-1.
    pytest.param("{devices=[4,1]<=[4]}", Tiled((4, 1), (0, 1, 2, 3)), id="iota-plain"),
    # arange(4).reshape(2,2).T flattened.
    pytest.param("{devices=[2,2]<=[2,2]T(1,0)}", Tiled((2, 2), (0, 2, 1, 3)), id="iota-transposed"),
    # A 3-D reshape with a partial transpose, as JAX meshes produce.
    pytest.param(
        "{devices=[2,1,2,2]<=[2,2,2]T(1,0,2) last_tile_dims={manual,replicated}}",
        Tiled((2, 1, 2, 2), (0, 1, 4, 5, 2, 3, 6, 7), ("manual", "replicated")),
        id="iota-3d-transpose-subgroups",
    ),
    # A tuple-shaped value: one sharding per element.
    pytest.param(
        "{{replicated}, {devices=[2,1]0,1}}",
        TupleSharding((Replicated(), Tiled((2, 1), (0, 1)))),
        id="tuple",
    ),
    # The empty tuple (a tuple shape with no elements).
    pytest.param("{}", TupleSharding(()), id="empty-tuple"),
    # Metadata is provenance, not layout: dropped, even with an unbalanced brace inside a string.
    pytest.param(
        '{devices=[2,1]0,1 metadata={op_type="xla__custom_sharding" op_name="a}b" source_line=3}}',
        Tiled((2, 1), (0, 1)),
        id="tiled-with-metadata",
    ),
    pytest.param('{replicated metadata={op_name="fc"}}', Replicated(), id="replicated-with-metadata"),
    # Metadata on each tuple element.
    pytest.param(
        '{{replicated metadata={op_name="x"}}, {maximal device=1 metadata={op_name="y"}}}',
        TupleSharding((Replicated(), Maximal(1))),
        id="tuple-elements-with-metadata",
    ),
    # An attribute pasted as it appears in HLO, with whitespace around it.
    pytest.param("  sharding={devices=[2]0,1}\n", Tiled((2,), (0, 1)), id="attribute-prefix-and-spaces"),
    # Sharding groups say which tensors must match, not how this one is laid out: dropped.
    pytest.param("{devices=[2,1]0,1 shard_as 1}", Tiled((2, 1), (0, 1)), id="shard-as-group"),
]


@pytest.mark.parametrize(("text", "expected"), PARSE_CASES)
def test_parse_sharding(text: str, expected: Sharding) -> None:
    assert parse_sharding(text) == expected


FORMAT_CASES = [
    # '' is what torch_xla returns for "no annotation"; keep that spelling.
    pytest.param(NoSharding(), "", id="no-sharding"),
    pytest.param(Replicated(), "{replicated}", id="replicated"),
    pytest.param(Maximal(0), "{maximal device=0}", id="maximal"),
    # Explicit device lists, as torch_xla prints them.
    pytest.param(Tiled((4, 1), (0, 1, 2, 3)), "{devices=[4,1]0,1,2,3}", id="tiled"),
    # A lone replicated subgroup uses XLA's short spelling.
    pytest.param(
        Tiled((2, 2), (0, 1, 2, 3), ("replicated",)),
        "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}",
        id="partial-replication",
    ),
    # Several subgroups use last_tile_dims with XLA's ", " separator.
    pytest.param(
        Tiled((1, 2, 2), (0, 1, 2, 3), ("manual", "replicated")),
        "{devices=[1,2,2]0,1,2,3 last_tile_dims={manual, replicated}}",
        id="subgroups",
    ),
    pytest.param(
        TupleSharding((Replicated(), Tiled((2, 1), (0, 1)))),
        "{{replicated}, {devices=[2,1]0,1}}",
        id="tuple",
    ),
]


@pytest.mark.parametrize(("value", "expected_text"), FORMAT_CASES)
def test_format_sharding(value: Sharding, expected_text: str) -> None:
    assert format_sharding(value) == expected_text
    assert str(value) == expected_text


EQUIVALENT_SPELLINGS = [
    # The iota form XLA prints vs the explicit list torch_xla prints.
    pytest.param("{devices=[4,1]<=[4]}", "{devices=[4,1]0,1,2,3}", id="iota-vs-explicit"),
    pytest.param("{devices=[2,2]<=[2,2]T(1,0)}", "{devices=[2,2]0,2,1,3}", id="transposed-iota-vs-explicit"),
    # An identity transpose is the same as none.
    pytest.param("{devices=[2,2]<=[2,2]T(0,1)}", "{devices=[2,2]<=[4]}", id="identity-transpose"),
    pytest.param(
        "{devices=[2,1,2]0,1,2,3 last_tile_dims={replicated}}",
        "{devices=[2,1,2]<=[4] last_tile_dim_replicate}",
        id="replicate-spellings",
    ),
    pytest.param('{replicated metadata={op_name="a"}}', "{replicated}", id="metadata-ignored"),
    pytest.param("{ devices=[4] 0, 1, 2, 3 }", "{devices=[4]0,1,2,3}", id="whitespace-ignored"),
]


@pytest.mark.parametrize(("left", "right"), EQUIVALENT_SPELLINGS)
def test_equivalent_spellings_compare_equal(left: str, right: str) -> None:
    assert parse_sharding(left) == parse_sharding(right)
    assert hash(parse_sharding(left)) == hash(parse_sharding(right))


DIFFERENT_SHARDINGS = [
    # Bug 2b in one line: no annotation is not the same as replicated.
    pytest.param("", "{replicated}", id="unannotated-vs-replicated"),
    # Same tiles, different device placement.
    pytest.param("{devices=[2,2]<=[2,2]T(1,0)}", "{devices=[2,2]0,1,2,3}", id="transpose-matters"),
    pytest.param("{devices=[4,1]0,1,2,3}", "{devices=[1,4]0,1,2,3}", id="rows-vs-columns"),
    pytest.param("{devices=[2,2]0,1,2,3}", "{devices=[2,2]0,1,2,3 last_tile_dim_replicate}", id="tiled-vs-partial"),
    pytest.param("{{replicated}}", "{replicated}", id="one-tuple-vs-single"),
]


@pytest.mark.parametrize(("left", "right"), DIFFERENT_SHARDINGS)
def test_different_shardings_compare_unequal(left: str, right: str) -> None:
    assert parse_sharding(left) != parse_sharding(right)


# The one text the sharding baseline keeps and hosts and release columns are compared by
# (harness.judges.baseline, harness.gke.aggregate, harness.matrix.shardingchanges): these are its rules.
CANONICAL_TEXTS = [
    pytest.param("{devices=[4,1]0,1,2,3}", "{devices=[4,1]0,1,2,3}", id="canonical-stays"),
    pytest.param("{devices=[2,2]<=[2,2]T(1,0)}", "{devices=[2,2]0,2,1,3}", id="iota-spelled-out"),
    pytest.param('{devices=[4,1]0,1,2,3 metadata={op_name="a"}}', "{devices=[4,1]0,1,2,3}", id="metadata-dropped"),
    pytest.param("{devices=[4,1]0,1,2,3 shard_as 1}", "{devices=[4,1]0,1,2,3}", id="sharding-group-dropped"),
    pytest.param(
        "{devices=[2,1,2]<=[4] last_tile_dims={replicated}}",
        "{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}",
        id="replicate-spelling",
    ),
    pytest.param("  { devices=[4] 0, 1, 2, 3 }", "{devices=[4]0,1,2,3}", id="spaces-between-tokens"),
    pytest.param("", "", id="no-annotation-stays-empty"),  # not {replicated}: that is bug 2b
    pytest.param("[Replicate(), Shard(dim=0)]", "[Replicate(), Shard(dim=0)]", id="placements-kept"),
    pytest.param(" [Replicate(),\n  Shard(dim=0)] ", "[Replicate(), Shard(dim=0)]", id="other-text-spaces-folded"),
    pytest.param("{mesh[x=4], [{x}]}", "{mesh[x=4], [{x}]}", id="shardy-kept-as-text"),
]


@pytest.mark.parametrize(("text", "canonical"), CANONICAL_TEXTS)
def test_canonical_text(text: str, canonical: str) -> None:
    assert canonical_text(text) == canonical
    assert canonical_text(canonical) == canonical  # a canonical text is its own canonical text


@pytest.mark.parametrize(("left", "right"), DIFFERENT_SHARDINGS)
def test_different_shardings_keep_different_canonical_texts(left: str, right: str) -> None:
    assert canonical_text(left) != canonical_text(right)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------

BAD_TEXT = [
    # (text, a fragment the message must contain to tell the reader what was expected)
    pytest.param("replicated", "expected '{' opening the sharding", id="missing-braces"),
    pytest.param("{", "expected one of 'replicated'", id="unterminated"),
    pytest.param("{replicated", "'}' closing the sharding", id="missing-close"),
    pytest.param("{foo}", "expected one of 'replicated'", id="unknown-keyword"),
    pytest.param("{replicatedx}", "expected one of 'replicated'", id="keyword-prefix-only"),
    pytest.param("{replicated} trailing", "end of text", id="trailing-text"),
    pytest.param("{maximal}", "'device=' after 'maximal'", id="maximal-without-device"),
    pytest.param("{devices=4,1 0,1}", "'[' opening the tile assignment dimensions", id="dims-without-brackets"),
    pytest.param("{devices=[4,1]}", "a device id or '<='", id="no-devices"),
    # Counts are checked, with both numbers in the message.
    pytest.param("{devices=[4,1]0,1,2}", "has 4 tiles but 3 device ids", id="too-few-devices"),
    pytest.param("{devices=[2]0,0}", "distinct", id="duplicate-devices"),
    pytest.param("{devices=[0]}", "a device id", id="zero-tiles-no-devices"),
    pytest.param("{devices=[2,2]<=[3]}", "iota <=[3] has 3 devices", id="iota-size-mismatch"),
    pytest.param("{devices=[2,2]<=[2,2]T(0,0)}", "not a permutation", id="iota-bad-permutation"),
    pytest.param("{devices=[2,2]<=[2,2]T(0)}", "not a permutation", id="iota-short-permutation"),
    # A typo must not make the parser expand a billion-device iota.
    pytest.param("{devices=[999999999]<=[999999999]}", "more devices than", id="iota-absurdly-large"),
    pytest.param("{devices=[2]0,1 last_tile_dims={bogus}}", "a subgroup type", id="unknown-subgroup-type"),
    pytest.param("{devices=[1,2,2]0,1,2,3 last_tile_dims={manual, manual}}", "distinct", id="repeated-subgroup-type"),
    pytest.param(
        "{devices=[2]0,1 last_tile_dims={manual, replicated}}", "2 subgroup types for only 1", id="too-many-subgroups"
    ),
    # Subgroups only make sense on a tiled sharding.
    pytest.param("{replicated last_tile_dim_replicate}", "'metadata={...}' or '}'", id="subgroup-on-replicated"),
    pytest.param('{devices=[2]0,1 metadata={op_name="x}', "closing", id="unterminated-metadata"),
    pytest.param("{{replicated},}", "'{' opening a tuple element", id="tuple-trailing-comma"),
    pytest.param("{{replicated} {manual}}", "',' or '}' after a tuple element", id="tuple-missing-comma"),
    # Shardy's named shardings are another language; say so rather than "expected replicated".
    pytest.param('{mesh["a"=2], [{"a"}]}', "named (Shardy)", id="shardy-named-sharding"),
]


@pytest.mark.parametrize(("text", "expected_fragment"), BAD_TEXT)
def test_bad_text_raises_sharding_parse_error(text: str, expected_fragment: str) -> None:
    with pytest.raises(ShardingParseError) as caught:
        parse_sharding(text)
    message = str(caught.value)
    assert repr(text) in message  # the message quotes the offending text
    assert expected_fragment in message
    assert isinstance(caught.value, ValueError)
    assert caught.value.text == text


def test_parse_error_carries_position_and_context() -> None:
    with pytest.raises(ShardingParseError) as caught:
        parse_sharding("{devices=[2]0,x}", where="line 7 of the HLO")
    assert caught.value.position == 14
    assert str(caught.value).startswith("line 7 of the HLO: ")


def test_non_string_input_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="must be a str"):
        parse_sharding(None)  # type: ignore[arg-type]  # the wrong type under test


INVALID_VALUES = [
    # (constructor call, fragment of the ValueError)
    pytest.param(lambda: Tiled((4, 1), (0, 1, 2)), "4 tiles but 3 device ids", id="tile-count"),
    pytest.param(lambda: Tiled((), ()), "at least one tile dimension", id="no-dims"),
    pytest.param(lambda: Tiled((2,), (0, -1)), ">= 0", id="negative-device"),
    pytest.param(lambda: Tiled((2,), (0, 1), ("sideways",)), "unknown subgroup type", id="bad-subgroup"),
    pytest.param(lambda: Maximal(-1), ">= 0", id="negative-maximal"),
    pytest.param(lambda: TupleSharding((NoSharding(),)), "cannot be NoSharding", id="unannotated-tuple-element"),
]


@pytest.mark.parametrize(("build", "fragment"), INVALID_VALUES)
def test_invalid_values_are_rejected_at_construction(build, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        build()


# --------------------------------------------------------------------------------------------
# Questions a case asks
# --------------------------------------------------------------------------------------------

REPLICATED_QUESTIONS = [
    pytest.param("{replicated}", True, id="replicated"),
    # Every data dimension whole, the only subgroup replicated: every device has everything.
    pytest.param("{devices=[1,1,4]0,1,2,3 last_tile_dim_replicate}", True, id="trivially-partial"),
    pytest.param("{devices=[1]0}", True, id="single-tile"),
    # No annotation is deliberately not "replicated" (bug 2b tells them apart).
    pytest.param("", False, id="unannotated"),
    pytest.param("{devices=[4,1]0,1,2,3}", False, id="tiled"),
    pytest.param("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", False, id="partially-replicated"),
    pytest.param("{devices=[1,1,4]0,1,2,3 last_tile_dims={manual}}", False, id="manual-subgroup"),
    pytest.param("{maximal device=0}", False, id="maximal"),
    pytest.param("{manual}", False, id="manual"),
    pytest.param("{{replicated}, {replicated}}", True, id="tuple-all-replicated"),
    pytest.param("{{replicated}, {devices=[2]0,1}}", False, id="tuple-one-tiled"),
]


@pytest.mark.parametrize(("text", "expected"), REPLICATED_QUESTIONS)
def test_is_replicated(text: str, expected: bool) -> None:
    assert is_replicated(text) is expected


TILED_DIMS = [
    pytest.param("{devices=[4,1]0,1,2,3}", {0: 4}, id="rows"),
    pytest.param("{devices=[1,4]0,1,2,3}", {1: 4}, id="columns"),
    pytest.param("{devices=[2,2]<=[4]}", {0: 2, 1: 2}, id="both"),
    # The replicated subgroup dimension is not a tensor dimension.
    pytest.param("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", {0: 2}, id="partial"),
    pytest.param("{replicated}", {}, id="replicated"),
    pytest.param("", {}, id="unannotated"),
]


@pytest.mark.parametrize(("text", "expected"), TILED_DIMS)
def test_tiled_dims(text: str, expected: dict[int, int]) -> None:
    assert tiled_dims(text) == expected


TILED_ALONG = [
    # (spec, dim, devices, expected)
    pytest.param("{devices=[4,1]0,1,2,3}", 0, 4, True, id="fsdp-weight-rows"),
    pytest.param("{devices=[4,1]<=[4]}", 0, 4, True, id="iota-rows"),
    pytest.param("{devices=[4,1]0,1,2,3}", -2, 4, True, id="negative-dim"),
    pytest.param("{devices=[4,1]0,1,2,3}", 1, 4, False, id="wrong-dim"),
    pytest.param("{devices=[4,1]0,1,2,3}", 0, 2, False, id="wrong-count"),
    # Out of the tensor's rank: a plain "no", not an exception.
    pytest.param("{devices=[4]0,1,2,3}", 1, 4, False, id="dim-past-rank"),
    pytest.param("{devices=[4]0,1,2,3}", 0, 4, True, id="1d"),
    # The subgroup dimension is not a tensor dimension.
    pytest.param("{devices=[2,2]0,1,2,3 last_tile_dim_replicate}", 1, 2, False, id="subgroup-dim"),
    pytest.param("{replicated}", 0, 1, False, id="replicated"),
    pytest.param("", 0, 4, False, id="unannotated"),
]


@pytest.mark.parametrize(("text", "dim", "devices", "expected"), TILED_ALONG)
def test_is_tiled_along(text: str, dim: int, devices: int, expected: bool) -> None:
    assert is_tiled_along(text, dim, devices) is expected


NUM_SHARDS = [
    pytest.param("{devices=[4,1]0,1,2,3}", 4, id="four-rows"),
    pytest.param("{devices=[2,2]<=[2,2]T(1,0)}", 4, id="grid"),
    # Two pieces, each on two devices.
    pytest.param("{devices=[2,1,2]0,1,2,3 last_tile_dim_replicate}", 2, id="partial"),
    pytest.param("{replicated}", 1, id="replicated"),
    pytest.param("{maximal device=2}", 1, id="maximal"),
    pytest.param("", 1, id="unannotated"),
]


@pytest.mark.parametrize(("text", "expected"), NUM_SHARDS)
def test_num_shards(text: str, expected: int) -> None:
    assert num_shards(text) == expected


@pytest.mark.parametrize("text", ["{manual}", "{unknown}"])
def test_num_shards_has_no_answer_for_unknown_layouts(text: str) -> None:
    with pytest.raises(ValueError, match="does not say how the data is cut"):
        num_shards(text)


@pytest.mark.parametrize("helper", [tiled_dims, num_shards, lambda s: is_tiled_along(s, 0, 2)])
def test_single_tensor_helpers_reject_tuples(helper) -> None:
    with pytest.raises(TypeError, match=r"pick one with \.elements\[i\]"):
        helper("{{replicated}, {devices=[2]0,1}}")


def test_as_sharding_accepts_values_and_rejects_other_types() -> None:
    value = Tiled((2,), (0, 1))
    assert as_sharding(value) is value
    assert as_sharding("{devices=[2]<=[2]}") == value
    with pytest.raises(TypeError, match="expected sharding text or a sharding value"):
        as_sharding(42)  # type: ignore[arg-type]  # the wrong type under test


def test_assert_sharding_equal_passes_for_iota_vs_explicit() -> None:
    assert_sharding_equal("{devices=[4,1]0,1,2,3}", "{devices=[4,1]<=[4]}", context="fc.weight")


def test_assert_sharding_equal_message_shows_both_in_hlo_syntax() -> None:
    with pytest.raises(AssertionError) as caught:
        assert_sharding_equal("{replicated}", parse_sharding("{devices=[4,1]<=[4]}"), context="fc.weight")
    assert str(caught.value) == (
        "sharding mismatch for fc.weight\n  expected: {devices=[4,1]0,1,2,3}\n  actual:   {replicated}"
    )


def test_assert_sharding_equal_names_the_empty_spec() -> None:
    with pytest.raises(AssertionError, match=r"actual:   '' \(no sharding annotation\)"):
        assert_sharding_equal("", "{replicated}")


def test_assert_tiled_along_passes_and_fails_readably() -> None:
    assert_tiled_along("{devices=[4,1]0,1,2,3}", 0, 4, context="fc.weight")
    with pytest.raises(AssertionError) as caught:
        assert_tiled_along("{devices=[1,4]0,1,2,3}", 0, 4, context="fc.weight")
    assert str(caught.value) == (
        "expected fc.weight to be tiled along dim 0 over 4 devices, "
        "got {devices=[1,4]0,1,2,3} (dimensions cut: dim 1 in 4)"
    )


def test_assert_tiled_along_on_a_tuple_fails_without_crashing() -> None:
    with pytest.raises(AssertionError, match=r"got \{\{replicated\}\}$"):
        assert_tiled_along("{{replicated}}", 0, 2)


def test_values_are_immutable() -> None:
    value = Tiled((2,), (0, 1))
    with pytest.raises(AttributeError):
        value.devices = (1, 0)  # type: ignore[misc]  # the frozen assignment under test


# --------------------------------------------------------------------------------------------
# Properties
# --------------------------------------------------------------------------------------------


@st.composite
def tiled_shardings(draw: st.DrawFn) -> Tiled:
    rank = draw(st.integers(min_value=1, max_value=4))
    tile_dims = tuple(draw(st.lists(st.integers(1, 4), min_size=rank, max_size=rank)))
    devices = tuple(draw(st.permutations(range(math.prod(tile_dims)))))
    subgroup_count = draw(st.integers(0, min(2, rank)))
    subgroup_types = draw(
        st.lists(st.sampled_from(SUBGROUP_TYPES), min_size=subgroup_count, max_size=subgroup_count, unique=True)
    )
    return Tiled(tile_dims, devices, tuple(subgroup_types))


single_shardings = st.one_of(
    st.just(Replicated()),
    st.just(Manual()),
    st.just(Unknown()),
    st.builds(Maximal, st.integers(0, 4096)),
    tiled_shardings(),
)

any_annotated_sharding = st.recursive(
    single_shardings,
    lambda children: st.lists(children, max_size=4).map(lambda items: TupleSharding(tuple(items))),
    max_leaves=6,
)

any_sharding = st.one_of(st.just(NoSharding()), any_annotated_sharding)


@given(any_sharding)
def test_format_then_parse_round_trips(value: Sharding) -> None:
    text = format_sharding(value)
    assert parse_sharding(text) == value
    assert format_sharding(parse_sharding(text)) == text  # formatting is canonical


@given(tiled_shardings(), st.sampled_from(['op_name="fc"', 'op_name="x}y" source_line=12', ""]))
def test_metadata_never_changes_the_value(value: Tiled, metadata_body: str) -> None:
    text = format_sharding(value)
    with_metadata = text[:-1] + " metadata={" + metadata_body + "}}"
    assert parse_sharding(with_metadata) == value


def explicit_iota_devices(reshape_dims: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    """The test's own reading of `<=[reshape_dims]T(perm)`, done differently from the module.

    Device i sits at coordinates coords(i) of the reshaped array; after transposing, its
    coordinates are coords(i) permuted by `perm`; flattening is row-major, i.e. sorting ids by
    their transposed coordinates.
    """

    def coords(device: int) -> tuple[int, ...]:
        digits = []
        for size in reversed(reshape_dims):
            device, digit = divmod(device, size)
            digits.append(digit)
        return tuple(reversed(digits))

    return tuple(sorted(range(math.prod(reshape_dims)), key=lambda d: tuple(coords(d)[axis] for axis in perm)))


@st.composite
def iota_forms(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """(tile_dims, reshape_dims, perm) with prod(tile_dims) == prod(reshape_dims)."""
    reshape_dims = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=4)))
    perm = tuple(draw(st.permutations(range(len(reshape_dims)))))
    # Tile dims: any factorisation of the same device count, built by splitting its prime factors.
    remaining = math.prod(reshape_dims)
    tile_dims = []
    for _ in range(draw(st.integers(0, 2))):
        divisors = [d for d in range(1, remaining + 1) if remaining % d == 0]
        tile_dims.append(draw(st.sampled_from(divisors)))
        remaining //= tile_dims[-1]
    tile_dims.append(remaining)
    return tuple(tile_dims), reshape_dims, perm


@given(iota_forms(), st.booleans())
def test_iota_form_equals_its_explicit_device_list(form, write_identity_transpose: bool) -> None:
    tile_dims, reshape_dims, perm = form
    transpose = f"T({','.join(map(str, perm))})"
    if perm == tuple(range(len(perm))) and not write_identity_transpose:
        transpose = ""  # XLA omits an identity transpose; both spellings must work
    iota_text = f"{{devices=[{','.join(map(str, tile_dims))}]<=[{','.join(map(str, reshape_dims))}]{transpose}}}"
    expected_devices = explicit_iota_devices(reshape_dims, perm)
    explicit_text = f"{{devices=[{','.join(map(str, tile_dims))}]{','.join(map(str, expected_devices))}}}"

    assert parse_sharding(iota_text) == parse_sharding(explicit_text)
    assert iota_device_ids(reshape_dims, perm) == expected_devices


def test_explicit_iota_helper_agrees_with_a_hand_worked_example() -> None:
    # Guards the property above against a helper that is wrong in the same way as the module:
    # arange(8).reshape(2,2,2).transpose(1,0,2).flatten(), worked out by hand.
    assert explicit_iota_devices((2, 2, 2), (1, 0, 2)) == (0, 1, 4, 5, 2, 3, 6, 7)


@given(any_annotated_sharding, st.data())
def test_every_proper_prefix_is_a_parse_error(value: Sharding, data: st.DataObject) -> None:
    text = format_sharding(value)
    # Any non-empty proper prefix lacks the outermost closing brace ('' alone means NoSharding).
    cut = data.draw(st.integers(1, len(text) - 1))
    with pytest.raises(ShardingParseError):
        parse_sharding(text[:cut])


@given(st.text(alphabet='{}[]<=,T() 0123456789abcdeilmnoprstuvx_"', max_size=40))
def test_arbitrary_text_parses_or_raises_sharding_parse_error(text: str) -> None:
    try:
        value = parse_sharding(text)
    except ShardingParseError as error:
        assert repr(text) in str(error)
    else:
        # Whatever parsed must survive a round trip through the canonical text.
        assert parse_sharding(format_sharding(value)) == value
