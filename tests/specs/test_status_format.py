"""``AppStatus.format()``, ``str()`` and ``repr()`` print what upstream TorchX 0.7.0 prints.

The expected strings were produced by upstream 0.7.0 for the same statuses.
"""

from __future__ import annotations

import json
from datetime import datetime

import pytest

from torchx.specs import AppState, AppStatus, AppStatusError, ReplicaStatus, RoleStatus

_FAILED = AppState.FAILED


def _two_roles() -> AppStatus:
    return AppStatus(
        _FAILED,
        num_restarts=1,
        msg="boom",
        ui_url="file:///l",
        roles=[
            RoleStatus(
                "t",
                [
                    ReplicaStatus(1, _FAILED, "t", "h1"),
                    ReplicaStatus(0, AppState.SUCCEEDED, "t", "h0"),
                ],
            ),
            RoleStatus("ps", [ReplicaStatus(0, AppState.CANCELLED, "ps", "")]),
        ],
    )


def test_format_lists_replicas_by_id_marking_each_roles_first() -> None:
    assert _two_roles().format() == (
        "AppStatus:\n    State: FAILED\n    Num Restarts: 1\n    Roles: \n"
        " *t[0]:SUCCEEDED\n  t[1]:FAILED (no reply file)\n *ps[0]:CANCELLED\n"
        "    Msg: boom\n    Structured Error Msg: <NONE>\n    UI URL: file:///l\n    "
    )


def test_format_filters_roles() -> None:
    assert _two_roles().format(["ps"]) == (
        "AppStatus:\n    State: FAILED\n    Num Restarts: 1\n    Roles: \n"
        " *ps[0]:CANCELLED\n"
        "    Msg: boom\n    Structured Error Msg: <NONE>\n    UI URL: file:///l\n    "
    )


def test_format_expands_a_torchelastic_reply_file() -> None:
    message = "RuntimeError: " + "word " * 20 + "\nException raised from foo"
    err = json.dumps(
        {
            "message": {
                "message": message,
                "errorCode": 1,
                "extraInfo": {"timestamp": "1700000000", "py_callstack": "tb"},
            }
        }
    )
    status = AppStatus(
        _FAILED, roles=[RoleStatus("t", [ReplicaStatus(0, _FAILED, "t", "host", err)])]
    )
    when = datetime.fromtimestamp(1700000000)
    assert status.format() == (
        "AppStatus:\n    State: FAILED\n    Num Restarts: 0\n    Roles: \n"
        " *t[0]:FAILED (exitcode: 1)\n"
        f"        timestamp: {when}\n"
        "        hostname: host\n"
        "        error_msg: RuntimeError: word word word word word word word word word word"
        " word word word word\n"
        "                word word word word word word \n"
        "    Msg: \n    Structured Error Msg: <NONE>\n    UI URL: None\n    "
    )


def test_format_survives_reply_files_upstream_cannot_read() -> None:
    no_code = json.dumps({"message": {"message": "ValueError: bad lr", "extraInfo": {}}})
    status = AppStatus(
        _FAILED,
        roles=[
            RoleStatus(
                "t",
                [
                    ReplicaStatus(0, _FAILED, "t", "h", no_code),
                    ReplicaStatus(1, _FAILED, "t", "h", "plain text error"),
                ],
            )
        ],
    )
    text = status.format()
    assert " *t[0]:FAILED (exitcode: <N/A>)\n        timestamp: <N/A>\n" in text
    assert "error_msg: ValueError: bad lr" in text
    assert "  t[1]:FAILED\n        error_msg: plain text error" in text


def test_str_and_repr_are_upstreams_yaml() -> None:
    running = AppStatus(
        AppState.RUNNING, roles=[RoleStatus("t", [ReplicaStatus(0, AppState.RUNNING, "t", "h")])]
    )
    expected = (
        "AppStatus:\n  msg: ''\n  num_restarts: 0\n  roles:\n  - replicas:\n    - hostname: h\n"
        "      id: 0\n      role: t\n      state: !!python/object/apply:torchx.specs.api.AppState\n"
        "      - 3\n      structured_error_msg: <NONE>\n    role: t\n  state: RUNNING (3)\n"
        "  structured_error_msg: <NONE>\n  ui_url: null\n"
    )
    assert str(running) == repr(running) == expected
    failed = AppStatus(_FAILED, structured_error_msg=json.dumps({"message": "x"}))
    assert str(failed) == (
        "AppStatus:\n  msg: ''\n  num_restarts: 0\n  roles: []\n  state: FAILED (5)\n"
        "  structured_error_msg:\n    message: x\n  ui_url: null\n"
    )
    # upstream raised on an error message that is not JSON; it is shown as given
    assert "structured_error_msg: oops" in str(AppStatus(_FAILED, structured_error_msg="oops"))


def test_raise_for_status_is_one_line_with_the_workers_error() -> None:
    err = json.dumps({"message": {"message": "Traceback...\nValueError: bad lr"}})
    status = AppStatus(_FAILED, msg="replica t/1 exited with code 1", structured_error_msg=err)
    assert status.error_summary() == "FAILED: ValueError: bad lr (replica t/1 exited with code 1)"
    with pytest.raises(AppStatusError) as e:
        status.raise_for_status()
    assert str(e.value) == f"job did not succeed: {status.error_summary()}"
    assert e.value.status is status


def test_summary_names_the_exception_once_when_the_message_has_it() -> None:
    err = json.dumps({"message": {"message": "ValueError: bad lr"}})
    msg = "replica t/1 failed: rank 1: ValueError: bad lr"
    status = AppStatus(_FAILED, msg=msg, structured_error_msg=err)
    assert status.error_summary() == f"FAILED: {msg}"
