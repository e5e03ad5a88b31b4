"""The fleet's pages and the operators' actions on them, deploying and the playground."""

from django.urls import path

from fleet.pages import (
    action_views,
    audit_views,
    deploy_views,
    playground,
    team_views,
    views,
)

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("nodes/<str:node_id>/", views.node, name="node"),
    path("nodes/<str:node_id>/logs/", views.node_logs, name="node-logs"),
    path("nodes/<str:node_id>/drain/", action_views.drain, name="node-drain"),
    path("nodes/<str:node_id>/undrain/", action_views.undrain, name="node-undrain"),
    path("replicas/<uuid:replica_id>/restart/", action_views.restart, name="replica-restart"),
    path("profiles/<int:profile_id>/scale/", action_views.scale, name="profile-scale"),
    path("weights/<path:name>/", views.weights, name="model-weights"),
    path(
        "placement/<path:name>/check/", action_views.check_placement, name="model-check-placement"
    ),  # fmt: skip
    path("deploy/", deploy_views.new_model, name="model-new"),
    path("profiles/<int:profile_id>/edit/", deploy_views.edit_profile, name="profile-edit"),
    path("catalog/models/<int:model_id>/delete/", action_views.delete_model, name="model-delete"),
    path("audit/", audit_views.audit, name="audit"),
    path("audit/events.csv", audit_views.audit_export, {"fmt": "csv"}, name="audit-csv"),
    path("audit/events.json", audit_views.audit_export, {"fmt": "json"}, name="audit-json"),
    path("playground/", playground.playground, name="playground"),
    path("playground/key/", playground.key, name="playground-key"),
    path("teams/", team_views.teams, name="teams"),
    path("teams/<slug:name>/", team_views.team, name="team"),
    path("teams/<slug:name>/keys/", team_views.new_key, name="team-key-new"),
    path(
        "teams/<slug:name>/keys/<str:prefix>/revoke/", team_views.revoke, name="team-key-revoke"
    ),  # fmt: skip
    # Last: a model's name may hold slashes (org/model), so it takes the rest of the path.
    path("models/<path:name>/", views.model, name="model"),
]
