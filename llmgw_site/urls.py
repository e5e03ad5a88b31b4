from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView
from rest_framework.routers import DefaultRouter

from catalog import api as catalog_api
from catalog.teams import api as catalog_teams_api
from fleet.api import views as fleet_api
from fleet.pages import oidc as oidc_views
from fleet.pages import views as fleet_views
from router.usage import views as usage_views

router = DefaultRouter()
router.register("engines", catalog_api.EngineViewSet)
router.register("pools", catalog_api.PoolViewSet)
router.register("fabrics", catalog_api.FabricViewSet)
router.register("models", catalog_api.ModelViewSet)
router.register("profiles", catalog_api.ProfileViewSet)
router.register("keys", catalog_api.ApiKeyViewSet)
router.register("teams", catalog_teams_api.TeamViewSet)
router.register("nodes", fleet_api.NodeViewSet)
router.register("replicas", fleet_api.ReplicaViewSet)
router.register("shards", fleet_api.ShardViewSet)
router.register("events", fleet_api.EventLogViewSet)

urlpatterns = [
    path("", include("fleet.pages.urls")),
    path("metrics", fleet_views.metrics, name="metrics"),
    path("usage/", usage_views.usage, name="usage"),
    path("usage/teams/<slug:name>/", usage_views.team_usage, name="team-usage"),
    path("accounts/login/", oidc_views.SignInPage.as_view(), name="login"),
    path("accounts/oidc/start/", oidc_views.StartProviderSignIn.as_view(), name="oidc_start"),
    path(
        "accounts/oidc/callback/", oidc_views.FinishProviderSignIn.as_view(), name="oidc_callback"
    ),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/v1/", include(router.urls)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
]
