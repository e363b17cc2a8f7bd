"""The configuration file: the store URL and the defaults of ``dagq run`` and ``dagq worker``.

Where a setting comes from, weakest first: the built-in default; the user's file
(``$XDG_CONFIG_HOME/dagq/config.yaml``, by default ``~/.config/dagq/config.yaml``); the
project's file (``dagq.yaml`` or ``.dagq.yaml`` in the current directory or the nearest
parent that has one, like git finds its repository); an environment variable
(``DAGQ_STORE``, ``DAGQ_WORKER_CONCURRENCY``, ...); a command-line flag. ``DAGQ_CONFIG``
names one file to use instead of both files. A relative sqlite path or import path in a
file is relative to that file's directory, so the project's settings mean the same thing
from any of its subdirectories.

A file is small and typed: an unknown key or a value of the wrong type is refused in
one line naming the file and the key.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import msgspec

from dagq.errors import ValidationError
from dagq.payloads import echo

DEFAULT_STORE = "sqlite:///.dagq/dagq.db"
PROJECT_NAMES = ("dagq.yaml", ".dagq.yaml")
#: Names ``DAGQ_CONFIG`` may take to use no file at all.
NO_FILE = ("", "none")

Processor = Annotated[
    str,
    msgspec.Meta(
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$",
        description="The function that runs kwargs-only tasks, as 'package.module:function'.",
    ),
]


class _Section(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Base of the file's sections: typed, unknown keys refused."""


class RunSettings(_Section, frozen=True, kw_only=True):
    """Defaults of ``dagq run``."""

    workers: Annotated[int, msgspec.Meta(ge=1, le=1024)] | None = None
    processor: Processor | None = None


class WorkerSettings(_Section, frozen=True, kw_only=True):
    """Defaults of ``dagq worker``."""

    concurrency: Annotated[int, msgspec.Meta(ge=1, le=4096)] | None = None
    queues: list[str] | None = None
    import_paths: list[str] | None = None
    processor: Processor | None = None


class ConfigFile(_Section, frozen=True, kw_only=True):
    """One configuration file."""

    store: str | None = None
    run: RunSettings | None = None
    worker: WorkerSettings | None = None


class Key(msgspec.Struct, frozen=True):
    """One setting: its dotted key, built-in default, variable, and how text reads as it."""

    name: str
    default: Any
    env: str
    kind: str = "str"  # str, int, list (comma-separated), paths (os.pathsep-separated)

    @property
    def section(self) -> str | None:
        return self.name.partition(".")[0] if "." in self.name else None

    @property
    def field(self) -> str:
        return self.name.rpartition(".")[2]


KEYS = (
    Key("store", DEFAULT_STORE, "DAGQ_STORE"),
    Key("run.workers", 4, "DAGQ_RUN_WORKERS", "int"),
    Key("run.processor", None, "DAGQ_RUN_PROCESSOR"),
    Key("worker.concurrency", 4, "DAGQ_WORKER_CONCURRENCY", "int"),
    Key("worker.queues", ["default"], "DAGQ_WORKER_QUEUES", "list"),
    Key("worker.import_paths", [], "DAGQ_WORKER_IMPORT_PATHS", "paths"),
    Key("worker.processor", None, "DAGQ_WORKER_PROCESSOR"),
)


class Setting(msgspec.Struct, frozen=True, kw_only=True):
    """A setting's effective value and where it came from: ``default``, a file's path,
    or ``env NAME``."""

    key: str
    value: Any
    source: str


class Settings(msgspec.Struct, frozen=True, kw_only=True):
    """The effective settings (``dagq config show --json``)."""

    #: The files read, strongest last.
    files: list[str]
    settings: list[Setting]

    def value(self, key: str) -> Any:
        """The effective value of a dotted key."""
        return next(s.value for s in self.settings if s.key == key)

    def overridden(self) -> dict[str, Any]:
        """The settings not left at their built-in default, by dotted key."""
        return {s.key: s.value for s in self.settings if s.source != "default"}


def user_file(env: Mapping[str, str] | None = None) -> Path:
    """The user's configuration file (which may not exist)."""
    env = os.environ if env is None else env
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "dagq" / "config.yaml"


def project_file(start: Path | None = None) -> Path | None:
    """``dagq.yaml`` or ``.dagq.yaml`` in ``start`` or its nearest parent that has one."""
    here = (start or Path.cwd()).resolve()
    for directory in (here, *here.parents):
        found = [directory / name for name in PROJECT_NAMES if (directory / name).is_file()]
        if len(found) > 1:
            raise ValidationError(
                f"{found[0]} and {found[1]} both exist: keep one (dagq reads one per directory)"
            )
        if found:
            return found[0]
    return None


def config_files(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> list[Path]:
    """The files that apply, weakest first: the user's, then the project's."""
    env = os.environ if env is None else env
    named = env.get("DAGQ_CONFIG")
    if named is not None:
        if named.strip().lower() in NO_FILE:
            return []
        path = Path(named).expanduser()
        if not path.is_file():
            raise ValidationError(f"DAGQ_CONFIG names {named}, which is not a file")
        return [path]
    files = [user_file(env)] if user_file(env).is_file() else []
    project = project_file(cwd)
    if project is not None and project not in files:
        files.append(project)
    return files


def load(env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """The effective settings: defaults, then the files, then environment variables."""
    env = os.environ if env is None else env
    values: dict[str, Setting] = {
        key.name: Setting(key=key.name, value=key.default, source="default") for key in KEYS
    }
    files = config_files(env, cwd)
    for path in files:
        for name, value in read_file(path).items():
            values[name] = Setting(key=name, value=value, source=str(path))
    for key in KEYS:
        text = env.get(key.env, "")
        if text.strip():  # set and empty is unset, as for DAGQ_STORE
            values[key.name] = Setting(
                key=key.name, value=_from_env(key, text), source=f"env {key.env}"
            )
    return Settings(files=[str(p) for p in files], settings=[values[k.name] for k in KEYS])


def read_file(path: Path) -> dict[str, Any]:
    """The settings one file sets, by dotted key (relative paths made absolute)."""
    from dagq.pyyaml import yaml

    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValidationError(f"{path}: cannot be read: {exc}") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}: " if mark is not None else ""
        raise ValidationError(f"{path}: {where}invalid YAML") from None
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValidationError(f"{path}: a dagq configuration is a mapping of settings")
    _check_keys(path, raw)
    try:
        parsed = msgspec.convert(raw, ConfigFile, str_keys=True)
    except msgspec.ValidationError as exc:
        message, _, at = str(exc).partition(" - at `$.")
        raise ValidationError(f"{path}: {at.rstrip('`')}: {message.replace('`', '')}") from None
    found: dict[str, Any] = {}
    for key in KEYS:
        block = parsed if key.section is None else getattr(parsed, key.section)
        value = None if block is None else getattr(block, key.field)
        if value is not None:
            found[key.name] = _anchored(key, value, path.parent.resolve())
    return found


def _check_keys(path: Path, raw: Mapping[Any, Any]) -> None:
    """Refuse an unknown key in one line naming the file and the key."""
    sections = {"run": RunSettings, "worker": WorkerSettings}
    for name, value in raw.items():
        if name == "store":
            continue
        if name not in sections:
            raise ValidationError(
                f"{path}: unknown key '{echo(str(name))}' (known: store, run, worker)"
            )
        if isinstance(value, Mapping):
            known = sections[name].__struct_fields__
            for field_name in value:
                if field_name not in known:
                    raise ValidationError(
                        f"{path}: unknown key '{name}.{echo(str(field_name))}' "
                        f"(known under {name}: {', '.join(known)})"
                    )


_SQLITE = re.compile(r"^sqlite:///(?!/)(.+)$")


def _anchored(key: Key, value: Any, base: Path) -> Any:
    """A file's relative sqlite path or import paths, relative to the file's directory."""
    if key.name == "store" and isinstance(value, str):
        match = _SQLITE.match(value)
        if match and not Path(match.group(1)).expanduser().is_absolute():
            return f"sqlite:///{base / match.group(1)}"
        return value
    if key.kind == "paths":
        return [str(base / Path(p).expanduser()) for p in value]
    return value


def _from_env(key: Key, text: str) -> Any:
    if key.kind == "int":
        try:
            number = int(text)
        except ValueError:
            raise ValidationError(f"{key.env}={echo(text)!r}: expected an integer") from None
        if number < 1:
            raise ValidationError(f"{key.env}={number}: expected 1 or more")
        return number
    if key.kind == "list":
        return [part.strip() for part in text.split(",") if part.strip()]
    if key.kind == "paths":
        return [part for part in text.split(os.pathsep) if part]
    return text


def template(store: str = DEFAULT_STORE) -> str:
    """The commented file ``dagq config init`` writes."""
    return f"""\
# dagq configuration. `dagq config show` prints the effective settings and where each
# comes from. Looked up: dagq.yaml or .dagq.yaml in the current directory or the nearest
# parent that has one, over the user's $XDG_CONFIG_HOME/dagq/config.yaml; environment
# variables (DAGQ_STORE, DAGQ_WORKER_CONCURRENCY, ...) and flags override them.

# Where workflows, their state and queues live: sqlite:///path.db, azure://account/prefix,
# memory://. A relative sqlite path is relative to this file's directory.
store: {store}

# Defaults of `dagq run`.
run:
  workers: 4                           # tasks at once (--workers)
  # processor: mypackage.tasks:process # runs tasks given only kwargs (--processor)

# Defaults of `dagq worker`.
worker:
  concurrency: 4                       # tasks at once (-c)
  queues: [default]                    # the queues served (-q)
  import_paths: []                     # where Python tasks are imported from (--import-path)
  # processor: mypackage.tasks:process
"""
