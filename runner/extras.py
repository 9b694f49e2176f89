"""The package's optional extras (pyproject.toml), and the one command that installs the one a rule needs.

`pip install -e ".[trainers]"` (what `make test` and CI install; `make run` does
not) adds the trainers' packages whose own code the rules of `runner.trainers`
call: torchtitan 0.3.0 (its loss and `dist_sum_tensor`). A rule whose package is
missing is refused before launch (`runner.callables`) with `install_command`,
which installs into the interpreter that runs the runner and keeps its torch:
pip keeps an installed torch that meets the package's range.

Torch-free: the launcher calls it.
"""

from __future__ import annotations

import json
import re
import sys
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

DISTRIBUTION = "loss-reduction-ablation"
_EXTRA_MARKER = re.compile(r"""extra\s*==\s*["']([^"']+)["']""")


def _installed() -> metadata.Distribution | None:
    """This package's installed distribution: the one pip recorded (with direct_url.json), not an egg-info a source
    tree on sys.path may also hold; else whichever is found."""
    found = list(metadata.distributions(name=DISTRIBUTION))
    recorded = [d for d in found if d.read_text("direct_url.json")]
    return (recorded or found or [None])[0]


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extra_of(package: str) -> tuple[str, str] | None:
    """(extra, requirement) of the installed distribution that brings `package` (an import or pip name), or None."""
    installed = _installed()
    requirements = (installed.requires or []) if installed is not None else []
    for requirement in requirements:
        spec, _, marker = requirement.partition(";")
        name = re.split(r"[\s<>=!~\[(;]", spec.strip(), maxsplit=1)[0]
        extra = _EXTRA_MARKER.search(marker)
        if extra and _normal(name) == _normal(package):
            return extra.group(1), spec.strip()
    return None


def install_command(extra: str) -> str:
    """The one command that installs `extra` into this interpreter: the Makefile's `make setup-EXTRA` where this
    interpreter is the .venv that the source tree's Makefile set up (it keeps torch and the lock's versions),
    else pip from the source tree this package was installed from (editable or not), else from the package index."""
    target = f'"{DISTRIBUTION}[{extra}]"'
    installed = _installed()
    direct = installed.read_text("direct_url.json") if installed is not None else None
    if direct:
        info = json.loads(direct)
        url = urlparse(info.get("url", ""))
        if url.scheme == "file":
            source = Path(unquote(url.path))
            makefile = source / "Makefile"
            if Path(sys.prefix).resolve() == (source / ".venv").resolve() and makefile.is_file():
                if re.search(rf"^setup-{re.escape(extra)}:", makefile.read_text(), re.M):
                    here = Path.cwd().resolve() == source.resolve()
                    return f"make setup-{extra}" if here else f"make -C {source} setup-{extra}"
            editable = info.get("dir_info", {}).get("editable", False)
            target = ("-e " if editable else "") + f'"{source}[{extra}]"'
    return f"{sys.executable} -m pip install {target}"


def missing_package_message(spec: str, package: str) -> str:
    """Why custom.fn=`spec` cannot run here: `package` is not installed; and the one command that installs it."""
    found = extra_of(package)
    if found is None:
        return (
            f"custom.fn={spec} needs the package {package!r}, which is not installed here: "
            f"{sys.executable} -m pip install {package}"
        )
    extra, requirement = found
    return (
        f"custom.fn={spec} needs {requirement}, which is not installed here (the package's [{extra}] extra, "
        f"which `make test` installs and `make run` does not); install it with: {install_command(extra)}"
    )
