"""Claims the test provider adds: the user's name, e-mail and groups."""

from __future__ import annotations

from oauth2_provider.oauth2_validators import OAuth2Validator


class GroupsValidator(OAuth2Validator):
    # Claims missing from this map are dropped: groups go with the openid scope.
    oidc_claim_scope = {**OAuth2Validator.oidc_claim_scope, "groups": "openid"}

    def get_additional_claims(self, request):
        user = request.user
        return {
            "preferred_username": user.username,
            "email": user.email,
            "groups": sorted(group.name for group in user.groups.all()),
        }
