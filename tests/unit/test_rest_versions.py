"""slurmrestd of Slurm 22.05 (data parser v0.0.38) and 24.11 (v0.0.40-v0.0.42), from answers
recorded on both for the same scenario (tests/fixtures/slurm/record_rest.py): the client picks
the newest parser a server offers, and every version's answers parse to the same jobs and
nodes, the same errors, and the same outcome of a job update."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaunch.connectors.slurm import parse
from relaunch.connectors.slurm.rest import JwtMinter, SlurmRest
from relaunch.connectors.slurm.rest_shapes import newest_supported, offered_versions
from relaunch.models.endpoints import SlurmRestSettings
from relaunch.models.errors import JobNotFoundError, NodeNotFoundError, SchedulerError
from relaunch.models.scheduler import ExitCode, Job, JobState, Node

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm"
RELEASES = {"22.05": ["v0.0.38"], "24.11": ["v0.0.40", "v0.0.41", "v0.0.42"]}
PAIRS = [(release, v) for release, versions in RELEASES.items() for v in versions]


def _load(release: str, name: str) -> Any:
    return json.loads((FIXTURES / release / name).read_text())


def _scenario(release: str) -> dict[str, str]:
    jobs: dict[str, str] = _load(release, "jobs.json")["jobs"]
    return jobs


class Recorded:
    """Answers as the release's slurmrestd answered them, by path."""

    def __init__(self, release: str, *, openapi_v3: bool = True) -> None:
        self.release = release
        self.openapi_v3 = openapi_v3
        self.requests: list[httpx.Request] = []
        self.running = _scenario(release)["running"]

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path = request.url.path
        if path == "/openapi/v3" and not self.openapi_v3:
            return httpx.Response(404, text="Unable find requested URL.")
        if path in ("/openapi/v3", "/openapi"):
            return httpx.Response(200, json=_load(self.release, "openapi_v3_paths.json"))
        parts = path.split("/")  # "", "slurm", version, what...
        if len(parts) < 4 or parts[1] != "slurm" or parts[2] not in RELEASES[self.release]:
            return httpx.Response(404, text="Unable find requested URL.")
        version, rest = parts[2], "/".join(parts[3:])
        name = {
            "jobs": "jobs",
            f"job/{self.running}": "job",
            "job/987654": "update_missing" if request.method == "POST" else "job_missing",
            "nodes": "nodes",
            "node/n2": "node",
            "node/nosuch": "node_missing",
        }.get(rest)
        if name is None:
            return httpx.Response(404, text="Unable find requested URL.")
        answer = _load(self.release, f"rest_{version}_{name}.json")
        return httpx.Response(answer["status"], json=answer["body"])


@pytest.fixture
async def on_recorded() -> AsyncIterator[Callable[..., SlurmRest]]:
    made: list[SlurmRest] = []

    def make(fake: Callable[[httpx.Request], httpx.Response], **kwargs: Any) -> SlurmRest:
        rest = SlurmRest(**kwargs)
        rest._client = httpx.AsyncClient(transport=httpx.MockTransport(fake), base_url="http://x")
        made.append(rest)
        return rest

    yield make
    for rest in made:
        await rest.aclose()


# ------------------------------------------------------------------------ negotiation


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_the_openapi_document_lists_the_releases_parsers(release: str) -> None:
    offered = offered_versions(_load(release, "openapi_v3_paths.json"))
    assert offered == RELEASES[release]
    assert newest_supported(offered) == RELEASES[release][-1]


def test_a_server_offering_only_unknown_parsers_has_no_choice() -> None:
    document: dict[str, dict[str, Any]] = {
        "paths": {f"/slurm/v0.0.39/{p}": {} for p in ("jobs", "job/{job_id}", "nodes")}
    }
    assert offered_versions(document) == []  # no node/{node_name}: not usable
    document["paths"]["/slurm/v0.0.39/node/{node_name}"] = {}
    assert offered_versions(document) == ["v0.0.39"]
    assert newest_supported(["v0.0.39", "v0.0.43"]) is None


@pytest.mark.parametrize(
    ("release", "openapi_v3"), [("22.05", True), ("24.11", True), ("24.11", False)]
)
async def test_auto_picks_the_newest_offered_once_and_logs_it(
    on_recorded: Callable[..., SlurmRest],
    caplog: pytest.LogCaptureFixture,
    release: str,
    openapi_v3: bool,
) -> None:
    fake = Recorded(release, openapi_v3=openapi_v3)
    rest = on_recorded(fake)
    assert rest.api_version is None
    with caplog.at_level(logging.INFO, logger="relaunch.slurmrestd"):
        await rest.list_jobs()
        await rest.list_nodes()
        await rest.get_node("n2")
    newest = RELEASES[release][-1]
    assert rest.api_version == newest
    documents = [r.url.path for r in fake.requests if r.url.path.startswith("/openapi")]
    assert documents == (["/openapi/v3"] if openapi_v3 else ["/openapi/v3", "/openapi"])
    assert [r.url.path for r in fake.requests if r.url.path.startswith("/slurm")] == [
        f"/slurm/{newest}/jobs",
        f"/slurm/{newest}/nodes",
        f"/slurm/{newest}/node/n2",
    ]
    logged = [r.getMessage() for r in caplog.records if "data parser" in r.getMessage()]
    assert logged == [
        f"slurmrestd at http://localhost: using data parser {newest} "
        f"(offered: {', '.join(RELEASES[release])})"
    ]


async def test_a_pinned_version_is_used_without_reading_the_document(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    fake = Recorded("24.11")
    rest = on_recorded(fake, api_version="v0.0.40")
    assert len(await rest.list_nodes()) == 2
    assert [r.url.path for r in fake.requests] == ["/slurm/v0.0.40/nodes"]


async def test_a_pinned_version_the_server_lacks_is_a_clear_error(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    rest = on_recorded(Recorded("24.11"), api_version="v0.0.38")
    with pytest.raises(SchedulerError, match="does not serve GET /slurm/v0.0.38/jobs") as info:
        await rest.list_jobs()
    assert info.value.hint and "pinned to v0.0.38" in info.value.hint


async def test_auto_against_a_server_with_no_parser_in_common(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    def old(request: httpx.Request) -> httpx.Response:
        needed = ("jobs", "job/{job_id}", "nodes", "node/{node_name}")
        paths: dict[str, Any] = {f"/slurm/v0.0.37/{p}": {} for p in needed}
        return httpx.Response(200, json={"paths": paths})

    rest = on_recorded(old)
    with pytest.raises(SchedulerError, match="offers data parsers v0.0.37; Relaunch supp") as info:
        await rest.ping()
    assert info.value.hint and "openapi/slurmctld" in info.value.hint


async def test_auto_against_a_server_without_an_openapi_document(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    def nothing(request: httpx.Request) -> httpx.Response:
        return httpx.Response(404, text="Unable find requested URL.")

    rest = on_recorded(nothing)
    with pytest.raises(SchedulerError, match="serves no OpenAPI document") as info:
        await rest.list_nodes()
    assert info.value.hint and "api_version" in info.value.hint


def test_settings_default_to_auto_and_pin_only_supported_versions() -> None:
    assert SlurmRestSettings(url="/run/slurmrestd.sock").api_version == "auto"
    assert SlurmRestSettings(url="/s", api_version="v0.0.41").api_version == "v0.0.41"
    with pytest.raises(ValueError, match="not one Relaunch supports: auto, or one of v0.0.38"):
        SlurmRestSettings(url="/s", api_version="v0.0.39")
    with pytest.raises(ValueError):
        SlurmRest(api_version="v0.0.39")


# ------------------------------------------------------------------------ the same values


def _job_facts(job: Job) -> dict[str, Any]:
    """What a job's parse must agree on across releases (times and the recording's temporary
    directory differ between recordings: output files are compared by name)."""

    def rel(path: str) -> str:
        return path.rsplit("/", 1)[-1]

    return {
        "name": job.name,
        "user": job.user,
        "state": job.state,
        "held": job.held,
        "reason": job.reason,
        "exit_code": job.exit_code,
        "partition": job.partition,
        "nodes": job.nodes,
        "node_count": job.node_count,
        "batch_host": job.batch_host,
        "restart_count": job.restart_count,
        "requeue_allowed": job.requeue_allowed,
        "comment": job.comment,
        "stdout": rel(job.stdout_path),
        "stderr": rel(job.stderr_path),
        "num_tasks": job.num_tasks,
        "started": job.start_time is not None,
        "ended": job.end_time is not None,
    }


def _node_facts(node: Node) -> dict[str, Any]:
    return {
        "name": node.name,
        "state": node.display_state,
        "drain": node.drain_flag,
        "reason": node.reason,
        "reason_user": node.reason_user,
        "partitions": node.partitions,
        "cpus": node.cpus,
        "alloc_cpus": node.alloc_cpus,
    }


def _jobs(release: str, version: str) -> dict[str, Job]:
    body = _load(release, f"rest_{version}_jobs.json")["body"]
    return {job.job_id: job for job in (parse.job_from_json(raw) for raw in body["jobs"])}


def _nodes(release: str, version: str) -> dict[str, Node]:
    body = _load(release, f"rest_{version}_nodes.json")["body"]
    return {node.name: node for node in parse.nodes_from_data(body)}


EXPECTED_JOBS = {
    "failed": {
        "state": JobState.FAILED,
        "exit_code": ExitCode(code=3),
        "reason": "NonZeroExitCode",
    },
    "killed": {"state": JobState.FAILED, "exit_code": ExitCode(code=0, signal=9)},
    "running": {
        "state": JobState.RUNNING,
        "nodes": ["n1", "n2"],
        "node_count": 2,
        "requeue_allowed": True,
        "comment": "relaunch=on,max_restarts=2",
    },
    "held": {"state": JobState.PENDING, "held": True},
}


@pytest.mark.parametrize(("release", "version"), PAIRS)
def test_each_version_parses_the_scenario_to_the_same_jobs(release: str, version: str) -> None:
    ids = _scenario(release)
    jobs = _jobs(release, version)
    reference = _jobs("22.05", "v0.0.38")
    reference_ids = _scenario("22.05")
    for role, expected in EXPECTED_JOBS.items():
        job = jobs[ids[role]]
        facts = _job_facts(job)
        assert {k: facts[k] for k in expected} == expected, (role, facts)
        same = _job_facts(reference[reference_ids[role]])
        if role == "killed":  # Slurm's own reason changed: JobLaunchFailure, then RaisedSignal
            same["reason"] = {"22.05": "JobLaunchFailure", "24.11": "RaisedSignal"}[release]
        assert facts == same, role
    array = sorted((j for j in jobs.values() if j.name == "arr"), key=lambda j: j.stdout_path)
    assert [j.stdout_path.rsplit("/", 1)[-1] for j in array] == [
        f"arr-{ids['array']}_1.out",
        f"arr-{ids['array']}_2.out",
    ]
    assert [(j.state, j.nodes) for j in array] == [
        (JobState.RUNNING, ["n1"]),
        (JobState.PENDING, []),
    ]
    one = parse.job_from_json(_load(release, f"rest_{version}_job.json")["body"]["jobs"][0])
    assert one == jobs[ids["running"]]


@pytest.mark.parametrize(("release", "version"), PAIRS)
def test_each_version_parses_the_same_nodes(release: str, version: str) -> None:
    nodes = _nodes(release, version)
    assert sorted(nodes) == ["n1", "n2"]
    assert {n: _node_facts(v) for n, v in nodes.items()} == {
        n: _node_facts(v) for n, v in _nodes("22.05", "v0.0.38").items()
    }
    assert nodes["n2"].drain_flag and nodes["n2"].reason == "relaunch incident 42"
    one = parse.nodes_from_data(_load(release, f"rest_{version}_node.json")["body"])
    assert one == [nodes["n2"]]


@pytest.mark.parametrize("release", sorted(RELEASES))
def test_rest_agrees_with_the_releases_own_cli_json(release: str) -> None:
    """The REST nodes of the newest parser equal the CLI's per-node JSON of the same moment
    (sinfo --json on 22.05, scontrol show nodes --json on 24.11)."""
    cli = {n.name: n for n in parse.nodes_from_data(_load(release, "cli_nodes.json"))}
    rest = _nodes(release, RELEASES[release][-1])
    assert {n: _node_facts(v) for n, v in rest.items()} == {
        n: _node_facts(v) for n, v in cli.items()
    }


# ------------------------------------------------------------------------ errors and writes


@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_missing_jobs_and_nodes_are_typed_errors(
    on_recorded: Callable[..., SlurmRest], release: str
) -> None:
    rest = on_recorded(Recorded(release))
    with pytest.raises(JobNotFoundError):
        await rest.get_job("987654")
    with pytest.raises(NodeNotFoundError):
        await rest.get_node("nosuch")
    with pytest.raises(JobNotFoundError):
        await rest.update_job("987654", {"hold": True})
    running = await rest.get_job(_scenario(release)["running"])
    assert running.state is JobState.RUNNING


def _answering(release: str, name: str) -> Callable[[httpx.Request], httpx.Response]:
    answer = _load(release, f"{name}.json")

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(answer["status"], json=answer["body"])

    return handler


@pytest.mark.parametrize("name", ["rest_update_hold", "rest_update_release", "rest_signal_kill"])
@pytest.mark.parametrize("release", sorted(RELEASES))
async def test_accepted_writes_raise_nothing(
    on_recorded: Callable[..., SlurmRest], release: str, name: str
) -> None:
    assert _load(release, f"{name}.json")["status"] == 200
    rest = on_recorded(_answering(release, name), api_version=RELEASES[release][-1])
    if name == "rest_signal_kill":
        await rest.signal_job("5", "KILL")
    else:
        await rest.update_job("5", {"hold": name == "rest_update_hold"})


async def test_a_write_22_05_refuses_with_200_is_an_error(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    """22.05 refuses to hold an array one task of which runs, in a 200 answer; 24.11 holds
    the tasks that can be held."""
    rest = on_recorded(_answering("22.05", "rest_update_hold_array"), api_version="v0.0.38")
    with pytest.raises(SchedulerError, match="update of job 5: job array update .* failed"):
        await rest.update_job("5", {"hold": True})
    rest = on_recorded(_answering("24.11", "rest_update_hold_array"), api_version="v0.0.42")
    await rest.update_job("5", {"hold": True})


async def test_a_failed_result_of_a_24_11_update_is_an_error(
    on_recorded: Callable[..., SlurmRest],
) -> None:
    body = _load("24.11", "rest_update_hold.json")["body"]
    body["results"] = [
        {
            "job_id": 5,
            "step_id": "",
            "error_code": 2019,
            "error": "Job/step already completing or completed",
            "why": "already done",
        }
    ]

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=body)

    rest = on_recorded(handler, api_version="v0.0.42")
    with pytest.raises(SchedulerError, match="update of job 5: already done"):
        await rest.update_job("5", {"hold": True})


async def test_24_11_refusing_a_token_renews_it_once(
    on_recorded: Callable[..., SlurmRest], tmp_path: Path
) -> None:
    """24.11 refuses a bad or expired token with HTTP 511 and error 1007 (22.05: 500, errno -1):
    a fresh token is minted from the key file once, and a second refusal says what to check."""
    refused = _load("24.11", "rest_v0.0.42_token_refused.json")
    good = _load("24.11", "rest_v0.0.42_nodes.json")
    key = tmp_path / "jwt.key"
    key.write_bytes(b"the key slurmctld does not use, 0123456789")
    accept = [False]

    def handler(request: httpx.Request) -> httpx.Response:
        answer = good if accept[0] else refused
        return httpx.Response(answer["status"], json=answer["body"])

    minter = JwtMinter(key, "root")
    rest = on_recorded(handler, api_version="v0.0.42", minter=minter)
    with pytest.raises(SchedulerError, match="refused a freshly minted JWT token") as info:
        await rest.list_nodes()
    assert info.value.hint and "jwt_key" in info.value.hint and minter.minted == 2
    accept[0] = True  # the operator mounted the right key
    assert len(await rest.list_nodes()) == 2
