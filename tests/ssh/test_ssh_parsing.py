"""Parsers of node command output: real-format samples, malformed input, and round trips."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodewarden.ssh.facts import Inhibitor
from nodewarden.ssh.parsing import (
    OutputError,
    WakeOnLanUnreadable,
    parse_busctl_inhibitors,
    parse_ethtool_wol,
    parse_runner_list,
    parse_runner_pid,
    parse_runner_status,
    parse_systemd_inhibit_list,
    parse_telemetry,
)
from nodewarden_doubles.stubworker import render

UUID_A = "zzzzz-dz642-aaaaaaaaaaaaaaa"
UUID_B = "0f8fad5b-d9cb-469f-a165-70867728950e"

# systemd 252's table layout, written by hand for this test (names and widths invented).
SYSTEMD_TABLE = """\
WHO                          UID  USER  PID  COMM            WHAT                    WHY                                  MODE
NetworkManager               0    root  612  NetworkManager  sleep                   NetworkManager needs to turn off net delay
backup job nightly           0    root  4711 systemd-inhibit shutdown:sleep          pg_basebackup in progress            block
ModemManager                 0    root  655  ModemManager    sleep                   ModemManager needs to reset devices  delay

3 inhibitors listed.
"""

# The pre-table format of old systemd releases.
SYSTEMD_BLOCKS = """\
     Who: backup (UID 0/root, PID 4711/systemd-inhibit)
    What: shutdown:idle
     Why: nightly dump
    Mode: block

     Who: NetworkManager (UID 0/root, PID 612/NetworkManager)
    What: sleep
     Why: NetworkManager needs to turn off networks
    Mode: delay

2 inhibitors listed.
"""


def test_busctl_reply_is_parsed_into_inhibitors() -> None:
    text = json.dumps(
        {
            "type": "a(ssssuu)",
            "data": [
                [
                    ["shutdown:sleep", "backup", "pg_basebackup in progress", "block", 0, 4711],
                    ["sleep", "NetworkManager", "turn off networks", "delay", 0, 612],
                ]
            ],
        }
    )
    found = parse_busctl_inhibitors(text)
    assert found[0] == Inhibitor(
        what=("shutdown", "sleep"),
        who="backup",
        why="pg_basebackup in progress",
        mode="block",
        uid=0,
        pid=4711,
    )
    assert found[0].blocks_shutdown
    assert not found[1].blocks_shutdown  # delay mode, and sleep only


def test_busctl_empty_array_means_no_inhibitors() -> None:
    assert parse_busctl_inhibitors('{"type":"a(ssssuu)","data":[[]]}') == ()


@pytest.mark.parametrize(
    "text",
    [
        "",
        "not json",
        '{"type":"as","data":[[]]}',
        '{"type":"a(ssssuu)","data":[]}',
        '{"type":"a(ssssuu)","data":[[["shutdown","who","why","block",0]]]}',
        '{"type":"a(ssssuu)","data":[[["shutdown","who","why","block","0",1]]]}',
    ],
)
def test_busctl_malformed_output_is_an_error_not_none(text: str) -> None:
    with pytest.raises(OutputError):
        parse_busctl_inhibitors(text)


def test_systemd_inhibit_table_is_parsed_with_spaces_in_who_and_why() -> None:
    found = parse_systemd_inhibit_list(SYSTEMD_TABLE)
    assert [i.who for i in found] == ["NetworkManager", "backup job nightly", "ModemManager"]
    backup = found[1]
    assert backup.what == ("shutdown", "sleep")
    assert backup.why == "pg_basebackup in progress"
    assert (backup.mode, backup.uid, backup.pid) == ("block", 0, 4711)
    assert [i.blocks_shutdown for i in found] == [False, True, False]


def test_systemd_inhibit_old_block_format_is_parsed() -> None:
    found = parse_systemd_inhibit_list(SYSTEMD_BLOCKS)
    assert len(found) == 2
    assert found[0].who == "backup"
    assert (found[0].uid, found[0].pid) == (0, 4711)
    assert found[0].what == ("shutdown", "idle")
    assert found[0].blocks_shutdown
    assert found[1].mode == "delay"


@pytest.mark.parametrize("text", ["", "\n", "No inhibitors.\n", "0 inhibitors listed.\n"])
def test_systemd_inhibit_empty_listing_means_none(text: str) -> None:
    assert parse_systemd_inhibit_list(text) == ()


def test_systemd_inhibit_unrecognised_text_is_an_error() -> None:
    with pytest.raises(OutputError):
        parse_systemd_inhibit_list("Failed to connect to bus: No such file or directory\n")


def test_truncated_block_lock_is_treated_as_blocking_shutdown() -> None:
    text = (
        "WHO    UID USER PID COMM  WHAT        WHY    MODE\n"
        "backup 0   root 1   sh    idle:slee…  dump   block\n"
    )
    (found,) = parse_systemd_inhibit_list(text)
    assert found.truncated
    assert found.blocks_shutdown


@pytest.mark.parametrize(
    ("supported", "enabled", "want_supported", "want_enabled"),
    [
        ("pumbg", "g", set("pumbg"), {"g"}),
        ("pumbg", "d", set("pumbg"), set()),
        ("g", "g", {"g"}, {"g"}),
        ("d", "d", set(), set()),
    ],
)
def test_ethtool_wake_on_lan_lines(
    supported: str, enabled: str, want_supported: set[str], want_enabled: set[str]
) -> None:
    text = render.ethtool("eth0", supported, enabled, permission_denied=False)
    assert parse_ethtool_wol(text) == (frozenset(want_supported), frozenset(want_enabled))


def test_ethtool_without_wake_on_lines_means_unsupported() -> None:
    text = render.ethtool("eth0", "", "", permission_denied=False)
    assert "Wake-on" not in text
    assert parse_ethtool_wol(text) == (frozenset(), frozenset())


def test_ethtool_permission_error_is_unknown_not_unsupported() -> None:
    text = render.ethtool("eth0", "pumbg", "g", permission_denied=True)
    with pytest.raises(WakeOnLanUnreadable):
        parse_ethtool_wol(text)


def test_ethtool_garbage_is_an_error() -> None:
    with pytest.raises(OutputError):
        parse_ethtool_wol("netlink error: no device matches name (offset 24)\n")
    with pytest.raises(OutputError):
        parse_ethtool_wol("Settings for eth0:\n\tWake-on: xyz\n")


def test_runner_list_lines() -> None:
    runners = parse_runner_list(f"2001 {UUID_A}\n\n2002 {UUID_B}\n")
    assert [(r.pid, r.uuid) for r in runners] == [(2001, UUID_A), (2002, UUID_B)]
    assert parse_runner_list("") == ()


def test_runner_list_lines_report_their_owner_when_recorded() -> None:
    uid = "3f0c7a52-9d1e-4b8a-9c57-0d9e1f2a3b4c"
    text = (
        f"2001 {UUID_A} dispatcher=alpha uid={uid} fence=60473304\n"
        f"2002 {UUID_B}\n"  # an older runner, or a run started without an owner
        f"2003 zzzzz-dz642-000000000000003 dispatcher=beta future=yes\n"  # unknown key
    )
    a, b, c = parse_runner_list(text)
    assert (a.dispatcher_id, a.uid, a.fence) == ("alpha", uid, 60473304)
    assert (b.dispatcher_id, b.uid, b.fence) == (None, None, None)
    assert (c.dispatcher_id, c.uid, c.fence) == ("beta", None, None)


@pytest.mark.parametrize(
    "text",
    [
        f"x {UUID_A}\n",
        "2001 not-a-uuid\n",
        f"2001 {UUID_A} extra\n",
        f"2001 {UUID_A} dispatcher=Not_A_Label\n",
        f"2001 {UUID_A} fence=-1\n",
        f"2001 {UUID_A} uid=$(reboot)\n",
    ],
)
def test_runner_list_rejects_malformed_lines(text: str) -> None:
    with pytest.raises(OutputError):
        parse_runner_list(text)


def test_runner_pid_and_status() -> None:
    assert parse_runner_pid("4242\n") == 4242
    with pytest.raises(OutputError):
        parse_runner_pid("started\n")
    status = json.dumps(
        {"uuid": UUID_A, "state": "exited", "pid": 7, "exitCode": 3, "signal": None}
    )
    assert parse_runner_status(status, UUID_A) == ("exited", 7, 3, None)
    killed = json.dumps(
        {"uuid": UUID_A, "state": "killed", "pid": 7, "exitCode": None, "signal": "TERM"}
    )
    assert parse_runner_status(killed, UUID_A) == ("killed", 7, None, "TERM")


@pytest.mark.parametrize(
    "text",
    [
        "nope",
        json.dumps({"uuid": UUID_B, "state": "running"}),
        json.dumps({"uuid": UUID_A, "state": "sleeping"}),
        json.dumps({"uuid": UUID_A, "state": "exited", "exitCode": None}),
        json.dumps({"uuid": UUID_A, "state": "running", "pid": "7"}),
    ],
)
def test_runner_status_rejects_malformed_or_foreign_answers(text: str) -> None:
    with pytest.raises(OutputError):
        parse_runner_status(text, UUID_A)


def test_telemetry_with_and_without_gpus() -> None:
    assert parse_telemetry("0.52 0.58 0.59 1/467 12345\n") == (0.52, 0.58, 0.59, None)
    load1, _, _, gpus = parse_telemetry("1.00 0.50 0.25 2/100 9\n0, 37\n1, [N/A]\n")
    assert load1 == 1.0
    assert gpus is not None
    assert [(g.index, g.utilisation) for g in gpus] == [(0, 37.0), (1, None)]


@pytest.mark.parametrize(
    "text", ["", "abc def ghi\n", "0.1 0.2\n", "0.1 0.2 0.3 1/2 3\nGPU0 busy\n"]
)
def test_telemetry_rejects_malformed_output(text: str) -> None:
    with pytest.raises(OutputError):
        parse_telemetry(text)


_words = st.text(
    alphabet=st.characters(whitelist_categories=("Ll", "Lu", "Nd"), max_codepoint=127),
    min_size=1,
    max_size=12,
)
_inhibitor = st.builds(
    Inhibitor,
    what=st.lists(
        st.sampled_from(["shutdown", "sleep", "idle", "handle-lid-switch"]),
        min_size=1,
        max_size=3,
        unique=True,
    ).map(tuple),
    who=st.lists(_words, min_size=1, max_size=3).map(" ".join),
    why=st.lists(_words, min_size=1, max_size=5).map(" ".join),
    mode=st.sampled_from(["block", "delay", "block-weak"]),
    uid=st.integers(min_value=0, max_value=65534),
    pid=st.integers(min_value=1, max_value=4_000_000),
)


@given(st.lists(_inhibitor, max_size=6))
def test_both_listings_round_trip_through_the_stub_renderers(
    inhibitors: list[Inhibitor],
) -> None:
    assert parse_busctl_inhibitors(render.busctl_inhibitors(inhibitors)) == tuple(inhibitors)
    assert parse_systemd_inhibit_list(render.systemd_inhibit_list(inhibitors)) == tuple(inhibitors)


def test_uptime_is_the_first_field_of_proc_uptime() -> None:
    from nodewarden.ssh.parsing import parse_uptime

    assert parse_uptime("12345.67 45678.90\n") == 12345.67
    for bad in ("", "abc 1", "-5 1"):
        with pytest.raises(OutputError):
            parse_uptime(bad)
