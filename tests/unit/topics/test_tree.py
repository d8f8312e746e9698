"""Topic builders and parsers: every topic of SPEC §3, and every way a topic can be wrong."""

from __future__ import annotations

import pytest

from topics import (
    DELIVERY,
    Topic,
    TopicError,
    TopicKind,
    build_topic,
    build_xiaozhi_topic,
    gateway_filters,
    mac_colon,
    normalize_mac,
    parse_topic,
    parse_xiaozhi_topic,
    tree,
)

DEV = "aa_bb_cc_dd_ee_ff"
GW = "gw-1"

TOPICS = [
    (TopicKind.CMD, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/cmd"),
    (TopicKind.ACK, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/ack"),
    (TopicKind.RPT, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/rpt"),
    (TopicKind.EVT, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/evt"),
    (TopicKind.HB, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/hb"),
    (TopicKind.STATUS, DEV, None, "snlp/v1/aa_bb_cc_dd_ee_ff/status"),
    (TopicKind.CTL, DEV, None, "snlpgw/v1/ctl/aa_bb_cc_dd_ee_ff"),
    (TopicKind.REPLY, DEV, None, "snlpgw/v1/reply/aa_bb_cc_dd_ee_ff"),
    (TopicKind.TASK, DEV, None, "snlpgw/v1/task/aa_bb_cc_dd_ee_ff"),
    (TopicKind.ASSESSMENT, DEV, None, "snlpgw/v1/assessment/aa_bb_cc_dd_ee_ff"),
    (TopicKind.OPS_METRICS, None, GW, "snlpgw/v1/ops/gw-1/metrics"),
    (TopicKind.OPS_EVENTS, None, GW, "snlpgw/v1/ops/gw-1/events"),
    (TopicKind.GW_STATUS, None, GW, "snlpgw/v1/gw/gw-1/status"),
]


def test_table_covers_every_kind() -> None:
    assert {kind for kind, *_ in TOPICS} == set(TopicKind)
    assert set(DELIVERY) == set(TopicKind)
    retained = {kind for kind, d in DELIVERY.items() if d.retain}
    assert retained == {TopicKind.STATUS, TopicKind.OPS_METRICS, TopicKind.GW_STATUS}
    assert {kind for kind, d in DELIVERY.items() if d.qos == 0} == {
        TopicKind.HB,
        TopicKind.OPS_METRICS,
    }


@pytest.mark.parametrize(("kind", "dev", "gw", "name"), TOPICS)
def test_build_and_parse(kind: TopicKind, dev: str | None, gw: str | None, name: str) -> None:
    assert build_topic(kind, dev=dev, gw=gw) == name
    assert parse_topic(name) == Topic(kind, dev=dev, gw=gw)
    assert str(parse_topic(name)) == name


@pytest.mark.parametrize(
    "topic",
    [
        "",
        "snlp/v1/AA_BB_CC_DD_EE_FF/evt",  # uppercase id
        "snlp/v1/aa:bb:cc:dd:ee:ff/evt",  # colon MAC
        "snlp/v1/aa_bb_cc_dd_ee/evt",  # five octets
        "snlp/v1/aa_bb_cc_dd_ee_fg/evt",  # not hex
        "snlp/v1/aa_bb_cc_dd_ee_ff/evt/x",  # too many levels
        "snlp/v1/aa_bb_cc_dd_ee_ff",  # too few levels
        "snlp/v1/aa_bb_cc_dd_ee_ff/foo",  # unknown kind
        "snlp/v2/aa_bb_cc_dd_ee_ff/evt",  # unknown version
        "snlp/v1/+/evt",  # wildcard
        "snlp/v1/#",
        "snlpgw/v1/ctl/aa_bb_cc_dd_ee_ff/x",
        "snlpgw/v1/ctl/not-a-mac",
        "snlpgw/v1/foo/aa_bb_cc_dd_ee_ff",
        "snlpgw/v1/ops/gw-1/other",
        "snlpgw/v1/ops/bad gw/metrics",  # space in gateway id
        "snlpgw/v1/ops/" + "g" * 65 + "/metrics",  # gateway id too long
        "snlpgw/v1/gw//status",
        "snlpgw/v1/gw/gw-1/status/x",
        "device-server/aa_bb_cc_dd_ee_ff",  # Xiaozhi topics go through the template parser
        "snlp/v1/aa_bb_cc_dd_ee_ff/evt\x00",
    ],
)
def test_parse_rejects(topic: str) -> None:
    with pytest.raises(TopicError):
        parse_topic(topic)


@pytest.mark.parametrize(
    ("kind", "dev", "gw"),
    [
        (TopicKind.CMD, "AA_BB_CC_DD_EE_FF", None),
        (TopicKind.CMD, None, GW),
        (TopicKind.CMD, DEV, GW),
        (TopicKind.OPS_METRICS, DEV, None),
        (TopicKind.GW_STATUS, None, "a/b"),
        (TopicKind.TASK, "+", None),
    ],
)
def test_build_rejects(kind: TopicKind, dev: str | None, gw: str | None) -> None:
    with pytest.raises(TopicError):
        build_topic(kind, dev=dev, gw=gw)


@pytest.mark.parametrize(
    ("template", "topic"),
    [
        ("device-server/{dev}", "device-server/aa_bb_cc_dd_ee_ff"),
        ("devices/p2p/{dev}", "devices/p2p/aa_bb_cc_dd_ee_ff"),
        ("x/{dev}/up", "x/aa_bb_cc_dd_ee_ff/up"),
    ],
)
def test_xiaozhi_templates(template: str, topic: str) -> None:
    assert build_xiaozhi_topic(template, DEV) == topic
    assert parse_xiaozhi_topic(template, topic) == DEV


@pytest.mark.parametrize(
    ("template", "topic"),
    [
        ("device-server/{dev}", "device-server/aa_bb_cc_dd_ee"),
        ("device-server/{dev}", "device-server/aa_bb_cc_dd_ee_ff/x"),
        ("device-server/{dev}", "devices/p2p/aa_bb_cc_dd_ee_ff"),
        ("device-server/{dev}", "device-server/+"),
        ("device-server", "device-server"),  # template without {dev}
        ("a/{dev}/{dev}", "a/aa_bb_cc_dd_ee_ff/aa_bb_cc_dd_ee_ff"),
        ("a/x{dev}", "a/xaa_bb_cc_dd_ee_ff"),  # {dev} must be a whole level
        ("a/+/{dev}", "a/b/aa_bb_cc_dd_ee_ff"),
        ("a//{dev}", "a//aa_bb_cc_dd_ee_ff"),
    ],
)
def test_xiaozhi_template_rejects(template: str, topic: str) -> None:
    with pytest.raises(TopicError):
        parse_xiaozhi_topic(template, topic)


@pytest.mark.parametrize(
    ("mac", "dev"),
    [
        ("AA:BB:CC:DD:EE:FF", DEV),
        ("aa-bb-cc-dd-ee-ff", DEV),
        ("aa_bb_cc_dd_ee_ff", DEV),
        ("AABBCCDDEEFF", DEV),
        (" 01:23:45:67:89:ab\n", "01_23_45_67_89_ab"),
    ],
)
def test_normalize_mac(mac: str, dev: str) -> None:
    assert normalize_mac(mac) == dev
    assert mac_colon(dev) == dev.replace("_", ":")


@pytest.mark.parametrize(
    "mac", ["", "AA:BB:CC:DD:EE", "AA:BB-CC:DD:EE:FF", "GG:BB:CC:DD:EE:FF", "AA:BB:CC:DD:EE:FF:00"]
)
def test_normalize_mac_rejects(mac: str) -> None:
    with pytest.raises(TopicError):
        normalize_mac(mac)


def test_gateway_filters() -> None:
    assert gateway_filters("device-server/{dev}") == (
        "snlp/v1/+/ack",
        "snlp/v1/+/rpt",
        "snlp/v1/+/evt",
        "snlp/v1/+/hb",
        "snlp/v1/+/status",
        "snlpgw/v1/ctl/+",
        "device-server/+",
    )
    shared = gateway_filters("device-server/{dev}", share_group="gws")
    assert shared[0] == "$share/gws/snlp/v1/+/ack"
    assert all(f.startswith("$share/gws/") for f in shared)
    with pytest.raises(TopicError):
        gateway_filters("device-server/{dev}", share_group="a/b")


def test_topic_error_truncates_long_input() -> None:
    with pytest.raises(TopicError) as info:
        parse_topic("x" * 10_000)
    assert len(str(info.value)) < 300


def test_built_and_parsed_topics_are_remembered_and_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(tree, "TOPICS_KEPT", 2)
    devs = ["aa_bb_cc_dd_ee_01", "aa_bb_cc_dd_ee_02", "aa_bb_cc_dd_ee_03"]
    for dev in devs + devs:  # the third forgets the first two; each answer stays right
        name = build_topic(TopicKind.CMD, dev=dev)
        assert name == f"snlp/v1/{dev}/cmd"
        assert parse_topic(name) == Topic(TopicKind.CMD, dev=dev)
    assert len(tree._BUILT) <= 2
    assert len(tree._PARSED) <= 2
    with pytest.raises(TopicError):  # a refusal is never remembered: it is raised every time
        build_topic(TopicKind.CMD, dev="AA")
    with pytest.raises(TopicError):
        build_topic(TopicKind.CMD, dev="AA")
    for _ in range(2):
        with pytest.raises(TopicError):
            parse_topic("snlp/v1/AA/cmd")
