"""`custom.fn=MODULE:CALLABLE`: find the callable and check that it can be called as fn(logits, labels, ctx),
and its hooks as the protocol says (`runner.train.custom_rule`).

Torch-free at import, though the user's module may import torch: the launcher
runs `facts_of_each` in a short subprocess (`runner.sweep.custom_check`),
and each rank calls `resolve_callable` in-process. The module is imported as
`import MODULE` would import it: from the working directory or an installed
package (the trainers' rules, `runner.trainers`, come with this one). A rule
whose own package is missing is refused with the one command that installs it
(`runner.extras`).
"""

from __future__ import annotations

import builtins
import hashlib
import importlib
import inspect
import json
import os
import sys
from importlib import metadata
from pathlib import Path

from runner.extras import missing_package_message

EXAMPLE = "runner.trainers.megatron:per_token"  # needs no optional package
PARAMETERS = "(logits, labels, ctx)"
HOOK_PARAMETERS = {
    "start_step": ("(ctx)", 1),
    "finish_gradients": ("(model, ctx)", 2),
    "grad_norm": ("(grads, ctx)", 2),
}
MOVED = {"examples.reductions": "runner.trainers"}  # where the trainers' rules went (conf/trainer/ names them)


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
            moved = next((new for old, new in MOVED.items() if module_name.startswith(old)), None)
            hint = (
                f"the trainers' rules moved to {moved} (conf/trainer/ names each: trainer=NAME)"
                if moved
                else f"give an importable MODULE:CALLABLE, e.g. custom.fn={EXAMPLE}"
            )
            raise CallableProblem(
                f"custom.fn={spec}: no module named {error.name!r} in the working directory or the installed "
                f"packages; {hint}"
            ) from None
        if error.name:  # the module imports a package that is not installed
            raise CallableProblem(missing_package_message(spec, error.name.split(".")[0])) from None
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
    _check_parameters(spec, attribute, "fn", target, PARAMETERS, 3)
    for hook, (parameters, count) in HOOK_PARAMETERS.items():
        found = getattr(target, hook, None)
        if found is None:
            continue
        if not callable(found):
            raise CallableProblem(
                f"custom.fn={spec}: its {hook} is a {type(found).__name__}, not a callable {hook}{parameters}"
            )
        _check_parameters(spec, f"{attribute}.{hook}", hook, found, parameters, count)
    return target


def _check_parameters(spec: str, name: str, role: str, target, parameters: str, count: int) -> None:
    """Refuse `target` (the rule `fn` or a hook of it) unless it can be called with `count` positional arguments."""
    try:
        signature = inspect.signature(target)
    except (TypeError, ValueError):  # some builtins have none: let the call decide
        return
    try:
        signature.bind(*[None] * count)
    except TypeError:
        raise CallableProblem(
            f"custom.fn={spec}: {name}{signature} cannot be called as {role}{parameters}; "
            f"it must take {count} positional parameter{'s' if count > 1 else ''} {parameters}"
        ) from None


def callable_problem(spec: str) -> str | None:
    """What is wrong with `spec` (a message naming custom.fn), or None."""
    try:
        resolve_callable(spec)
    except CallableProblem as problem:
        return str(problem)
    return None


def _not_users(top: str) -> bool:
    """The standard library's modules and the runner's own (its version is in every run's identity)."""
    return top in sys.stdlib_module_names or top in ("runner", "__main__", "__mp_main__")


def local_sources(names, distributions: dict | None = None) -> dict[str, str]:
    """{module: sha256 of its file} of the loaded modules among `names` that are the user's own: neither the
    standard library's, the runner's, nor an installed package's (whose version says what it is)."""
    distributions = metadata.packages_distributions() if distributions is None else distributions
    local = {}
    for name in sorted(names):
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        top = name.partition(".")[0]
        if file is None or _not_users(top) or top in distributions or not Path(file).is_file():
            continue
        local[name] = hashlib.sha256(Path(file).read_bytes()).hexdigest()
    return local


def sources_digest(local: dict[str, str]) -> str:
    """One sha256 over `local_sources`' files: the identity's `custom.fn` part."""
    return hashlib.sha256(json.dumps(local, sort_keys=True).encode()).hexdigest()


def callable_facts(spec: str, preloaded: frozenset[str] = frozenset()) -> dict:
    """What is wrong with `spec` (`problem`, or None), and the code its import brought in, for the run's identity:
    `source` (a sha256 over the files of the modules that are not an installed package's: the callable's own
    module and the local modules it imports), `modules` (their names) and `packages` (each installed
    distribution whose modules it imported, with its version), and `graph_all_reduce`, the differentiable
    all-reduce the rule declares (`runner.train.custom_rule`; None: none). The runner's own modules are the package's
    (its version is in every run's identity); the standard library is Python's.

    `preloaded`: the modules the checker imported before (torch and what torch imports, `facts_of_each`); they
    count as the spec's when its import asks for any of their packages, as a fresh interpreter would load them."""
    before = set(sys.modules)
    asked = set()  # the top-level packages that the spec's import statements name, loaded already or not
    real_import = builtins.__import__

    def recording_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            asked.add(name.partition(".")[0])
        return real_import(name, globals, locals, fromlist, level)

    builtins.__import__ = recording_import
    try:
        problem = callable_problem(spec)
    finally:
        builtins.__import__ = real_import
    if problem:
        return {"problem": problem}
    declared = getattr(resolve_callable(spec), "graph_all_reduce", None)  # imported already: no second import
    brought = set(sys.modules) - before
    preloaded_packages = {name.partition(".")[0] for name in preloaded} - set(sys.stdlib_module_names)
    if asked & preloaded_packages:
        brought |= preloaded
    distributions = metadata.packages_distributions()
    packages = {}
    for name in sorted(brought):
        top = name.partition(".")[0]
        if top in distributions and getattr(sys.modules[name], "__file__", None) and not _not_users(top):
            for distribution in distributions[top]:
                packages[distribution] = metadata.version(distribution)
    local = local_sources(brought, distributions)
    return {
        "problem": None,
        "source": sources_digest(local),
        "sources": local,
        "modules": sorted(local),
        "packages": dict(sorted(packages.items())),
        "graph_all_reduce": getattr(declared, "value", declared),  # "configured": it reads autograd_all_reduce
    }


def facts_of_each(specs: list[str]) -> dict[str, dict]:
    """`callable_facts` of each spec, each as a fresh interpreter with torch loaded finds them.

    torch, which every rule imports and whose version is in every run's identity anyway, is imported once;
    each spec is then imported in a child forked from that state, so that no spec's imports hide in another's
    (the facts list the modules and packages an import brought in) and a slow import is paid once, not per spec.
    One spec takes the same path, so its facts do not depend on which others were checked beside it.
    """
    base = set(sys.modules)
    import torch  # noqa: F401

    preloaded = frozenset(set(sys.modules) - base)
    found = {}
    for spec in specs:
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: import the spec, report, leave without running anyone's exit handlers
            os.close(read)
            try:
                payload = json.dumps(callable_facts(spec, preloaded))
            except BaseException as error:  # noqa: BLE001 -- a module that raises anything on import
                payload = json.dumps(
                    {"problem": f"custom.fn={spec}: importing it raised {type(error).__name__}: {error}"}
                )
            with os.fdopen(write, "w") as out:
                out.write(payload)
            sys.stdout.flush()
            os._exit(0)
        os.close(write)
        with os.fdopen(read) as pipe:
            text = pipe.read()
        os.waitpid(pid, 0)
        found[spec] = json.loads(text) if text else {"problem": f"custom.fn={spec}: its check ended without a word"}
    return found


if __name__ == "__main__":
    # `python -m runner.callables MODULE:CALLABLE...`: the launcher's check, each spec's facts as one JSON object
    # on the last line of output.
    print(json.dumps(facts_of_each(sys.argv[1:])))
