"""The chart's migration Job: `relaunch db migrate` as a Helm hook before install and every
upgrade (the processes only check the schema's version), with the owner role's DSN from a
Secret by reference, and the pods' restrictions. Rendered by the real helm (tests/unit/
test_deploy.py's helpers; skipped where helm is not installed, as there)."""

from __future__ import annotations

from typing import Any

from tests.unit.test_deploy import helm, kinds, render

__all__ = ["helm"]  # the fixture, imported for pytest


def job(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (found,) = kinds(docs, "Job")
    return found


def test_migrations_run_as_a_hook_before_install_and_upgrade(helm: str) -> None:
    for example in ("ssh", "incluster"):
        docs = render(example)
        migrate = job(docs)
        hooks = migrate["metadata"]["annotations"]["helm.sh/hook"].split(",")
        assert sorted(hooks) == ["pre-install", "pre-upgrade"]
        pod = migrate["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == ["db", "migrate", "--dsn-env", "RELAUNCH_OWNER_DSN"]
        env = {e["name"]: e for e in container["env"]}
        ref = env["RELAUNCH_OWNER_DSN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "relaunch-db", "key": "database-url"}  # one role: the services'
        assert "value" not in env["RELAUNCH_OWNER_DSN"]
        # Before install the chart's ServiceAccount does not exist yet; no API token either.
        assert "serviceAccountName" not in pod and pod["automountServiceAccountToken"] is False
        assert pod["restartPolicy"] == "Never"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_owner_role_comes_from_its_own_secret(helm: str) -> None:
    docs = render(
        "ssh", "database.migrate.existingSecret=relaunch-db-owner", "database.migrate.key=dsn"
    )
    (container,) = job(docs)["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    ref = env["RELAUNCH_OWNER_DSN"]["valueFrom"]["secretKeyRef"]
    assert ref == {"name": "relaunch-db-owner", "key": "dsn"}
    for deployment in kinds(docs, "Deployment"):  # the services never see the owner's Secret
        assert "relaunch-db-owner" not in str(deployment)


def test_the_hook_can_be_left_to_a_person_and_runs_once_for_several_clusters(helm: str) -> None:
    assert not kinds(render("ssh", "database.migrate.enabled=false"), "Job")
    assert len(kinds(render("two-clusters"), "Job")) == 1  # one database, one migration
