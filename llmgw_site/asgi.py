"""The control plane: pages, API and /metrics over HTTP; the agents' and pages' websockets."""

import gc
import os

from django.core.asgi import get_asgi_application

# Allocations before a young collection (CPython's default: 700), and young and middle
# collections before the next generation's.
COLLECT_AFTER = (50_000, 20, 100)

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

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

# Everything imported so far lives as long as the process: keep it out of the
# collector's full passes, which past ~10,000 agent sockets take over a second.
gc.freeze()
# And collect far less often: each agent link keeps its objects for as long as its node
# is up, and at 3,000 links the collections held the event loop for ~0.4 s at a time, the
# p99 of every heartbeat (bench/heartbeats.py at 5 s: p99 455 ms before, 37 ms after).
gc.set_threshold(*COLLECT_AFTER)
