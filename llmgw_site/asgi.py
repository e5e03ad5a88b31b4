"""The control plane: pages, API and /metrics over HTTP; the agents' and pages' websockets."""

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from core.collector import collect_rarely  # noqa: E402
from fleet import leadership, members  # noqa: E402
from fleet.websockets import websocket_urlpatterns  # noqa: E402

if settings.SERVE_STATIC:
    # One machine, no web server in front: daphne serves /static/ itself.
    django_asgi_app = ASGIStaticFilesHandler(django_asgi_app)

application = ProtocolTypeRouter(
    {
        "http": django_asgi_app,
        "websocket": AuthMiddlewareStack(URLRouter(websocket_urlpatterns)),
    }
)

# Nodes silent while the control plane was down were not heard by anyone: liveness gives
# them a full NODE_LOST_AFTER from the first start in a leader's term to reconnect (not from
# every start: a process crash-looping would hold lost-node detection off for good).
leadership.record_links_opened()
# Every node's walls admit the control planes to engines' HTTP ports: say where this one is.
members.report_control_plane(leadership.identity())

# Everything imported so far lives as long as the process, and each agent link keeps its
# objects for as long as its node is up: at 3,000 links the collector's passes held the
# event loop for ~0.4 s at a time, the p99 of every heartbeat (bench/heartbeats.py at 5 s:
# p99 455 ms before, 37 ms after); past ~10,000 sockets a full pass took over a second.
collect_rarely()
