"""Slurm: what squeue, scontrol, sacct and the jobcomp log say, from recorded outputs
(Slurm 22.05 on the local cluster, see fixtures/README)."""

from __future__ import annotations

from pathlib import Path

from torchx.schedulers.slurm.status import (
    SQUEUE_LIST_FIELDS,
    parse_jobcomp,
    parse_sacct,
    parse_scontrol,
    parse_squeue_text,
    squeue_groups,
)

FIXTURES = Path(__file__).parent / "fixtures" / "slurm"


def _read(name: str) -> str:
    return (FIXTURES / name).read_text()


def _summary(parts: list) -> list:
    return [(p["name"], p["state"], p["exit_code"], p["offset"], p["node"]) for p in parts]


def test_cluster_wide_squeue_gives_each_jobs_groups_under_its_app_id() -> None:
    groups = list(squeue_groups(_read("squeue_22.05_hetjob_failed.txt")))
    assert [(app_id, g["name"], g["state"]) for app_id, g in groups] == [
        ("6", "w-0", "FAILED"),
        ("6", "w-1", "FAILED"),
    ]


def test_squeue_columns_are_read_by_the_fields_asked_for() -> None:
    fields = SQUEUE_LIST_FIELDS + ",Reason:|,Comment:"
    text = "9|N/A|N/A|PENDING|0|(null)|r-0|/w|JobHeldUser|a|b torchx-token=t1\n"
    [(app_id, group)] = list(squeue_groups(text, fields))
    assert (app_id, group["state"], group["reason"], group["offset"]) == (
        "9",
        "PENDING",
        "JobHeldUser",
        0,
    )
    assert (group["name"], group["node"], group["comment"]) == ("r-0", "", "a|b torchx-token=t1")
    assert list(squeue_groups("9|N/A|N/A|PENDING\n", fields)) == []  # a cut line
    # fields that end with "|" (list's): the last column without the separator after it
    [(_, listed)] = list(squeue_groups("9|N/A|N/A|RUNNING|0|node1|r-0|/w|\n", SQUEUE_LIST_FIELDS))
    assert (listed["work_dir"], listed["comment"]) == ("/w", "")
    assert list(squeue_groups("9|N/A|N/A|RUNNING|0|node1|r-0\n", SQUEUE_LIST_FIELDS)) == []


def test_squeue_of_one_job_has_groups_but_no_exit_codes() -> None:
    parts = parse_squeue_text(_read("squeue_22.05_hetjob_failed.txt"), "6")
    assert _summary(parts) == [
        ("w-0", "FAILED", None, 0, "node1"),
        ("w-1", "FAILED", None, 1, "node2"),
    ]
    assert parts[0]["work_dir"] == "/tmp/sj" and parts[0]["restarts"] == 0
    assert parse_squeue_text(_read("squeue_22.05_hetjob_failed.txt"), "7") == []


def test_scontrol_gives_each_groups_exit_code_despite_a_comment_that_mimics_fields() -> None:
    parts = parse_scontrol(_read("scontrol_22.05_hetjob_failed.txt"), "6")
    assert _summary(parts) == [
        ("w-0", "FAILED", 0, 0, "node1"),
        ("w-1", "FAILED", 3, 1, "node2"),
    ]


def test_sacct_takes_each_groups_exit_code_from_its_steps() -> None:
    parts = parse_sacct(_read("sacct_22.05_hetjob_failed.txt"), "6")
    # the allocation rows both say 3:0 (the batch script's exit); the steps tell them apart
    assert _summary(parts) == [
        ("w-0", "FAILED", 0, 0, "node1"),
        ("w-1", "FAILED", 3, 1, "node2"),
    ]
    assert parts[1]["work_dir"] == "/tmp/sj"
    assert parse_sacct(_read("sacct_22.05_hetjob_failed.txt"), "60") == []


def test_sacct_of_a_requeued_job_reports_its_last_run_and_restarts() -> None:
    parts = parse_sacct(_read("sacct_22.05_hetjob_requeued.txt"), "8")
    assert _summary(parts) == [
        ("sh-0", "FAILED", 3, 0, "node1"),
        ("sh-1", "FAILED", 4, 1, "node2"),
    ]
    assert [p["restarts"] for p in parts] == [1, 1]


def test_sacct_of_a_pending_rerun_has_no_exit_code_yet() -> None:
    text = _read("sacct_22.05_hetjob_requeued.txt").splitlines()
    first_run_and_pending = "\n".join(text[:5] + ["8+1|sh-1|PENDING|0:0|None assigned|/tmp/tq"])
    parts = parse_sacct(first_run_and_pending, "8")
    assert [(p["state"], p["exit_code"], p["node"]) for p in parts] == [
        ("REQUEUED", 3, "node1"),
        ("PENDING", None, ""),
    ]


def test_jobcomp_fallback() -> None:
    parts = parse_jobcomp(_read("jobcomp_22.05.txt"), "1")
    assert [(p["name"], p["state"], p["exit_code"]) for p in parts] == [
        ("w-0", "FAILED", 0),
        ("w-1", "FAILED", 3),
    ]
