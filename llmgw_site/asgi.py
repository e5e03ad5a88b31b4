"""The control plane: pages, API and /metrics over HTTP; the agents' and pages' websockets."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "llmgw_site.settings")
django_asgi_app = get_asgi_application()

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.staticfiles.handlers import ASGIStaticFilesHandler  # noqa: E402

from fleet import leadership  # noqa: E402
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

# Nodes silent while this process was down were not heard by anyone: liveness gives them
# a full NODE_LOST_AFTER from now to reconnect.
leadership.record_links_opened()

# Everything imported so far lives as long as the process: keep it out of the
# collector's full passes, which past ~10,000 agent sockets take over a second.
gc.freeze()
