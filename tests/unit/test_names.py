"""Every name that can reach a command line is checked against a strict pattern."""

from collections.abc import Callable

import pytest

from relaunch.models import names
from relaunch.models.errors import InvalidNameError

INJECTIONS = [
    "n1;rm -rf /",
    "$(id)",
    "`id`",
    "-n1",
    "--uid=0",
    "n1 n2",
    "n1\nn2",
    "n1\n",
    "n1|cat",
    "../etc",
    "",
]


@pytest.mark.parametrize("value", ["n1", "gpu-a01", "node-12.cluster", "N_7", "a" * 63])
def test_node_name_accepts(value: str) -> None:
    assert names.node_name(value) == value


@pytest.mark.parametrize("value", [*INJECTIONS, "a" * 64, None, 7])
def test_node_name_rejects(value: object) -> None:
    with pytest.raises(InvalidNameError):
        names.node_name(value)


@pytest.mark.parametrize("value", ["debug", "gpu-h100", "batch_2"])
def test_partition_accepts(value: str) -> None:
    assert names.partition(value) == value


@pytest.mark.parametrize("value", [*INJECTIONS, "p;rm", "a" * 64])
def test_partition_rejects(value: str) -> None:
    with pytest.raises(InvalidNameError):
        names.partition(value)


@pytest.mark.parametrize("value", ["root", "alice", "svc_train", "_slurm"])
def test_user_name_accepts(value: str) -> None:
    assert names.user_name(value) == value


@pytest.mark.parametrize("value", [*INJECTIONS, "Alice", "1abc", "a" * 33])
def test_user_name_rejects(value: str) -> None:
    with pytest.raises(InvalidNameError):
        names.user_name(value)


@pytest.mark.parametrize("value", ["relaunch incident 42", "ECC error: gpu 3 (xid=48)"])
def test_reason_accepts(value: str) -> None:
    assert names.reason(value) == value


@pytest.mark.parametrize("value", ["", "x;reboot", "$(id)", "it's", 'say "hi"', "a\nb", "a" * 201])
def test_reason_rejects(value: str) -> None:
    with pytest.raises(InvalidNameError):
        names.reason(value)


def test_comment_allows_printable_ascii_only() -> None:
    assert names.comment("relaunch=on,max_restarts=2") == "relaunch=on,max_restarts=2"
    assert names.comment("") == ""
    for bad in ["a\nb", "tab\there", "é", "x" * 251]:
        with pytest.raises(InvalidNameError):
            names.comment(bad)


@pytest.mark.parametrize(
    ("value", "expected"), [(12, "12"), ("12", "12"), ("12_3", "12_3"), ("7+1", "7+1")]
)
def test_job_id_accepts(value: object, expected: str) -> None:
    assert names.job_id(value) == expected


@pytest.mark.parametrize(
    "value", ["12;ls", "abc", True, False, "", "-12", "12 13", "12\n", 1.5, None, "1" * 11]
)
def test_job_id_rejects(value: object) -> None:
    with pytest.raises(InvalidNameError):
        names.job_id(value)


@pytest.mark.parametrize(
    ("check", "kind", "value"),
    [
        (names.node_name, "node name", "n1\nrm -rf /"),
        (names.job_id, "job id", "12;ls"),
        (names.partition, "partition", "p\n;rm"),
        (names.user_name, "user name", "$(id)"),
        (names.reason, "reason", "x\ny"),
    ],
)
def test_error_message_is_one_line_and_names_the_kind(
    check: Callable[[object], str], kind: str, value: str
) -> None:
    with pytest.raises(InvalidNameError) as info:
        check(value)
    text = str(info.value)
    assert "\n" not in text
    assert text.startswith(f"invalid {kind} ")
    assert info.value.retryable is False
