"""Policies from outside tokenfair: a class named by its module, or an installed one.

Wherever a policy is named (`--policy`, `--policies`, the gateway's `policy:`, the
vLLM plugin's `tokenfair.policy`), a spec that is not one of the built-in names
(`fcfs`, `vtc`, `rpm:20`, ... in registry.py) is one of:

    package.module:ClassName                      a class, imported by its module path
    package.module:ClassName(key=value, ...)      the same, with keyword arguments
    name                                          installed under the entry point group
    name(key=value, ...)                          `tokenfair.policies` (a distribution's
                                                  `name = "package.module:ClassName"`)

Argument values are Python literals (numbers, strings, booleans, None, and lists,
tuples and dicts of those), read with `ast.literal_eval`, never evaluated; arguments are
keyword arguments only. The built-in names win: an entry point named `vtc` is never
used, and neither is a top-level module named like a built-in (`sjf:MyPolicy` is the
built-in `sjf` with the argument `MyPolicy`; name such a class by its package path).

The class must subclass `tokenfair.core.policies.base.Policy`; it is constructed as
`ClassName(settings, **arguments)`, `settings` being the deployment's `PolicySettings`
(tenant weights, share tree, cost, what a cached prompt token costs). The loader sets
nothing else on the instance, except two defaults the drivers read: `name` (the spec's
class or entry point name, when the class keeps the base `"base"`) and
`charge_cached_tokens` (from the settings, unless the class or its `__init__` set it).

What a driver needs to know about a class, it reads from the class's declaration,
`needs = Needs(...)` (declaration.py), as it does for the built-in names: `weights`
(the policy reads `settings.weights`: the drivers then pass the weights and do not warn
that they are ignored), `vllm` (False: the plugin refuses it). The gateway runs a user
policy only if it is a `KeyedPolicy`; the vLLM plugin gives one that overrides
`attach_prefix_cache` its view of vLLM's prefix cache.

Every mistake is one `PolicyError` line naming the spec: a module that does not import
(with the ImportError's message), a class missing from it, an object that is not a
policy, a malformed argument list or a value that is not a literal, arguments the class
does not take (the TypeError), and a ValueError raised by the constructor.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import inspect
import itertools
import os
import re
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tokenfair.core.policies.base import Policy
from tokenfair.core.policies.catalog import POLICY_HELP, POLICY_NAMES, PolicyError
from tokenfair.core.policies.needs import Needs
from tokenfair.core.policies.settings import PolicySettings

ENTRY_POINT_GROUP = "tokenfair.policies"

_DOTTED = re.compile(r"[^\W\d]\w*(\.[^\W\d]\w*)*")
# The one argument a spec takes for itself, not the class: what reports call it.
LABEL_ARGUMENT = "label"
_ARGUMENTS_HINT = "arguments are key=value Python literals, e.g. mypkg.mod:MyPolicy(half_life=30)"


@dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed user spec: `module:attr` or an entry point `name`, and its arguments."""

    text: str
    module: str | None  # None for an entry point name
    attr: str  # the class's attribute path in `module`, or the entry point name
    arguments: dict[str, Any] = field(default_factory=dict)
    # `label=` in the spec: what reports call it (never passed to the class).
    label: str | None = None

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attr}" if self.module is not None else self.attr


def is_user_spec(spec: str) -> bool:
    """Whether `spec` names a class (`a.b:C`) or an installed entry point, rather than a
    built-in policy or nothing at all. Imports nothing."""
    target = spec.strip().partition("(")[0].strip()
    module, colon, attr = target.partition(":")
    if module.strip().lower() in POLICY_NAMES or target.lower() in POLICY_NAMES:
        return False
    if colon:
        return bool(_DOTTED.fullmatch(module.strip()) and _DOTTED.fullmatch(attr.strip()))
    return bool(target) and _entry_point(target) is not None


def parse_spec(spec: str) -> PolicySpec:
    """Split a user spec into its target and literal arguments (PolicyError if malformed)."""
    text = spec.strip()
    target, paren, rest = text.partition("(")
    target = target.strip()
    module, colon, attr = (part.strip() for part in target.partition(":"))
    if colon and not (_DOTTED.fullmatch(module) and _DOTTED.fullmatch(attr)):
        raise _unknown(spec)
    arguments = _arguments(spec, rest) if paren else {}
    label = arguments.pop(LABEL_ARGUMENT, None)
    if label is not None and not (isinstance(label, str) and label.strip()):
        raise PolicyError(f"policy {spec!r}: {LABEL_ARGUMENT}= takes a non-empty string")
    return PolicySpec(text, module if colon else None, attr if colon else target, arguments, label)


def policy_label(spec: str) -> str:
    """What reports call the policy `spec`: a built-in name as written (`rpm:20`); a
    policy of one's own by its `label=`, else its class's `name` (or the class's own
    name), with its other arguments (`DecayVTC(half_life_s=120)`), so that two
    settings of one class stay apart. A spec that does not load is shown as written."""
    if not is_user_spec(spec):
        return spec.strip()
    try:
        parsed = parse_spec(spec)
        if parsed.label is not None:
            return parsed.label.strip()
        cls = _resolve(parsed)
    except PolicyError:
        return spec.strip()
    name = getattr(cls, "name", Policy.name)
    base = name if isinstance(name, str) and name != Policy.name else cls.__name__
    return _call_text(base, parsed.arguments) if parsed.arguments else base


def _call_text(target: str, arguments: dict[str, Any]) -> str:
    """`target(key=value, ...)`, each value as a Python literal (as a spec writes it)."""
    given = ", ".join(f"{key}={value!r}" for key, value in arguments.items())
    return f"{target}({given})"


def _arguments(spec: str, rest: str) -> dict[str, Any]:
    if not rest.rstrip().endswith(")"):
        raise PolicyError(
            f"policy {spec!r}: the argument list does not end with ')'; {_ARGUMENTS_HINT}"
        )
    try:
        tree = ast.parse(f"_({rest.rstrip()}", mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise PolicyError(f"policy {spec!r}: malformed argument list; {_ARGUMENTS_HINT}") from None
    call = tree.body
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "_"):
        raise PolicyError(f"policy {spec!r}: malformed argument list; {_ARGUMENTS_HINT}")
    if call.args or any(keyword.arg is None for keyword in call.keywords):
        raise PolicyError(f"policy {spec!r}: only keyword arguments are taken; {_ARGUMENTS_HINT}")
    arguments: dict[str, Any] = {}
    for keyword in call.keywords:
        assert keyword.arg is not None
        if keyword.arg in arguments:
            raise PolicyError(f"policy {spec!r}: argument {keyword.arg!r} is given twice")
        try:
            arguments[keyword.arg] = ast.literal_eval(keyword.value)
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            source = ast.get_source_segment(f"_({rest.rstrip()}", keyword.value) or "?"
            raise PolicyError(
                f"policy {spec!r}: argument {keyword.arg}={source} is not a Python literal "
                f"(quote a string: {keyword.arg}={source!r})"
            ) from None
    return arguments


def _entry_point(name: str) -> importlib.metadata.EntryPoint | None:
    """The first entry point `name` of the group, or None."""
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name == name:
            return entry
    return None


def _unknown(spec: str) -> PolicyError:
    installed = [name for name in _entry_point_names() if name not in POLICY_NAMES]
    extra = f"; installed: {', '.join(installed)}" if installed else ""
    return PolicyError(
        f"unknown policy {spec!r}; known policies: {', '.join(POLICY_HELP)}{extra}; "
        "or your own class as package.module:ClassName"
    )


def _entry_point_names() -> list[str]:
    names: list[str] = []
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name not in names:
            names.append(entry.name)
    return names


def _resolve(spec: PolicySpec) -> type[Policy]:
    """The class a parsed spec names, imported and checked."""
    if spec.module is None:
        if spec.attr.lower() in POLICY_NAMES:
            raise PolicyError(
                f"policy {spec.text!r}: {spec.attr!r} is a built-in policy, which takes no "
                "key=value arguments (its argument, where it has one, follows a colon: sjf:5)"
            )
        entry = _entry_point(spec.attr)
        if entry is None:
            raise _unknown(spec.text)
        module, attr = entry.module, entry.attr
        where = f"policy {spec.text!r} (entry point {entry.value!r})"
        if not (_DOTTED.fullmatch(module) and attr and _DOTTED.fullmatch(attr)):
            raise PolicyError(f"{where}: not of the form package.module:ClassName")
    else:
        module, attr = spec.module, spec.attr
        where = f"policy {spec.text!r}"
    try:
        loaded = importlib.import_module(module)
    except ImportError as error:
        raise PolicyError(
            f"{where}: cannot import module {module!r}: {error}{_not_found_hint(module, error)}"
        ) from None
    except Exception as error:  # the module's own code failed: a SyntaxError, say
        raise PolicyError(
            f"{where}: importing module {module!r} failed: {type(error).__name__}: {error}"
        ) from None
    found: Any = loaded
    for part in attr.split("."):
        found = getattr(found, part, None)
        if found is None:
            policies = sorted(
                name
                for name, value in vars(loaded).items()
                if isinstance(value, type)
                and issubclass(value, Policy)
                and value.__module__ == loaded.__name__
            )
            hint = f" (its policies: {', '.join(policies)})" if policies else ""
            raise PolicyError(f"{where}: module {module!r} has no class {attr!r}{hint}")
    if not (isinstance(found, type) and issubclass(found, Policy)):
        raise PolicyError(
            f"{where}: {module}:{attr} is not a policy class (a subclass of "
            "tokenfair.core.policies.base.Policy)"
        )
    return found


def _not_found_hint(module: str, error: ImportError) -> str:
    """Where Python looked for `module` when it is the module itself (or its package)
    that is missing, not something it imports: the `tokenfair` command does not search
    the current directory, where a user's policy file often is."""
    missing = error.name if isinstance(error, ModuleNotFoundError) else None
    if not missing or not (module == missing or module.startswith(missing + ".")):
        return ""
    path = missing.replace(".", "/")
    pythonpath = os.environ.get("PYTHONPATH") or "unset"
    here = Path.cwd()
    if any(Path(entry or ".").resolve() == here.resolve() for entry in sys.path):
        return (
            f"; looked for {path}.py or {path}/ in the current directory ({here}), "
            f"PYTHONPATH ({pythonpath}) and the installed packages: put it in one of them"
        )
    held = next((f for f in (f"{path}.py", f"{path}/") if (here / f).exists()), None)
    return (
        f"; looked for {path}.py or {path}/ in PYTHONPATH ({pythonpath}) and the installed "
        f"packages, not in the current directory ({here}"
        + (f", which holds {held}" if held else "")
        + "), which is not on Python's path: run with PYTHONPATH=. or install the module"
    )


def policy_class(spec: str) -> type[Policy]:
    """The class a user spec names, imported but not constructed (PolicyError if not)."""
    return _resolve(parse_spec(spec))


def load_policy(spec: str, settings: PolicySettings) -> Policy:
    """Build the user policy `spec` names: `Class(settings, **arguments)`."""
    parsed = parse_spec(spec)
    return construct(parsed, _resolve(parsed), settings)


def construct(parsed: PolicySpec, cls: type[Policy], settings: PolicySettings) -> Policy:
    """`cls(settings, **arguments)`, its TypeError and ValueError as one line."""
    where = f"policy {parsed.text!r}"
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to check against (a C type)
        signature = None
    if signature is not None:
        try:
            signature.bind(settings, **parsed.arguments)
        except TypeError as error:
            raise PolicyError(
                f"{where}: {cls.__name__}(settings, **arguments) does not take these "
                f"arguments: {error}"
            ) from None
    try:
        policy = cls(settings, **parsed.arguments)  # type: ignore[call-arg]
    except TypeError as error:
        raise PolicyError(f"{where}: {cls.__name__}(settings, ...): TypeError: {error}") from None
    except ValueError as error:
        if isinstance(error, PolicyError):
            raise
        raise PolicyError(f"{where}: {error}") from None
    _default(policy, "name", Policy.name, parsed.attr if parsed.module is None else cls.__name__)
    _default(policy, "charge_cached_tokens", None, settings.charge_cached_tokens)
    with contextlib.suppress(AttributeError):  # __slots__ without it: the class's stays
        policy.needs = class_needs(cls)
    if parsed.label is not None:  # the spec's label= names it, whatever the class says
        with contextlib.suppress(AttributeError):
            policy.name = parsed.label.strip()
    return policy


def _default(policy: Policy, attribute: str, unset: object, value: object) -> None:
    """Set `attribute` unless the class below Policy, or the instance, set its own (and,
    for `unset` not None, unless its value differs from `unset`)."""
    if attribute in getattr(policy, "__dict__", {}):
        return
    for klass in type(policy).__mro__:
        if klass is Policy:
            break
        if attribute in vars(klass) and (unset is None or vars(klass)[attribute] != unset):
            return
    with contextlib.suppress(AttributeError):  # __slots__ without it: the class's stays
        setattr(policy, attribute, value)


def needs_of(spec: str) -> Needs:
    """What the user policy `spec` declares it needs (its class's `needs`; a class that
    says `uses_weights = True` instead, as before declarations, needs weights); the
    defaults for a spec that does not load (building it reports why)."""
    try:
        klass = policy_class(spec)
    except PolicyError:
        return Needs()
    return class_needs(klass)


def class_needs(klass: type[Policy]) -> Needs:
    """A policy class's `needs`, with what a class written before declarations says
    otherwise: `uses_weights = True` (weights), an `attach_prefix_cache` of its own
    (the prefix cache)."""
    needs = getattr(klass, "needs", Needs())
    if getattr(klass, "uses_weights", False) and not needs.weights:
        needs = replace(needs, weights=True)
    if klass.attach_prefix_cache is not Policy.attach_prefix_cache and not needs.prefix_cache:
        needs = replace(needs, prefix_cache=True)
    return needs


def uses_weights(spec: str) -> bool:
    """Whether the user policy `spec` reads tenant weights (its class's `needs`)."""
    return needs_of(spec).weights


def installed_policies() -> dict[str, str]:
    """Entry point name -> one line: the class docstring's first line, or, for an entry
    point that does not load (or that a built-in name shadows), what is wrong. Each
    module is imported here, when the list is asked for, never before."""
    listed: dict[str, str] = {}
    for entry in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if entry.name in listed:
            continue  # a second distribution's entry of the same name is never used
        if entry.name.lower() in POLICY_NAMES:
            listed[entry.name] = (
                f"not used: the built-in policy {entry.name.lower()!r} has this name"
            )
            continue
        try:
            cls = _resolve(PolicySpec(entry.name, None, entry.name))
        except PolicyError as error:
            listed[entry.name] = f"cannot load: {error}"
            continue
        doc = inspect.cleandoc(vars(cls).get("__doc__") or "")  # its own, not a base's
        first = doc.splitlines()[0] if doc else ""
        listed[entry.name] = first or entry.value
    return listed


def split_policies(text: str) -> list[str]:
    """A comma-separated list of specs, commas inside parentheses and quotes kept:
    `fcfs,mod:P(a=1, b='x,y'),vtc` -> ['fcfs', "mod:P(a=1, b='x,y')", 'vtc']."""
    specs: list[str] = []
    depth, quote, escaped, start = 0, "", False, 0
    for index, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
        elif char in "'\"":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth = max(0, depth - 1)
        elif char == "," and depth == 0:
            specs.append(text[start:index])
            start = index + 1
    specs.append(text[start:])
    return [spec.strip() for spec in specs if spec.strip()]


def sweep_specs(spec: str) -> list[str]:
    """A policy of one's own over a grid: each argument given as a list takes each of
    its values in turn, `mod:P(a=[1, 2], b=[0.5, 1])` -> four specs, `mod:P(a=1, b=0.5)`
    first (the last argument varies fastest). PolicyError for a spec with no list, or a
    built-in name (one takes its one argument after a colon: list them instead)."""
    if not is_user_spec(spec):
        raise PolicyError(
            f"sweep {spec!r}: only a policy of one's own sweeps its arguments; list "
            "built-in settings in --policies instead (e.g. rpm:5,rpm:20)"
        )
    parsed = parse_spec(spec)
    grid = {k: v if isinstance(v, list) else [v] for k, v in parsed.arguments.items()}
    if not any(isinstance(v, list) for v in parsed.arguments.values()):
        raise PolicyError(f"sweep {spec!r}: give at least one argument as a list, e.g. x=[1, 2]")
    if any(not values for values in grid.values()):
        raise PolicyError(f"sweep {spec!r}: an argument's list is empty")
    return [
        _call_text(parsed.target, dict(zip(grid, values, strict=True)))
        for values in itertools.product(*grid.values())
    ]
