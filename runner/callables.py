"""`custom.fn=MODULE:CALLABLE`: find the callable and check that it can be called as fn(logits, labels, ctx),
and its hooks as the protocol says (`runner.train.custom_rule`).

Torch-free itself, though the user's module may import torch: the launcher
runs `callable_problem` in a short subprocess (`runner.sweep.custom_check`),
and each rank calls `resolve_callable` in-process. The module is imported as
`import MODULE` would import it: from the working directory or an installed
package (the trainers' rules, `runner.trainers`, come with this one). A rule
whose own package is missing is refused with the one command that installs it
(`runner.extras`).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys

from runner.extras import missing_package_message

EXAMPLE = "runner.trainers.megatron:per_token"  # needs no optional package
PARAMETERS = "(logits, labels, ctx)"
HOOK_PARAMETERS = {"start_step": ("(ctx)", 1), "finish_gradients": ("(model, ctx)", 2)}
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


if __name__ == "__main__":
    # `python -m runner.callables MODULE:CALLABLE`: the launcher's check, one line of output (empty when fine);
    # `--json SPEC...`: each spec's problem (or null), one JSON object on the last line.
    if sys.argv[1] == "--json":
        problems = {spec: callable_problem(spec) for spec in sys.argv[2:]}
        print(json.dumps(problems))
    else:
        print(callable_problem(sys.argv[1]) or "")
