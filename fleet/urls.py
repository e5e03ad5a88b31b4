"""The fleet's pages and the operators' actions on them."""

from django.urls import path

from fleet import views, views_actions

urlpatterns = [
    path("", views.cluster, name="cluster"),
    path("nodes/<str:node_id>/", views.node, name="node"),
    path("nodes/<str:node_id>/logs/", views.node_logs, name="node-logs"),
    path("nodes/<str:node_id>/drain/", views_actions.drain, name="node-drain"),
    path("nodes/<str:node_id>/undrain/", views_actions.undrain, name="node-undrain"),
    path("replicas/<uuid:replica_id>/restart/", views_actions.restart, name="replica-restart"),
    path("profiles/<int:profile_id>/scale/", views_actions.scale, name="profile-scale"),
    path("weights/<path:name>/", views.weights, name="model-weights"),
    # Last: a model's name may hold slashes (org/model), so it takes the rest of the path.
    path("models/<path:name>/", views.model, name="model"),
]
