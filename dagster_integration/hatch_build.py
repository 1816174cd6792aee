"""Hatch metadata hook: this distribution's version is ``echomq``'s, read from the one version
source of the repository (``__version__`` in ``../echomq_core/__init__.py``), and every
requirement on ``echomq`` listed in ``[tool.hatch.metadata.hooks.custom]`` is pinned to it.

The adapters are released in step with the core, so a release changes that one line. A wheel
built from this distribution's sdist (what pip does) takes both from the sdist's ``PKG-INFO``
(hatchling 1.22.5 and later), where the checkout's core is not at hand. The same file sits in
both adapter directories: each sdist must carry its own hook.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hatchling.metadata.plugin.interface import MetadataHookInterface

_VERSION = re.compile(r'^__version__ = "([^"]+)"$', re.MULTILINE)
_ECHOMQ = re.compile(r"echomq(\[[A-Za-z0-9_,]+\])?")


class OneVersion(MetadataHookInterface):
    def update(self, metadata: dict[str, Any]) -> None:
        source = Path(self.root).resolve().parent / "echomq_core" / "__init__.py"
        found = _VERSION.search(source.read_text(encoding="utf-8"))
        if found is None:
            raise ValueError(f"no __version__ = \"...\" line in {source}")
        version = found[1]

        def pin(requirement: str) -> str:
            return f"{requirement}=={version}" if _ECHOMQ.fullmatch(requirement) else requirement

        metadata["version"] = version
        metadata["dependencies"] = [pin(r) for r in self.config.get("dependencies", [])]
        extras = self.config.get("optional-dependencies", {})
        if extras:
            metadata["optional-dependencies"] = {
                name: [pin(r) for r in reqs] for name, reqs in extras.items()
            }
