"""The sign-in page's button for the OpenID Connect provider, and the two views of its
flow: start (to the provider, with PKCE) and callback (back, refused in words when it
must be). The flow is mozilla-django-oidc's; see ``fleet.oidc``."""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import views as auth_views
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.views.generic import View
from mozilla_django_oidc.views import (
    OIDCAuthenticationCallbackView,
    OIDCAuthenticationRequestView,
)

from audit.actors import PROVIDER_SIGN_IN
from audit.receivers import client_address
from fleet.actions.sign_ins import record_refused_sign_in
from fleet.oidc import provider
from fleet.oidc.backend import REFUSAL_ATTRIBUTE
from fleet.pages.sign_in import SignInForm
from fleet.pages.team_page import landing

# A callback this browser did not start, or one already used: a forged link, a replay, or
# a sign-in page left open past its session.
NOT_STARTED_HERE = (
    "this answer does not belong to a sign-in started from this browser (or it was used "
    "already); start again with the button below"
)


class SignInPage(auth_views.LoginView):
    """The sign-in page: user name and password, and the provider's button when one is set."""

    authentication_form = SignInForm

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        if provider.configured():
            context["provider_name"] = settings.OIDC_PROVIDER_NAME
        return context

    def get_default_redirect_url(self) -> str:
        # Without next=: a person in one team lands on its page (fleet.pages.team_page).
        return landing(self.request.user)


class StartProviderSignIn(OIDCAuthenticationRequestView):
    """Send the browser to the provider, with a fresh state, nonce and PKCE challenge."""

    def __init__(self, **kwargs) -> None:
        # Not the library's __init__, which reads the endpoint from settings: it comes
        # from discovery, on the request.
        View.__init__(self, **kwargs)
        self.OIDC_RP_CLIENT_ID = settings.OIDC_RP_CLIENT_ID

    def get(self, request: HttpRequest) -> HttpResponse:
        if not provider.configured():
            raise Http404("no identity provider is configured")
        try:
            self.OIDC_OP_AUTH_ENDPOINT = provider.endpoints().authorization_endpoint
        except provider.ProviderUnavailable as exc:
            return refuse(request, f"the provider cannot be reached: {exc}")
        return super().get(request)


class FinishProviderSignIn(OIDCAuthenticationCallbackView):
    """The provider sends the browser back here: sign the person in, or say why not."""

    @property
    def success_url(self) -> str:
        # The next= the sign-in started with (the library checked it then), else the
        # landing page: a person in one team, and no operator, lands on its page.
        return self.request.session.get("oidc_login_next") or landing(self.request.user)

    def get(self, request: HttpRequest) -> HttpResponse:
        if not provider.configured():
            raise Http404("no identity provider is configured")
        state = request.GET.get("state")
        error = request.GET.get("error")
        if error:
            states = request.session.get("oidc_states", {})
            if state in states:  # forgotten, so this answer cannot be played again
                del states[state]
                request.session.modified = True
            description = request.GET.get("error_description", "")
            said = f"{error}: {description}" if description else error
            return refuse(request, f"the provider did not sign you in ({said[:300]})")
        if not request.GET.get("code") or state not in request.session.get("oidc_states", {}):
            return refuse(request, NOT_STARTED_HERE)
        try:
            return super().get(request)
        except SuspiciousOperation:
            return refuse(request, NOT_STARTED_HERE)

    def login_failure(self) -> HttpResponse:
        reason = getattr(self.request, REFUSAL_ATTRIBUTE, None)
        if reason is None and getattr(self, "user", None) is not None:
            reason = f"the account {self.user.username} is disabled here"
        return refuse(self.request, reason or NOT_STARTED_HERE)


def refuse(request: HttpRequest, reason: str) -> HttpResponse:
    """Back to the sign-in page, which says why; the refusal is an Event."""
    name = settings.OIDC_PROVIDER_NAME
    record_refused_sign_in(
        reason, provider=name, address=client_address(request), actor=PROVIDER_SIGN_IN
    )
    messages.error(request, f"Sign-in with {name} refused: {reason}.")
    return HttpResponseRedirect(reverse("login"))
