"""`custom.fn=MODULE:CALLABLE`: find the callable and check that it can be called as fn(logits, labels, ctx).

Torch-free itself, though the user's module may import torch: the launcher
runs `callable_facts` in a short subprocess (`runner.sweep.custom_check`),
and each rank calls `resolve_callable` in-process. The module is imported as
`import MODULE` would import it: from the working directory or an installed
package.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import sys
from importlib import metadata
from pathlib import Path

EXAMPLE = "examples.reductions.torchtitan:loss"
PARAMETERS = "(logits, labels, ctx)"


class CallableProblem(ValueError):
    """Why `custom.fn` names no usable callable (the message names the field and what would be valid)."""


def resolve_callable(spec: str):
    """The callable `spec` names; raises CallableProblem saying why not."""
    module_name, colon, attribute = spec.partition(":")
    if not colon or not module_name or not attribute:
        raise CallableProblem(f"custom.fn={spec} is not MODULE:CALLABLE; e.g. custom.fn={EXAMPLE}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        if error.name and (module_name == error.name or module_name.startswith(error.name + ".")):
            raise CallableProblem(
                f"custom.fn={spec}: no module named {error.name!r} in the working directory or the installed "
                f"packages; give an importable MODULE:CALLABLE, e.g. custom.fn={EXAMPLE}"
            ) from None
        raise CallableProblem(f"custom.fn={spec}: importing {module_name} failed: {error}") from None
    except Exception as error:  # the user's module raised while importing
        raise CallableProblem(
            f"custom.fn={spec}: importing {module_name} raised {type(error).__name__}: {error}"
        ) from None
    target = module
    for part in attribute.split("."):
        if not hasattr(target, part):
            functions = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
            raise CallableProblem(
                f"custom.fn={spec}: {module_name} has no attribute {attribute!r}; its functions: "
                + (", ".join(functions) or "none")
            )
        target = getattr(target, part)
    if not callable(target):
        raise CallableProblem(
            f"custom.fn={spec}: {module_name}.{attribute} is not callable (its type: {type(target).__name__}); "
            f"give a callable fn{PARAMETERS}"
        )
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have none: let the call decide
        return target
    try:
        signature.bind(None, None, None)
    except TypeError:
        raise CallableProblem(
            f"custom.fn={spec}: {attribute}{signature} cannot be called as fn{PARAMETERS}; "
            "it must take the logits, the labels and the context as three positional parameters"
        ) from None
    return target


def callable_problem(spec: str) -> str | None:
    """What is wrong with `spec` (a message naming custom.fn), or None."""
    try:
        resolve_callable(spec)
    except CallableProblem as problem:
        return str(problem)
    return None


def callable_facts(spec: str) -> dict:
    """What is wrong with `spec` (`problem`, or None), and the code its import brought in, for the run's identity:
    `source` (a sha256 over the files of the modules that are not an installed package's: the callable's own
    module and the local modules it imports), `modules` (their names) and `packages` (each installed
    distribution whose modules it imported, with its version). The runner's own modules are the package's
    (its version is in every run's identity); the standard library is Python's."""
    before = set(sys.modules)
    problem = callable_problem(spec)
    if problem:
        return {"problem": problem}
    distributions = metadata.packages_distributions()
    local, packages = {}, {}
    for name in sorted(set(sys.modules) - before):
        top = name.partition(".")[0]
        file = getattr(sys.modules[name], "__file__", None)
        if top in sys.stdlib_module_names or top in ("runner", "__main__", "__mp_main__") or file is None:
            continue
        if top in distributions:
            for distribution in distributions[top]:
                packages[distribution] = metadata.version(distribution)
        elif Path(file).is_file():
            local[name] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    source = hashlib.sha256(json.dumps(local, sort_keys=True).encode()).hexdigest()
    return {"problem": None, "source": source, "modules": sorted(local), "packages": dict(sorted(packages.items()))}


if __name__ == "__main__":
    # `python -m runner.callables MODULE:CALLABLE`: the launcher's check, its facts as one JSON line, last.
    print(json.dumps(callable_facts(sys.argv[1])))
