"""Who reads which Events, and the filters only the apps above audit can apply.

Operators (and superusers) read the whole log. Every other signed-in user reads what
they did and what was done to their account (``audit.filters.own_events``): a failed
sign-in names what was typed and where from, and the log holds every operator's acts,
which are not every reader's business. ``llmgw_ctl`` runs at the control plane's shell,
whose user holds the database already: it reads everything.
"""

from __future__ import annotations

from django.db.models import Q, QuerySet

from audit.filters import EventFilter, own_events
from audit.models import Event, EventKind
from catalog.models import Team
from catalog.permissions import is_operator


class EventFilterRefused(ValueError):
    """A filter that cannot be applied here, in words a reader can act on."""


def readable_events(user) -> QuerySet[Event]:
    """The Events ``user`` may read (none for a user not signed in)."""
    if not user or not user.is_authenticated:
        return Event.objects.none()
    if is_operator(user):
        return Event.objects.all()
    return Event.objects.filter(own_events(user))


def events_of_team(events: QuerySet[Event], team: str) -> QuerySet[Event]:
    """``events`` narrowed to ``team``'s: the team's own (made, changed, its members'
    roles), what its members did, and what was done to its keys and to the models open
    to it alone (a model open to every team is everyone's)."""
    found = Team.objects.filter(name=team).first()
    if found is None:
        raise EventFilterRefused(
            f"team {team!r}: there is no such team; `llmgw_ctl teams list` names them"
        )
    members = found.memberships.values_list("user_id", flat=True)
    keys = found.api_keys.values_list("prefix", flat=True)
    models = found.models.values_list("name", flat=True)
    return events.filter(
        Q(kind=EventKind.TEAM, subject=found.name)
        | Q(actor_id__in=members)
        | Q(kind=EventKind.KEY, subject__in=keys)
        | Q(kind__in=(EventKind.CATALOG, EventKind.TEAM), subject__in=models)
    )


def asked_events(events: QuerySet[Event], asked: EventFilter) -> QuerySet[Event]:
    """``events`` narrowed to what ``asked`` asks (paging aside)."""
    events = events.filter(asked.where())
    if asked.team:
        events = events_of_team(events, asked.team)
    return events
