"""Hostlist expressions as Slurm prints them in squeue/sinfo output and accepts in --exclude."""

import time

import pytest

from relaunch.models.errors import InvalidNameError
from relaunch.models.hostlist import compress, count, expand


@pytest.mark.parametrize(
    ("expr", "hosts"),
    [
        ("n[1-3,7]", ["n1", "n2", "n3", "n7"]),
        ("gpu-a[01-04]", ["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"]),
        # Several bracket groups: the cartesian product, rightmost group varying fastest.
        ("r[1-2]-n[01-02]", ["r1-n01", "r1-n02", "r2-n01", "r2-n02"]),
        ("a,b[1-2]", ["a", "b1", "b2"]),
        ("n[9-11]", ["n9", "n10", "n11"]),
        ("n[08-11]", ["n08", "n09", "n10", "n11"]),
        ("login", ["login"]),
        ("gpu-a01", ["gpu-a01"]),
    ],
)
def test_expand(expr: str, hosts: list[str]) -> None:
    assert expand(expr) == hosts


@pytest.mark.parametrize("expr", ["", "   ", "(null)", None])
def test_expand_empty_means_no_hosts(expr: str | None) -> None:
    assert expand(expr) == []


@pytest.mark.parametrize(
    ("expr", "word"),
    [
        ("n[1-3", "unbalanced"),
        ("n1-3]", "unbalanced"),
        ("n[1-2]]", "unbalanced"),
        ("n[3-1]", "descending"),
        ("n[1-[2]]", "nested"),
        ("n[[1]]", "nested"),
        ("n[]", "bad range"),
        ("n[a-b]", "bad range"),
    ],
)
def test_expand_rejects_malformed(expr: str, word: str) -> None:
    with pytest.raises(InvalidNameError, match=word):
        expand(expr)


@pytest.mark.parametrize(
    ("hosts", "expr"),
    [
        (["n1", "n2", "n3", "n7"], "n[1-3,7]"),
        (["gpu-a01", "gpu-a02", "gpu-a03", "gpu-a04"], "gpu-a[01-04]"),
        (["n0", "n1", "n2"], "n[0-2]"),
        (["n08", "n09", "n10", "n11"], "n[08-11]"),
        (["n007", "n008", "n010"], "n[007-008,010]"),
        (["login"], "login"),
        (["a", "b1", "b2"], "a,b[1-2]"),
        ([], ""),
    ],
)
def test_compress(hosts: list[str], expr: str) -> None:
    assert compress(hosts) == expr
    assert expand(compress(hosts)) == hosts


@pytest.mark.parametrize(
    "expr",
    ["n[1-3,7]", "gpu-a[01-04]", "r[1-2]-n[01-02]", "n[0-12]", "n[008-120]", "a,b[1-2],c09"],
)
def test_expand_compress_round_trip(expr: str) -> None:
    hosts = expand(expr)
    assert expand(compress(hosts)) == hosts


def test_a_hostlist_past_the_default_cap_is_refused_without_expanding() -> None:
    # 52 bytes that would be a billion names: refused at once, nothing allocated.
    started = time.process_time()
    with pytest.raises(InvalidNameError, match="more than 65536 hosts"):
        expand("a[0-999][0-999][0-999]")
    with pytest.raises(InvalidNameError, match="more than"):
        expand("n[0-99999999999]")
    assert time.process_time() - started < 0.5
    assert count("a[0-999][0-999][0-999]") == 10**9


def test_the_callers_bound_caps_the_expansion() -> None:
    assert expand("n[1-4]", limit=4) == ["n1", "n2", "n3", "n4"]
    with pytest.raises(InvalidNameError, match="more than 3 hosts"):
        expand("n[1-4]", limit=3)
    with pytest.raises(InvalidNameError, match="more than 3 hosts"):
        expand("a,b,n[1-2]", limit=3)


def test_absurd_numbers_are_refused_not_crashed_on() -> None:
    with pytest.raises(InvalidNameError, match="too long"):
        expand("n[" + "9" * 5000 + "]")
    assert compress(["n" + "1" * 5000]) == "n" + "1" * 5000


def test_errors_quote_a_huge_expression_shortened() -> None:
    with pytest.raises(InvalidNameError) as err:
        expand("n[" + "x" * 100_000 + "]")
    assert len(str(err.value)) < 300
