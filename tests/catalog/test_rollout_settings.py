"""A profile's rollout settings: how its replicas are replaced when its engine settings change."""

from __future__ import annotations

import json

import pytest
import yaml

from catalog.actions.entries import apply_catalog
from catalog.models import Model, Profile
from catalog.plan import export_catalog
from catalog.schema import CatalogError, parse_catalog
from tests.factories import SETUP

pytestmark = pytest.mark.django_db


def catalog(**profile_fields) -> str:
    profile = {"name": "cpu", "engine": "llama.cpp", "replicas": 2, **profile_fields}
    return yaml.safe_dump(
        {"models": [{"name": "gemma", "source": "/models/gemma.gguf", "profiles": [profile]}]}
    )


def test_defaults_surge_one_and_no_unavailable_and_a_thirty_second_drain():
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    assert (profile.rollout_surge, profile.rollout_unavailable, profile.drain_timeout) == (1, 0, 30)


def test_rollout_and_drain_timeout_are_read_from_the_file():
    apply_catalog(catalog(rollout={"surge": 2, "unavailable": 1}, drain_timeout="2m"), actor=SETUP)
    profile = Profile.objects.get()
    assert profile.rollout == {"surge": 2, "unavailable": 1} and profile.drain_timeout == 120


def test_surge_and_unavailable_both_zero_is_refused_naming_the_profile_and_the_fix():
    with pytest.raises(CatalogError) as refused:
        parse_catalog(catalog(rollout={"surge": 0, "unavailable": 0}))
    [problem] = refused.value.problems
    assert problem.startswith("catalog.yaml: models[0] (gemma): profiles[0] (cpu): rollout: ")
    assert "surge and unavailable are both 0" in problem
    assert "surge: 1" in problem and "unavailable: 1" in problem


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"rollout": {"surge": -1}}, "rollout: surge: Input should be greater than or equal to 0"),
        ({"rollout": {"surges": 1}}, "rollout: surges: unknown key 'surges'"),
        ({"drain_timeout": "soon"}, "drain_timeout: 'soon' is not a duration"),
    ],
    ids=["negative-surge", "misspelt-key", "bad-drain-timeout"],
)
def test_bad_rollout_settings_are_refused(fields, problem):
    with pytest.raises(CatalogError) as refused:
        parse_catalog(catalog(**fields))
    where = "catalog.yaml: models[0] (gemma): profiles[0] (cpu): "
    assert any(p.startswith(where + problem) for p in refused.value.problems), refused.value


def test_changing_only_the_rollout_leaves_the_fingerprint_and_reports_the_change():
    apply_catalog(catalog(), actor=SETUP)
    before = Profile.objects.get().fingerprint()
    changes = apply_catalog(
        catalog(rollout={"surge": 0, "unavailable": 1}, drain_timeout="90s"), actor=SETUP
    )
    assert [c.describe() for c in changes] == [
        "~ profile gemma/cpu: drain_timeout 30 -> 90, rollout.surge 1 -> 0, "
        "rollout.unavailable 0 -> 1"
    ]
    assert Profile.objects.get().fingerprint() == before


def test_export_writes_rollout_only_when_not_the_default_and_round_trips():
    apply_catalog(catalog(), actor=SETUP)
    assert "rollout" not in export_catalog()["models"][0]["profiles"][0]
    apply_catalog(catalog(rollout={"unavailable": 1}, drain_timeout="5m"), actor=SETUP)
    exported = export_catalog()["models"][0]["profiles"][0]
    assert exported["rollout"] == {"surge": 1, "unavailable": 1}
    assert exported["drain_timeout"] == "5m"
    assert apply_catalog(yaml.safe_dump(export_catalog()), actor=SETUP) == []


def test_an_apply_does_not_unpause_a_paused_rollout():
    apply_catalog(catalog(), actor=SETUP)
    Model.objects.filter(name="gemma").update(rollout_paused=True)
    apply_catalog(catalog(args=["--threads", "4"]), actor=SETUP)
    assert Model.objects.get(name="gemma").rollout_paused


def test_the_api_sets_and_keeps_the_rollout(api_client, operator):
    api_client.force_authenticate(operator)
    apply_catalog(catalog(), actor=SETUP)
    profile = Profile.objects.get()
    response = api_client.patch(
        f"/api/v1/profiles/{profile.id}/", {"rollout": {"unavailable": 1}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["rollout"] == {"surge": 1, "unavailable": 1}
    response = api_client.patch(f"/api/v1/profiles/{profile.id}/", {"replicas": 3}, format="json")
    assert response.json()["rollout"] == {"surge": 1, "unavailable": 1}
    response = api_client.patch(
        f"/api/v1/profiles/{profile.id}/", {"rollout": {"surge": 0}}, format="json"
    )
    assert response.status_code == 400
    assert "surge and unavailable are both 0" in json.dumps(response.json())
