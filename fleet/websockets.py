"""The control plane's websocket routes: the agents' link and the pages' own sockets."""

from django.urls import path

from fleet.link.consumer import AgentConsumer
from fleet.pages.consumers import (
    AuditPageConsumer,
    ClusterPageConsumer,
    LogsPageConsumer,
    MirrorPageConsumer,
    ModelPageConsumer,
    NodePageConsumer,
)

websocket_urlpatterns = [
    path("agent/", AgentConsumer.as_asgi()),
    # The pages' own sockets: each pushes its page's fragments when the fleet changes.
    path("ws/pages/cluster/", ClusterPageConsumer.as_asgi()),
    path("ws/pages/nodes/<str:node_id>/", NodePageConsumer.as_asgi()),
    path("ws/pages/nodes/<str:node_id>/logs/", LogsPageConsumer.as_asgi()),
    path("ws/pages/models/<path:name>/", ModelPageConsumer.as_asgi()),
    path("ws/pages/weights/<path:name>/", MirrorPageConsumer.as_asgi()),
    path("ws/pages/audit/", AuditPageConsumer.as_asgi()),
]
