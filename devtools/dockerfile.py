"""What process a container runs: the image's ``ENTRYPOINT``/``CMD`` read from a Dockerfile, combined with a
Kubernetes container's ``command``/``args`` (for the agent image, ``docker/Dockerfile``, and the task pod the pod
builder makes; README "Helm chart and agent image").

Pure, standard library only. Only the exec (JSON array) form of ``ENTRYPOINT`` and ``CMD`` is read: the shell
form runs under ``/bin/sh -c`` and would not give a container's arguments to the program.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ImageProcess", "container_argv", "image_process"]


@dataclass(frozen=True)
class ImageProcess:
    """The last stage's base image (its ``FROM``), ``USER`` ("" when not declared), ``ENTRYPOINT`` and ``CMD``
    (each a tuple of strings; empty when not declared)."""

    base: str
    user: str
    entrypoint: tuple[str, ...]
    cmd: tuple[str, ...]


def _instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, rest)`` per logical line of a Dockerfile: ``\\`` continuations joined, comments and
    blank lines dropped (parser directives are comments here)."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):  # a comment inside a continued instruction
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line, pending = pending + line, ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    if pending:
        word, _, rest = pending.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
    return out


def image_process(dockerfile: Path) -> ImageProcess:
    """Read the base, ``USER``, ``ENTRYPOINT`` and ``CMD`` the image built from ``dockerfile`` declares: the last
    of each in its last stage (a ``FROM`` starts a stage and clears them, as a build does; what the base image
    declares is not known here, so a stage must declare what it runs).

    :raises ValueError: naming the instruction, when one is in shell form or is not a JSON array of strings.
    """
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    cmd_set = False
    base = user = ""
    for word, rest in _instructions(dockerfile.read_text(encoding="utf-8")):
        if word == "FROM":
            entrypoint, cmd, cmd_set = (), (), False
            base, user = next((w for w in rest.split() if not w.startswith("--")), ""), ""
        elif word == "USER":
            user = rest
        elif word in ("ENTRYPOINT", "CMD"):
            try:
                value = json.loads(rest)
            except json.JSONDecodeError:
                value = None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError(f"{dockerfile}: {word} {rest} is not in exec form (a JSON array of strings)")
            if word == "ENTRYPOINT":
                entrypoint = tuple(value)
                if not cmd_set:  # Docker: ENTRYPOINT resets a CMD the stage inherited (not one it set)
                    cmd = ()
            else:
                cmd, cmd_set = tuple(value), True
    return ImageProcess(base, user, entrypoint, cmd)


def container_argv(image: ImageProcess, command: Sequence[str] | None, args: Sequence[str] | None) -> tuple[str, ...]:
    """The argv a Kubernetes container runs, from its image and its ``command``/``args``: ``command`` replaces
    the image's ``ENTRYPOINT`` (and then its ``CMD`` is not used), ``args`` replaces its ``CMD`` (the rules of
    the Kubernetes API reference, Container ``command`` and ``args``). Empty lists count as unset, as there.
    """
    if command:
        return (*command, *(args or ()))
    return (*image.entrypoint, *(args if args else image.cmd))
