"""Which step versions a reference names: an output folder, `name@key-prefix`, or a step name (its latest
version; a name given alone means its two latest). Shared by `schooner compare` and `schooner report A B`."""

from __future__ import annotations

import os

from schooner.cluster.records import meta_path
from schooner.cluster.runner._version import ConfigError
from schooner.cluster.storage import storage_for

from ._explain import find_records
from ._versions import Version, by_name, known_names, load_version


def _folder_version(ref: str) -> Version | None:
    """The version in the output folder `ref`, when `ref` is one (it holds `.schooner/step.json`)."""
    folder = os.path.abspath(ref) if "://" not in ref else ref.rstrip("/")
    storage = storage_for(folder)
    if storage.exists(meta_path(folder, "step.json")) or storage.exists(meta_path(folder, "status.json")):
        return load_version(folder)
    return None


def _versions_named(prefix: str, name: str) -> list[Version]:
    """Every version of the step `name` under `prefix`, oldest first; an error naming the steps that exist."""
    found = find_records(prefix, name) if storage_for(prefix).exists(prefix) else []
    versions = [v for v in (load_version(r["_folder"]) for r in found) if v is not None]
    if versions:
        return by_name(versions)[name]
    if not storage_for(prefix).exists(prefix):
        raise ConfigError(
            f"no step output folder {name!r} and the prefix {prefix} does not exist; pass --prefix (the one "
            "the experiment used) or the step's output folder"
        )
    names = known_names(prefix)
    listed = ", ".join(names[:40]) + (f" … ({len(names)} in all)" if len(names) > 40 else "")
    raise ConfigError(
        f"no step named {name!r} under {prefix}, and no output folder {name!r}; steps there: {listed or 'none'}"
    )


def _is_step_name(prefix: str, ref: str) -> bool:
    return storage_for(prefix).exists(prefix) and bool(find_records(prefix, ref))


def _by_key(prefix: str, name: str, key: str) -> Version:
    versions = _versions_named(prefix, name)
    matches = [v for v in versions if v.key.startswith(key)]
    keys = ", ".join(v.key[:12] for v in reversed(versions))
    if not matches:
        raise ConfigError(
            f"no version of {name!r} under {prefix} has a key starting {key!r}; its keys: {keys}"
        )
    if len(matches) > 1:
        raise ConfigError(
            f"{name}@{key} matches {len(matches)} versions ({', '.join(v.key[:12] for v in matches)}); "
            "give more of the key"
        )
    return matches[0]


def resolve_versions(prefix: str, refs: list[str]) -> list[Version]:
    """The versions `refs` name (see the module docstring), in the order given.

    Raises:
        ConfigError: a reference that names nothing (listing what exists), or fewer than two versions.
    """
    if not refs:
        raise ConfigError("schooner compare needs a step name, or two versions (folders or name@key)")
    versions: list[Version] = []
    for ref in refs:
        folder = _folder_version(ref)
        if folder is not None:
            versions.append(folder)
        elif "@" in ref and not _is_step_name(prefix, ref):  # '@' may be part of a name ('eval/nano@3e-4')
            name, key = ref.rsplit("@", 1)
            versions.append(_by_key(prefix, name, key))
        else:
            named = _versions_named(prefix, ref)
            versions += named[-2:] if len(refs) == 1 else named[-1:]
    if len(versions) < 2:
        v = versions[0]
        raise ConfigError(
            f"{v.name!r} has one version under {prefix} ({v.key[:12]}, {v.folder}); nothing to compare it with: "
            "give a second version (a folder or name@key)"
        )
    return versions
