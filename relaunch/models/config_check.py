"""Reading a cluster's configuration file, every problem at once as ``path: message`` lines.

Every process (worker, watcher, console, the CLI's commands) reads its configuration through
:func:`read_config`, and `relaunch config check` prints the same lines: a misspelt key, a value
out of its bounds, a missing file or malformed JSON is named where it is, never a traceback.
The input is left out of each line: a secret pasted under the wrong key must not reach a log."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from relaunch.models.config import ClusterConfig
from relaunch.models.errors import RelaunchError

# A configuration is a few kilobytes; anything this large is the wrong file.
MAX_CONFIG_BYTES = 4 * 1024 * 1024
MAX_PROBLEMS = 50


class ConfigError(RelaunchError):
    """A cluster configuration that cannot be used; ``problems`` holds one line per problem."""

    def __init__(self, path: Path, problems: list[str]) -> None:
        noun = "problem" if len(problems) == 1 else "problems"
        super().__init__(
            f"{path}: invalid configuration ({len(problems)} {noun})",
            hint=f"relaunch config check --config {path}",
        )
        self.path = path
        self.problems = problems

    def lines(self) -> list[str]:
        return [*self.problems, f"error: {self}"]


def _where(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _number(value: Any) -> str:
    """``1`` rather than ``1.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _message(error: Any) -> str:
    kind = error["type"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key missing"
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx['le'])}"
    if kind == "less_than":
        return f"must be less than {_number(ctx['lt'])}"
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx['ge'])}"
    if kind == "greater_than":
        return f"must be greater than {_number(ctx['gt'])}"
    return str(error["msg"]).removeprefix("Value error, ")


def problems_of(exc: ValidationError, path: Path) -> list[str]:
    """One ``path: message`` line per error (``path`` dotted: ``notify.channels[0].type``;
    the file's own name where the problem is the whole file, e.g. malformed JSON)."""
    lines = []
    for error in exc.errors(include_input=False, include_url=False):
        where = _where(tuple(error["loc"])) or str(path)
        message = _message(error)
        if error["type"] == "json_invalid":
            message = "not valid JSON: " + message.removeprefix("Invalid JSON: ")
        lines.append(f"{where}: {message}")
    if len(lines) > MAX_PROBLEMS:
        lines = [*lines[:MAX_PROBLEMS], f"… and {len(lines) - MAX_PROBLEMS} more problems"]
    return lines


def read_config(path: Path) -> ClusterConfig:
    """The cluster configuration in ``path``, or :class:`ConfigError` naming every problem."""
    try:
        with path.open("rb") as src:
            raw = src.read(MAX_CONFIG_BYTES + 1)
    except FileNotFoundError:
        raise ConfigError(path, [f"{path}: no such file"]) from None
    except IsADirectoryError:
        raise ConfigError(path, [f"{path}: a directory, not a file"]) from None
    except OSError as exc:
        raise ConfigError(path, [f"{path}: cannot read: {exc.strerror}"]) from None
    if len(raw) > MAX_CONFIG_BYTES:
        raise ConfigError(path, [f"{path}: larger than {MAX_CONFIG_BYTES} bytes"])
    try:
        return ClusterConfig.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(path, problems_of(exc, path)) from None


def summary(path: Path, config: ClusterConfig) -> str:
    """The one line `relaunch config check` prints for a good configuration."""
    partitions = ",".join(config.watch.partitions) or "none (opt-in comments only)"
    where = "ssh " + config.ssh.host if config.ssh else "local Slurm"
    return (
        f"ok: {path}: cluster {config.name}, mode {config.policy.mode.value}, "
        f"partitions watched: {partitions}, {where}"
    )
