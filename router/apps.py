from django.apps import AppConfig


class RouterAppConfig(AppConfig):
    """The router's Django side: its usage table (``models``), the usage page and report
    (``usage/``). Not the proxy, whose knobs are ``config.RouterConfig``."""

    name = "router"
    verbose_name = "Router"
