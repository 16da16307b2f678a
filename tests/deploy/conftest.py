from __future__ import annotations

import pytest

from tests.deploy.manifests import Object, render_all


@pytest.fixture(scope="session")
def rendered() -> dict[str, list[Object]]:
    """Every kustomization under deploy/, rendered: name -> its objects."""
    return render_all()
