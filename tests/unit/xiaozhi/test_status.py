"""The device status core: hello features, the MCP tool list, its pages and its bounds."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.xiaozhi.status import MAX_BYTES, MAX_TOOLS, Cut, Param, StatusBook, ToolSummary

DEV, OTHER, THIRD = "aa_bb_cc_dd_ee_01", "aa_bb_cc_dd_ee_02", "aa_bb_cc_dd_ee_03"
VOLUME = {
    "name": "self.audio_speaker.set_volume",
    "description": "Set the volume of the audio speaker.",
    "inputSchema": {
        "type": "object",
        "properties": {"volume": {"type": "integer", "minimum": 0, "maximum": 100}},
        "required": ["volume"],
    },
}


def tool(name: str, description: str = "", **props: Any) -> dict[str, Any]:
    return {"name": name, "description": description, "inputSchema": {"properties": props}}


def answer(tools: list[Any], cursor: str | None = None, rid: int = 2) -> dict[str, Any]:
    result: dict[str, Any] = {"tools": tools}
    if cursor is not None:
        result["nextCursor"] = cursor
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def names(book: StatusBook, dev: str = DEV) -> list[str]:
    record = book.get(dev)
    assert record is not None
    return [t.name for t in record.tools]


def test_hello_and_tools_kept_and_served_as_json() -> None:
    book = StatusBook(max_devices=4)
    assert book.hello(DEV, {"mcp": True, "aec": False}, 100.0) == Cut()
    assert book.mcp_answer(DEV, answer([VOLUME]), 101.5) == Cut()
    record = book.get(DEV)
    assert record is not None
    assert record.tools == (
        ToolSummary(
            "self.audio_speaker.set_volume",
            "Set the volume of the audio speaker.",
            (Param("volume", "integer", required=True),),
        ),
    )
    assert record.as_json() == {
        "features": {"aec": False, "mcp": True},
        "hello_at": 100.0,
        "mcp": {
            "tools": [
                {
                    "name": "self.audio_speaker.set_volume",
                    "description": "Set the volume of the audio speaker.",
                    "params": [{"name": "volume", "type": "integer", "required": True}],
                }
            ],
            "seen_at": 101.5,
            "complete": True,
            "cut": {"tools": 0, "text": 0},
            "bytes": record.tools[0].size,
        },
    }
    # a re-hello replaces the features and keeps the tools (the firmware's did not change)
    book.hello(DEV, {"mcp": False}, 200.0)
    record = book.get(DEV)
    assert record is not None
    assert (record.as_json()["features"], record.hello_at) == ({"mcp": False}, 200.0)
    assert names(book) == ["self.audio_speaker.set_volume"]
    assert book.get(OTHER) is None


@pytest.mark.parametrize(
    "payload",
    [
        {"jsonrpc": "2.0", "id": 1, "result": {"protocolVersion": "2024-11-05"}},  # initialize
        {"jsonrpc": "2.0", "id": 3, "result": {"content": [], "isError": False}},  # tools/call
        {"jsonrpc": "2.0", "id": 3, "error": {"message": "Unknown method"}},
        {"jsonrpc": "2.0", "id": 4, "result": "text"},
        {"jsonrpc": "2.0", "id": 5, "method": "tools/list", "result": {"tools": []}},
    ],
)
def test_other_answers_are_not_a_tool_list(payload: dict[str, Any]) -> None:
    book = StatusBook(max_devices=4)
    assert book.mcp_answer(DEV, payload, 1.0) is None
    assert book.get(DEV) is None  # nothing learnt, no record made


def test_pages_continue_at_the_cursor_and_anything_else_starts_over() -> None:
    book = StatusBook(max_devices=4)
    book.hello(DEV, {"mcp": True}, 1.0)
    book.mcp_answer(DEV, answer([tool("a"), tool("b")], cursor="c"), 2.0)
    record = book.get(DEV)
    assert record is not None
    assert record.as_json()["mcp"]["complete"] is False
    book.mcp_answer(DEV, answer([tool("c"), tool("d")]), 3.0)  # the page after "b"
    assert names(book) == ["a", "b", "c", "d"]
    record = book.get(DEV)
    assert record is not None
    assert (record.as_json()["mcp"]["complete"], record.tools_at) == (True, 3.0)
    # a fresh list (no cursor awaited): replaces, the hello stays
    book.mcp_answer(DEV, answer([tool("c")]), 4.0)
    assert names(book) == ["c"]
    # a page that is not the awaited one (another asker's first page) starts over
    book.mcp_answer(DEV, answer([tool("x")], cursor="y"), 5.0)
    book.mcp_answer(DEV, answer([tool("x")]), 6.0)
    assert names(book) == ["x"]
    book.mcp_answer(DEV, answer([tool("p")], cursor="q"), 7.0)
    book.mcp_answer(DEV, answer([]), 8.0)  # empty: a fresh, empty list
    assert names(book) == []
    record = book.get(DEV)
    assert record is not None
    assert record.hello_at == 1.0
    book.mcp_answer(DEV, answer([tool("z")], cursor=""), 9.0)  # an empty cursor: no more pages
    record = book.get(DEV)
    assert record is not None
    assert record.next_cursor is None


def test_tool_count_bound_cuts_and_counts() -> None:
    book = StatusBook(max_devices=1)
    cut = book.mcp_answer(DEV, answer([tool(f"t{i}") for i in range(MAX_TOOLS + 5)]), 1.0)
    assert cut == Cut(tools=5)
    assert len(names(book)) == MAX_TOOLS
    record = book.get(DEV)
    assert record is not None
    assert record.as_json()["mcp"]["cut"] == {"tools": 5, "text": 0}


def test_byte_bound_cuts_across_pages() -> None:
    book = StatusBook(max_devices=1)
    big = "x" * 500
    first = [tool(f"t{i:02}", big) for i in range(40)]
    cut = book.mcp_answer(DEV, answer(first, cursor="t40"), 1.0)
    assert cut is not None
    record = book.get(DEV)
    assert record is not None
    assert record.size <= MAX_BYTES
    assert record.size == sum(t.size for t in record.tools)
    assert len(record.tools) + cut.tools == 40
    assert cut.tools > 0
    kept = len(record.tools)
    second = book.mcp_answer(DEV, answer([tool("t40", big), tool("s")]), 2.0)
    # the big one does not fit any more, the small one still does
    assert second == Cut(tools=1)
    record = book.get(DEV)
    assert record is not None
    assert names(book)[-1] == "s"
    assert len(record.tools) == kept + 1
    assert record.tools_cut == cut.tools + 1  # counted over the list's pages
    assert record.size <= MAX_BYTES


def test_malformed_entries_are_cut_and_long_texts_shortened() -> None:
    book = StatusBook(max_devices=1)
    many = {f"p{i}": {"type": "string"} for i in range(40)}
    entries: list[Any] = [
        "not a tool",
        {"description": "no name"},
        {"name": ""},
        {"name": 7},
        {"name": "n" * 100, "description": "d" * 600},
        {"name": "schema-less", "description": 5, "inputSchema": "junk"},
        {"name": "bad-props", "inputSchema": {"properties": [], "required": "x"}},
        {
            "name": "typed",
            "inputSchema": {
                "properties": {
                    "u": {"type": ["string", "null", 3]},
                    "w": {"type": 5},
                    "v": "junk",
                    "k" * 70: {"type": "t" * 40},
                },
                "required": ["u", 3],
            },
        },
        tool("many", **many),
    ]
    cut = book.mcp_answer(DEV, answer(entries), 1.0)
    # shortened: the long name, its description, the long parameter's name and type, and the
    # parameter list of "many"
    assert cut == Cut(tools=4, text=5)
    record = book.get(DEV)
    assert record is not None
    long_tool, schema_less, bad_props, typed, many_tool = record.tools
    assert (len(long_tool.name), len(long_tool.description)) == (64, 512)
    assert (schema_less.description, schema_less.params) == ("", ())
    assert bad_props.params == ()
    assert typed.params == (
        Param("u", "string|null", required=True),
        Param("w", "", required=False),
        Param("v", "", required=False),
        Param("k" * 64, "t" * 32, required=False),
    )
    assert len(many_tool.params) == 32
    assert record.text_cut == 5


def test_devices_bounded_least_recently_heard_evicted_and_forgotten() -> None:
    book = StatusBook(max_devices=2)
    book.hello(DEV, {"mcp": True}, 1.0)
    book.hello(OTHER, {"mcp": True}, 2.0)
    book.mcp_answer(DEV, answer([tool("a")]), 3.0)  # DEV heard last: OTHER is the oldest
    assert book.hello(THIRD, {}, 4.0) == Cut(devices=1)
    assert (book.get(OTHER), len(book)) == (None, 2)
    assert names(book) == ["a"]
    cut = book.mcp_answer(OTHER, answer([tool("b")]), 5.0)  # a tool list alone makes a record
    assert cut == Cut(devices=1)
    assert book.get(DEV) is None
    record = book.get(OTHER)
    assert record is not None
    assert (record.features, record.hello_at) == ((), None)
    assert book.forget(OTHER)
    assert not book.forget(OTHER)
    assert len(book) == 1


@pytest.mark.parametrize(
    "bounds",
    [{"max_devices": 0}, {"max_devices": 1, "max_tools": 0}, {"max_devices": 1, "max_bytes": 0}],
)
def test_bounds_must_be_positive(bounds: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StatusBook(**bounds)
