"""What a run is called: its label in reports and the name of its results file.

Reports call a built-in policy by its name as written (`rpm:20`) and a policy of one's
own by its `label=`, else its class's name with its arguments (core/policies/loading.py:
`policy_label`). Two policies of one run called alike would share a row name in every
table and one results file, the second overwriting the first; `check_distinct_labels`
refuses them before anything runs, naming both.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from tokenfair.core.policies.loading import policy_label


class PolicyClash(ValueError):
    """Two policies of one run would be called alike in reports or results files."""


def results_stem(label: str) -> str:
    """A results file's name (without `.jsonl`) for a run called `label`: specs such as
    `rpm:5` hold a colon, which some file systems refuse, and a label may hold anything,
    so each run of other characters becomes one dash, none at either end
    (`capped(cap=500)` -> `capped-cap=500`)."""
    return re.sub(r"[^\w.=-]+", "-", label).strip("-") or "policy"


def _same_file(stem: str) -> str:
    # Case-insensitive file systems (macOS, Windows) take `VTC` and `vtc` for one file.
    return stem.casefold()


def check_distinct_labels(
    policies: Sequence[tuple[str, str]],
    running: Sequence[str] = (),
    runner: str = "this experiment",
) -> None:
    """Raise PolicyClash unless every policy is called apart from every other.

    `policies`: the user's, as (what they wrote, what reports call it); `running`: the
    policies the experiment runs of its own (the paper's, `wvtc` beside weights), which
    the user's must neither repeat nor be called like; `runner` names that experiment.
    """
    taken: dict[str, tuple[str, str]] = {}  # file name -> (the policy, its label)
    for policy in running:
        label = policy_label(policy)
        taken.setdefault(_same_file(results_stem(label)), (policy, label))
    own = set(taken)
    hint = "e.g. mypkg.mod:MyPolicy(..., label='mine')"
    for given, label in policies:
        key = _same_file(results_stem(label))
        if key not in taken:
            taken[key] = (given, label)
            continue
        other, other_label = taken[key]
        if key in own and given.strip() == other:
            raise PolicyClash(f"policy {given!r} runs in {runner} already: leave it out")
        if given.strip() == other.strip():
            raise PolicyClash(f"policy {given!r} is given twice: name each policy once")
        file = f"{results_stem(label)}.jsonl"
        if key in own:
            clash = (
                f"policy {given!r} is called {label!r} in reports, as is {runner}'s own {other!r}"
                if label == other_label
                else f"policy {given!r} (called {label!r}) would write {file}, the results "
                f"file of {runner}'s own {other!r}"
            )
            raise PolicyClash(f"{clash}: give it another label, {hint}")
        clash = (
            f"policies {other!r} and {given!r} are both called {label!r} in reports"
            if label == other_label
            else f"policies {other!r} and {given!r} (called {other_label!r} and {label!r}) "
            f"would write one results file, {file}"
        )
        raise PolicyClash(f"{clash}: give one a label, {hint}")


def check_policy_specs(
    specs: Sequence[str], running: Sequence[str] = (), runner: str = "this experiment"
) -> None:
    """`check_distinct_labels` for policies given as specs (`vtc`, `mod:P(label='x')`)."""
    check_distinct_labels([(spec, policy_label(spec)) for spec in specs], running, runner)
