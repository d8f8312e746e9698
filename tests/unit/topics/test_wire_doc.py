"""docs/wire.md's topic table: one row per topic of the tree, with the QoS and retain flag the
code publishes with (``topics.tree.DELIVERY``)."""

from __future__ import annotations

import re
from pathlib import Path

from topics.tree import DELIVERY, XIAOZHI_DELIVERY, TopicKind, build_topic

DOC = Path(__file__).parents[3] / "docs" / "wire.md"
ROW = re.compile(r"^\| `(?P<topic>[^`]+)` \| [^|]+ \| (?P<qos>[012]) \| (?P<retained>yes|no) \|$")


def _rows() -> dict[str, tuple[int, bool]]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if m := ROW.match(line):
            rows[m["topic"]] = (int(m["qos"]), m["retained"] == "yes")
    return rows


def _template(kind: TopicKind) -> str:
    try:
        return build_topic(kind, dev="aa_bb_cc_dd_ee_ff").replace("aa_bb_cc_dd_ee_ff", "{dev}")
    except (TypeError, ValueError):
        return build_topic(kind, gw="gw1").replace("/gw1/", "/{gw}/")


def test_every_topic_has_its_row_with_the_codes_delivery() -> None:
    rows = _rows()
    expected = {_template(k): (d.qos, d.retain) for k, d in DELIVERY.items()}
    assert rows == expected


def test_the_xiaozhi_qos_is_the_codes() -> None:
    text = DOC.read_text(encoding="utf-8")
    assert XIAOZHI_DELIVERY.qos == 0
    assert not XIAOZHI_DELIVERY.retain
    assert "`devices/p2p/{dev}` (gateway → device) at QoS 0" in text
