#!/usr/bin/env python3
"""relaunch-entrypoint: start a Relaunch process from a configuration that holds no secret.

The Helm chart mounts the cluster configuration from a ConfigMap; where a value is secret (the
PostgreSQL DSN) it holds the string ``from-env:NAME`` instead, and NAME is set from a Secret.

    relaunch-entrypoint ARGS...   write $RELAUNCH_CONFIG from $RELAUNCH_CONFIG_TEMPLATE with every
                                  "from-env:NAME" replaced by $NAME (mode 0600), then exec
                                  `relaunch ARGS...` (so that relaunch gets SIGTERM itself)
    relaunch-entrypoint --check   the probe of the worker and the watcher: the written
                                  configuration parses, and the files it names (SSH key,
                                  known_hosts, certificates, token files, slurm.conf in local
                                  mode) and $RELAUNCH_MUNGE_SOCKET are there and readable

Where $RELAUNCH_CONFIG_TEMPLATE is a directory (the console over several clusters), each
``*.json`` in it is written under the directory $RELAUNCH_CONFIG with the same name, and
--check checks each one. Without RELAUNCH_CONFIG_TEMPLATE it only execs `relaunch ARGS...`.
"""

from __future__ import annotations

import json
import os
import stat
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

PREFIX = "from-env:"


class EntrypointError(Exception):
    pass


def resolve(value: Any, environ: Mapping[str, str]) -> Any:
    """``value`` with each string ``from-env:NAME`` replaced by ``environ[NAME]``."""
    if isinstance(value, dict):
        return {key: resolve(item, environ) for key, item in value.items()}
    if isinstance(value, list):
        return [resolve(item, environ) for item in value]
    if isinstance(value, str) and value.startswith(PREFIX):
        name = value[len(PREFIX) :]
        if not name.isidentifier():
            raise EntrypointError(f"{value!r}: {name!r} is no environment variable name")
        found = environ.get(name)
        if not found:
            raise EntrypointError(f"environment variable {name} is not set (or empty)")
        return found
    return value


def render(template: Path, target: Path, environ: Mapping[str, str]) -> None:
    """Write the resolved configuration to ``target``, readable by this user only."""
    try:
        data = json.loads(template.read_text())
    except (OSError, ValueError) as exc:
        raise EntrypointError(f"cannot read the configuration template {template}: {exc}") from exc
    text = json.dumps(resolve(data, environ), indent=2) + "\n"
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    os.replace(tmp, target)


def render_all(template: Path, target: Path, environ: Mapping[str, str]) -> None:
    """``render`` one configuration, or each ``*.json`` of a directory into ``target/``."""
    if not template.is_dir():
        render(template, target, environ)
        return
    found = sorted(template.glob("*.json"))
    if not found:
        raise EntrypointError(f"no *.json configuration in {template}")
    for each in found:
        render(each, target / each.name, environ)


def named_files(config: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(what, path) of every file the configuration names that must be readable."""
    ssh = config.get("ssh") or {}
    for key in ("key_file", "known_hosts"):
        if ssh.get(key):
            yield f"ssh.{key}", ssh[key]
    for key, path in (config.get("temporal_tls") or {}).items():
        if key != "server_name" and path:
            yield f"temporal_tls.{key}", path
    rest = config.get("slurmrestd") or {}
    if rest.get("jwt_key_file"):
        yield "slurmrestd.jwt_key_file", rest["jwt_key_file"]
    console = config.get("console") or {}
    if console.get("tokens_file"):
        yield "console.tokens_file", console["tokens_file"]
    if not ssh and config.get("slurm_conf"):
        yield "slurm_conf", config["slurm_conf"]


def check(path: Path, environ: Mapping[str, str]) -> list[str]:
    """Problems with the written configuration (each one of a directory) and what it needs;
    empty when all is well."""
    if path.is_dir():
        found = sorted(path.glob("*.json"))
        if not found:
            return [f"{path}: no *.json configuration"]
        return [problem for each in found for problem in check(each, environ)]
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        return [f"{path}: {exc}"]
    problems = []
    try:
        from pydantic import ValidationError

        from relaunch.models.config import ClusterConfig
        from relaunch.models.config_check import problems_of
    except ImportError:
        problems.append("the relaunch package is not importable")
    else:
        try:
            ClusterConfig.model_validate(raw)
        except ValidationError as exc:  # each unknown key, bad value: `relaunch config check`'s
            problems.extend(f"{path}: {line}" for line in problems_of(exc, path))
    for what, name in named_files(raw):
        if not os.access(name, os.R_OK):
            problems.append(f"{what}: {name} is missing or unreadable")
    socket = environ.get("RELAUNCH_MUNGE_SOCKET")
    if socket:
        try:
            if not stat.S_ISSOCK(os.stat(socket).st_mode):
                problems.append(f"munge: {socket} is not a socket")
        except OSError:
            problems.append(f"munge: no socket at {socket} (is munged running?)")
    return problems


def main(argv: list[str], environ: Mapping[str, str] | None = None) -> int:
    env = os.environ if environ is None else environ
    target = Path(env.get("RELAUNCH_CONFIG", "/run/relaunch/cluster.json"))
    if argv[:1] == ["--check"]:
        problems = check(target, env)
        for problem in problems:
            print(f"relaunch-entrypoint: {problem}", file=sys.stderr)
        return 1 if problems else 0
    template = env.get("RELAUNCH_CONFIG_TEMPLATE")
    if template:
        try:
            render_all(Path(template), target, env)
        except EntrypointError as exc:
            print(f"relaunch-entrypoint: error: {exc}", file=sys.stderr)
            return 2
    relaunch = env.get("RELAUNCH_BIN", "relaunch")
    os.execvp(relaunch, [relaunch, *argv])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
